"""Prompt datasets that ship with the project: generated from a fixed seed, so nothing is fetched at run time.

  synthetic-chat       short instructions and questions about systems topics, of varied length
  synthetic-documents  long multi-paragraph reports ending in a question (long-context prefill)
  random-tokens        uniform random token ids of exact length (latency and fixed-batch shapes)

Text is generated per request from a seed derived from the dataset and the request index, then tokenized by
the engine's own tokenizer and cut to the request's target length, so the baseline and the candidate engine
see identical token ids.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable, Protocol

_SUBJECTS = ["the scheduler", "a memory allocator", "the compiler", "each worker", "the cache", "a GPU kernel",
             "the tokenizer", "the load balancer", "a database index", "the network stack", "the file system",
             "a background job", "the attention layer", "the garbage collector", "a storage node"]
_VERBS = ["reorders", "evicts", "compresses", "replicates", "batches", "validates", "streams", "partitions",
          "prefetches", "serializes", "rebalances", "measures", "rewrites", "fuses", "retries"]
_OBJECTS = ["incoming requests", "stale entries", "small tensors", "long sequences", "hot pages", "log records",
            "partial results", "shard metadata", "queued tasks", "checkpoint files", "random writes",
            "the key-value blocks", "the residual stream", "dirty buffers", "pending acknowledgements"]
_CLAUSES = ["when the queue grows", "before the deadline passes", "under heavy load", "after a restart",
            "while memory is scarce", "at every step", "once the batch is full", "if a node fails",
            "without blocking readers", "across all replicas"]
_ASKS = ["Explain why {s} {v} {o} {c}.", "Summarize how {s} {v} {o}.", "Write a short story in which {s} {v} {o}.",
         "List three ways {s} could go wrong when it {v} {o} {c}.", "Compare two designs where {s} {v} {o}.",
         "What happens if {s} never {v} {o}?", "Describe a test that shows {s} {v} {o} {c}."]


def _sentence(rng: random.Random) -> str:
    s, v, o, c = rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_CLAUSES)
    return f"{s.capitalize()} {v} {o} {c}."


def _chat_text(rng: random.Random, min_chars: int) -> str:
    parts = []
    while sum(map(len, parts)) < min_chars:
        parts.append(_sentence(rng))
    ask = rng.choice(_ASKS).format(s=rng.choice(_SUBJECTS), v=rng.choice(_VERBS), o=rng.choice(_OBJECTS),
                                   c=rng.choice(_CLAUSES))
    return "Context: " + " ".join(parts) + "\nQuestion: " + ask


def _document_text(rng: random.Random, min_chars: int) -> str:
    paragraphs, size, section = [], 0, 1
    while size < min_chars:
        paragraph = f"Section {section}. " + " ".join(_sentence(rng) for _ in range(rng.randint(4, 9)))
        paragraphs.append(paragraph)
        size, section = size + len(paragraph), section + 1
    question = f"Question: what does section {rng.randint(1, section - 1)} say?"
    return "Report\n\n" + "\n\n".join(paragraphs) + "\n\n" + question


# Dataset name -> text generator (None: the dataset is token ids, not text).
DATASETS: dict[str, Callable[[random.Random, int], str] | None] = {
    "synthetic-chat": _chat_text,
    "synthetic-documents": _document_text,
    "random-tokens": None,
}
# Characters generated per target token: generous, so any tokenizer yields at least the target length.
_CHARS_PER_TOKEN = 8


class Tokenizer(Protocol):
    all_special_ids: list[int]

    def encode(self, text: str) -> list[int]: ...

    def __len__(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class Request:
    prompt_token_ids: list[int]
    max_tokens: int


def prompt_ids(dataset: str, index: int, length: int, tokenizer: Tokenizer) -> list[int]:
    """Request `index` of `dataset` as exactly `length` token ids of `tokenizer` (deterministic)."""
    rng = random.Random(f"{dataset}/{index}")
    generate = DATASETS[dataset]
    if generate is None:
        special = set(tokenizer.all_special_ids)
        vocabulary = [i for i in range(len(tokenizer)) if i not in special]
        return [rng.choice(vocabulary) for _ in range(length)]
    return tokenizer.encode(generate(rng, length * _CHARS_PER_TOKEN))[:length]


def throughput_requests(spec, count: int, tokenizer: Tokenizer) -> list[Request]:
    """`count` requests of a ThroughputWorkload, lengths sampled per request from its ranges."""
    requests = []
    for i in range(count):
        rng = random.Random(f"{spec.name}/lengths/{i}")
        input_len, output_len = rng.randint(*spec.input_len), rng.randint(*spec.output_len)
        requests.append(Request(prompt_ids(spec.dataset, i, input_len, tokenizer), min(output_len, spec.decode_cap)))
    return requests


def latency_requests(spec, tokenizer: Tokenizer) -> list[Request]:
    """One batch of a LatencyWorkload: `batch_size` requests of exactly its input and output lengths."""
    return [Request(prompt_ids(spec.dataset, i, spec.input_len, tokenizer), spec.output_len)
            for i in range(spec.batch_size)]
