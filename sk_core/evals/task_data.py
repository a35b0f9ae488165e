"""The held-out evaluation items of the synthetic corpus, as the JSONL files the lm-eval tasks read.

Two tasks over the same three kinds of examples (addition, reversal, bracket closing; see sk.models.corpus):
  - multiple choice (log-likelihood): the answer among 3 plausible wrong ones, chance = 1/4;
  - generation (exact match): greedy continuation of the prompt up to the newline, chance ~ 0.
The items are drawn with fixed seeds from prompts the training sampler never produces, and are also what
`sk.models.train` scores after training, so the recorded accuracy and the engine's agree on one item set.

    python -m sk.evals.task_data      # rewrite the shipped JSONL files (a test checks they are current)
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from sk.models import corpus

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
ITEMS_PER_TASK = 300
HELD_OUT_SEED = 20261129
DISTRACTOR_SEED = 7


def _held_out() -> tuple[list[corpus.Example], list[corpus.Example]]:
    # One draw of distinct prompts split in two, so no prompt is in both tasks.
    examples = corpus.held_out_examples(2 * ITEMS_PER_TASK, HELD_OUT_SEED)
    return examples[:ITEMS_PER_TASK], examples[ITEMS_PER_TASK:]


def multiple_choice_items() -> list[dict]:
    rng = random.Random(DISTRACTOR_SEED)
    items = []
    for example in _held_out()[0]:
        choices = [example.answer, *corpus.distractors(example, rng)]
        rng.shuffle(choices)
        items.append({"kind": example.kind, "prompt": example.prompt, "choices": choices,
                      "label": choices.index(example.answer)})
    return items


def generation_items() -> list[dict]:
    return [{"kind": e.kind, "prompt": e.prompt, "target": e.answer} for e in _held_out()[1]]


# Task name -> (JSONL file in TASKS_DIR, items).
TASK_FILES = {
    "sk_synth_mc": ("sk_synth_mc.jsonl", multiple_choice_items),
    "sk_synth_gen": ("sk_synth_gen.jsonl", generation_items),
}


def jsonl(items: list[dict]) -> str:
    return "".join(json.dumps(item, sort_keys=True) + "\n" for item in items)


def write_task_files(directory: Path = TASKS_DIR) -> None:
    for filename, items in TASK_FILES.values():
        (directory / filename).write_text(jsonl(items()))


if __name__ == "__main__":
    write_task_files()
