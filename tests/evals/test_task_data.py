"""The lm-eval task files: current, held out of training, well formed."""
import itertools
import random

from sk.evals import task_data
from sk.models import corpus


def test_shipped_task_files_are_current(tmp_path):
    task_data.write_task_files(tmp_path)
    for filename, _ in task_data.TASK_FILES.values():
        assert (tmp_path / filename).read_text() == (task_data.TASKS_DIR / filename).read_text(), (
            f"{filename} is stale: run `python -m sk.evals.task_data`")


def test_items_are_held_out_of_training_and_distinct():
    mc, gen = task_data.multiple_choice_items(), task_data.generation_items()
    prompts = [item["prompt"] for item in mc + gen]
    assert len(mc) == len(gen) == task_data.ITEMS_PER_TASK
    assert len(set(prompts)) == len(prompts)
    assert all(corpus.is_held_out(p) for p in prompts)
    trained = {e.prompt for e in itertools.islice(corpus.training_examples(random.Random(0)), 20000)}
    assert not trained & set(prompts)


def test_items_have_one_right_answer():
    for item in task_data.multiple_choice_items():
        assert len(set(item["choices"])) == 4
        kind, body = item["prompt"].split(" ", 1)
        right = item["choices"][item["label"]]
        if kind == "add":
            a, b = body.rstrip("=").split("+")
            assert right == str(int(a) + int(b))
        elif kind == "rev":
            assert right == body.rstrip("=")[::-1]
    assert {item["kind"] for item in task_data.generation_items()} == set(corpus.KINDS)
