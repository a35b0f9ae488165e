"""Train one of the project's small models on the synthetic corpus, on CPU, deterministically, in minutes.

    python -m sk.models.train --style llama|gemma|qwen3 --out DIR

Writes DIR in the Hugging Face layout (config, fp32 model.safetensors, the byte tokenizer) and DIR/training.json
(held-out accuracies against chance, the recipe, versions, the sha256 of the weights). The network is
transformers' own Llama/Gemma built from the config that engines load, so what is trained is what they run.
Deterministic on one machine: fixed seeds, one thread, deterministic algorithms and data from a seeded
`random.Random` fix every float operation, so two runs give the same weights bit for bit. Not across CPU models:
the kernels under torch round per CPU (MKL picks its sgemm path and blocking by vendor, model and caches; ATen
its vectorized kernels by instruction set), and 3000 steps turn a last-bit difference into other weights with
about the same held-out accuracies. `built_with` records the CPU; tests/evals/test_trained_models.py says
what each machine must reproduce.
Needs torch, transformers, safetensors and tokenizers (the vLLM CPU venv has them).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import platform
import random
import tempfile
import time
from pathlib import Path

import torch

from sk.argtypes import output_dir, positive_int
from sk.models import corpus
from sk.models.tiny import TinyModelSpec, _config
from sk.models.tokenizer import SPECIAL_TOKENS, write_byte_tokenizer

PAD_ID = SPECIAL_TOKENS.index("<pad>")
IGNORE = -100  # label of positions that are not trained on (prompt, padding)

# head_dim 64, as vLLM's CPU attention requires; vocab padded to a multiple of 64, as engines pad it anyway.
# vLLM 0.25's Gemma loads only tied embeddings, so the Gemma-style model ties them (untied heads were needed
# only to make random weights emit varied tokens; a trained model varies by itself).
SPECS = {
    "llama": TinyModelSpec(style="llama", hidden_size=128, intermediate_size=384, num_layers=4, num_heads=2,
                           num_kv_heads=1, head_dim=64, vocab_size=320, tie_word_embeddings=False),
    "gemma": TinyModelSpec(style="gemma", hidden_size=128, intermediate_size=384, num_layers=4, num_heads=2,
                           num_kv_heads=1, head_dim=64, vocab_size=320, tie_word_embeddings=True),
    # Llama's shapes plus Qwen3's RMSNorm over each head of q and k.
    "qwen3": TinyModelSpec(style="qwen3", hidden_size=128, intermediate_size=384, num_layers=4, num_heads=2,
                           num_kv_heads=1, head_dim=64, vocab_size=320, tie_word_embeddings=False),
}


@dataclasses.dataclass(frozen=True)
class Recipe:
    seed: int = 0
    steps: int = 3000
    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    threads: int = 1  # more threads change the float summation order, hence the weights


class ByteTokenizer:
    """The project's byte tokenizer (sk.models.tokenizer), loaded from the files engines read."""

    def __init__(self):
        from tokenizers import Tokenizer

        with tempfile.TemporaryDirectory() as tmp:
            write_byte_tokenizer(Path(tmp))
            self._tokenizer = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))

    def prompt_ids(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids  # starts with <bos>, as lm-eval's add_bos_token=True sends

    def ids(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)


def build_model(spec: TinyModelSpec, seed: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(_config(spec))
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def _batch(examples: list[corpus.Example], tokenizer: ByteTokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels; only the answer and its newline are trained on. Right padding needs no
    attention mask in a causal model: real tokens never look at the padding after them."""
    rows = []
    for example in examples:
        prompt, answer = tokenizer.prompt_ids(example.prompt), tokenizer.ids(example.answer + "\n")
        rows.append((prompt + answer, [IGNORE] * len(prompt) + answer))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([r + [PAD_ID] * (width - len(r)) for r, _ in rows])
    labels = torch.tensor([r + [IGNORE] * (width - len(r)) for _, r in rows])
    return ids, labels


def _learning_rate(step: int, recipe: Recipe) -> float:
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return recipe.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(spec: TinyModelSpec, recipe: Recipe, log=print):
    """The trained model, its tokenizer and the training loss of every step."""
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    tokenizer = ByteTokenizer()
    model = build_model(spec, recipe.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=recipe.learning_rate, betas=(0.9, 0.98), foreach=False)
    examples = corpus.training_examples(random.Random(recipe.seed))
    model.train()
    losses = []
    start = time.monotonic()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(step, recipe)
        ids, labels = _batch([next(examples) for _ in range(recipe.batch_size)], tokenizer)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 250 == 0 or step == recipe.steps - 1:
            log(f"step {step:5d}  loss {losses[-1]:.4f}  {time.monotonic() - start:6.0f} s")
    model.eval()
    return model, tokenizer, losses


@torch.no_grad()
def answer_loss(model, tokenizer: ByteTokenizer, items: list[dict], batch_size: int = 64) -> float:
    """Mean cross-entropy (nats per token) of the targets and their newline, teacher-forced: the training
    objective on held-out prompts, a smoother measure of progress than accuracy."""
    total, tokens = 0.0, 0
    for i in range(0, len(items), batch_size):
        examples = [corpus.Example(item["kind"], item["prompt"], item["target"]) for item in items[i:i + batch_size]]
        ids, labels = _batch(examples, tokenizer)
        logits = model(input_ids=ids).logits[:, :-1]
        targets = labels[:, 1:]
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                   ignore_index=IGNORE, reduction="sum").item()
        tokens += (targets != IGNORE).sum().item()
    return total / tokens


@torch.no_grad()
def multiple_choice_accuracy(model, tokenizer: ByteTokenizer, items: list[dict]) -> float:
    """Share of items whose answer has the highest summed log-likelihood (lm-eval's `acc`)."""
    correct = 0
    for item in items:
        prompt = tokenizer.prompt_ids(item["prompt"])
        scores = []
        for choice in item["choices"]:
            answer = tokenizer.ids(choice)
            logits = model(input_ids=torch.tensor([prompt + answer])).logits[0, len(prompt) - 1:-1]
            scores.append(logits.log_softmax(-1).gather(-1, torch.tensor(answer)[:, None]).sum().item())
        correct += max(range(len(scores)), key=scores.__getitem__) == item["label"]
    return correct / len(items)


@torch.no_grad()
def generation_accuracy(model, tokenizer: ByteTokenizer, items: list[dict], max_new_tokens: int = 16) -> float:
    """Share of items whose greedy continuation up to the newline equals the target (lm-eval's exact_match)."""
    newline = tokenizer.ids("\n")[0]
    correct = 0
    for item in items:
        ids = tokenizer.prompt_ids(item["prompt"])
        generated = []
        while len(generated) < max_new_tokens:
            token = model(input_ids=torch.tensor([ids + generated])).logits[0, -1].argmax().item()
            if token == newline:
                break
            generated.append(token)
        correct += tokenizer.decode(generated) == item["target"]
    return correct / len(items)


def save(model, spec: TinyModelSpec, out_dir: Path) -> Path:
    """The Hugging Face layout of sk.models.tiny (same config, tokenizer), with the trained weights."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if spec.tie_word_embeddings:
        del weights["lm_head.weight"]  # the same tensor as the embeddings; engines tie them on load
    path = out_dir / "model.safetensors"
    save_file(weights, str(path), metadata={"format": "pt"})
    config = _config(spec)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {k: v for k, v in config.items() if k.endswith("_token_id")}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    write_byte_tokenizer(out_dir)
    return path


def cpu_identity() -> str:
    """Vendor, family and model as the kernel reports them: what MKL dispatches on, beyond the ISA."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block
            fields[key.strip()] = value.strip()
    except OSError:
        return platform.processor()
    return (f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
            f" ({fields.get('model name', '?')})")


def main(argv: list[str] | None = None) -> int:
    from sk.evals.task_data import generation_items, multiple_choice_items

    parser = argparse.ArgumentParser(prog="python -m sk.models.train", description=__doc__.splitlines()[0])
    parser.add_argument("--style", choices=sorted(SPECS), required=True)
    parser.add_argument("--out", type=output_dir, required=True, help="model directory to write")
    parser.add_argument("--steps", type=positive_int, default=Recipe.steps)
    args = parser.parse_args(argv)

    spec, recipe = SPECS[args.style], Recipe(steps=args.steps)
    start = time.monotonic()
    model, tokenizer, losses = train(spec, recipe)
    seconds = time.monotonic() - start
    weights = save(model, spec, args.out)
    mc_items, gen_items = multiple_choice_items(), generation_items()
    record = {
        "style": args.style,
        "parameters": sum(p.numel() for p in model.parameters()),
        "spec": dataclasses.asdict(spec),
        "recipe": dataclasses.asdict(recipe),
        "train_seconds": round(seconds, 1),
        "held_out": {
            "sk_synth_mc": {"acc": multiple_choice_accuracy(model, tokenizer, mc_items),
                            "chance": 1 / len(mc_items[0]["choices"]), "items": len(mc_items)},
            "sk_synth_gen": {"exact_match": generation_accuracy(model, tokenizer, gen_items),
                             "chance": 0.0, "items": len(gen_items),
                             "answer_loss": answer_loss(model, tokenizer, gen_items)},
        },
        "train_loss": {"first": losses[0], "last": losses[-1]},
        "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "built_with": {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                       "cpu": cpu_identity(), "machine": platform.machine(), "python": platform.python_version()},
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["held_out"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
