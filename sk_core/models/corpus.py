"""A synthetic, deterministic corpus the project's small models learn, and the held-out items that test them.

Each example is one line, `PROMPT ANSWER\\n`, where the answer follows from the prompt by a rule:
  - "add":  multi-digit addition             `add 478+95=`   -> `573`
  - "rev":  string reversal                  `rev kqzma=`    -> `amzqk`
  - "dyck": closing a bracket sequence       `close ([{}(=`  -> `))]`   (a small formal grammar: a stack)
A rule, not memory, gives the answer, so accuracy on prompts never seen in training measures learning.
Held out = a fixed hash of the prompt falls in the held-out bucket; the training sampler rejects those
prompts, so evaluation items are never trained on (the spaces are large enough that both sides stay rich).
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

KINDS = ("add", "rev", "dyck")
# 1 prompt in HELD_OUT_MODULUS is held out of training.
HELD_OUT_MODULUS = 8
MAX_ADD_DIGITS = 3
REV_LENGTHS = range(3, 9)
REV_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
DYCK_PAIRS = {"(": ")", "[": "]", "{": "}"}
DYCK_LENGTHS = range(2, 11)


@dataclass(frozen=True)
class Example:
    kind: str
    prompt: str
    answer: str

    @property
    def text(self) -> str:
        return f"{self.prompt}{self.answer}\n"


def is_held_out(prompt: str) -> bool:
    # sha256, not hash(): Python salts str hashes per process.
    return hashlib.sha256(prompt.encode()).digest()[0] % HELD_OUT_MODULUS == 0


def sample(kind: str, rng: random.Random) -> Example:
    """One example of `kind`, drawn from the whole space (held-out prompts included)."""
    if kind == "add":
        a, b = (rng.randrange(10 ** rng.randint(1, MAX_ADD_DIGITS)) for _ in range(2))
        return Example(kind, f"add {a}+{b}=", str(a + b))
    if kind == "rev":
        word = "".join(rng.choice(REV_ALPHABET) for _ in range(rng.choice(REV_LENGTHS)))
        return Example(kind, f"rev {word}=", word[::-1])
    if kind == "dyck":
        opened, prefix = [], []
        for _ in range(rng.choice(DYCK_LENGTHS)):
            # Close only when something is open, and always leave at least one bracket open at the end.
            if opened and rng.random() < 0.4:
                prefix.append(DYCK_PAIRS[opened.pop()])
            else:
                opened.append(rng.choice(list(DYCK_PAIRS)))
                prefix.append(opened[-1])
        if not opened:
            opened.append(rng.choice(list(DYCK_PAIRS)))
            prefix.append(opened[-1])
        return Example(kind, f"close {''.join(prefix)}=", "".join(DYCK_PAIRS[b] for b in reversed(opened)))
    raise ValueError(f"unknown example kind {kind!r}; known: {', '.join(KINDS)}")


def training_examples(rng: random.Random):
    """Endless training examples, kinds in turn, held-out prompts skipped."""
    while True:
        for kind in KINDS:
            example = sample(kind, rng)
            while is_held_out(example.prompt):
                example = sample(kind, rng)
            yield example


def held_out_examples(count: int, seed: int) -> list[Example]:
    """`count` distinct held-out examples, kinds in turn."""
    rng, seen, examples = random.Random(seed), set(), []
    while len(examples) < count:
        example = sample(KINDS[len(examples) % len(KINDS)], rng)
        if is_held_out(example.prompt) and example.prompt not in seen:
            seen.add(example.prompt)
            examples.append(example)
    return examples


def distractors(example: Example, rng: random.Random, count: int = 3) -> list[str]:
    """Plausible wrong answers (the mistakes a half-trained model makes), for multiple-choice items."""
    answer, wrong = example.answer, set()
    while len(wrong) < count:
        if example.kind == "add":
            value = int(answer) + rng.choice([-100, -10, -1, 1, 10, 100])
            candidate = str(value) if value >= 0 else answer[::-1]
        elif example.kind == "rev":
            i, j = rng.sample(range(len(answer)), 2)
            swapped, replaced = list(answer), list(answer)
            swapped[i], swapped[j] = swapped[j], swapped[i]
            replaced[i] = rng.choice([c for c in REV_ALPHABET if c != answer[i]])  # always differs
            candidate = rng.choice(["".join(swapped), answer[::-1], answer[1:] + answer[0], "".join(replaced)])
        else:
            chars = list(answer)
            i = rng.randrange(len(chars))
            chars[i] = rng.choice([c for c in DYCK_PAIRS.values() if c != chars[i]])
            candidate = rng.choice(["".join(chars), answer[::-1], answer + answer[-1], answer[:-1] or ")]"])
        if candidate != answer:
            wrong.add(candidate)
    return sorted(wrong)
