"""The committed trained models (models/trained/*): small, learned, and what `python -m sk.models.train` makes.

What every CI machine checks (x86-64, the pinned torch, any CPU model; nothing here skips by machine):
  - the committed weights are the recorded ones (sha256) and score their recorded held-out accuracies here,
    within 2 items of 300 a task;
  - the recipe is deterministic on the machine that runs it: two processes give bit-identical weights;
  - the recipe learns: a 100-step retrain lands in a held-out loss band measured across rounding paths.
Not promised: that a retrain gives the committed weights, or their accuracies, on another CPU. One thread and
deterministic algorithms fix the float operations torch asks for, not how the kernels under it round: MKL picks
its sgemm path and blocking by CPU vendor, model and caches, and ATen its vectorized kernels by instruction set,
while `torch.backends.cpu.get_cpu_capability()` says "AVX512" on any AVX-512 CPU. A full retrain on an
AMD EPYC family 26 model 2 gave the committed weights bit for bit; another "AMD EPYC" with AVX512 did not, and
ATen's AVX2 or default kernels on the first one sent 3000 steps down other trajectories (gemma's exact match
0.44 and 0.89 against 0.85). So a full retrain (opt-in: SK_FULL_RETRAIN=1, 8-40 min a model) must clear the
bars the committed models clear, not match them.
"""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sk.models.train import SPECS

TRAINED = Path(__file__).resolve().parents[2] / "models" / "trained"
MAX_BYTES = 20 << 20


def _record(style: str) -> dict:
    return json.loads((TRAINED / style / "training.json").read_text())


def _train(style: str, out: Path, steps: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sk.models.train", "--style", style, "--out", str(out),
                             "--steps", str(steps)], stdout=subprocess.DEVNULL)


def _trained(process: subprocess.Popen, out: Path, timeout: float) -> dict:
    assert process.wait(timeout=timeout) == 0
    return json.loads((out / "training.json").read_text())


def _assert_far_above_chance(held_out: dict) -> None:
    # Chance is 1/4 for multiple choice and ~0 for exact match; a trained model is far past both.
    assert held_out["sk_synth_mc"]["acc"] >= 2 * held_out["sk_synth_mc"]["chance"], held_out
    assert held_out["sk_synth_gen"]["exact_match"] >= 0.3, held_out


@pytest.mark.parametrize("style", sorted(SPECS))
def test_committed_model_is_small_and_far_above_chance(style):
    model = TRAINED / style
    assert sum(f.stat().st_size for f in model.iterdir()) <= MAX_BYTES
    config = json.loads((model / "config.json").read_text())
    assert config["head_dim"] == 64  # one of the head sizes vLLM's CPU attention supports
    _assert_far_above_chance(_record(style)["held_out"])
    weights = (model / "model.safetensors").read_bytes()
    assert hashlib.sha256(weights).hexdigest() == _record(style)["weights_sha256"]


# Items a task's accuracy may differ by between CPUs. Only the evaluation's rounding differs (the weights are
# fixed). Some multiple-choice items offer a prefix of the answer (`}` for `})`), whose score differs from the
# answer's by the log-probability of a near-certain token: llama's two closest items are 3.6e-7 and 4.8e-7 nats
# apart, and ATen's AVX512/AVX2/default kernels and MKL's COMPATIBLE branch moved such gaps by up to 2.4e-7.
# The closest greedy decision of either model is 2e-5 apart, the next 5e-4.
EVAL_ITEMS_TOLERANCE = 2


@pytest.mark.parametrize("style", sorted(SPECS))
def test_committed_weights_score_their_recorded_accuracies(style):
    import torch
    from transformers import AutoModelForCausalLM

    from sk.evals.task_data import generation_items, multiple_choice_items
    from sk.models.train import ByteTokenizer, generation_accuracy, multiple_choice_accuracy

    held_out = _record(style)["held_out"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the recipe evaluates
    try:
        model = AutoModelForCausalLM.from_pretrained(TRAINED / style, dtype=torch.float32).eval()
        tokenizer = ByteTokenizer()
        mc = multiple_choice_accuracy(model, tokenizer, multiple_choice_items())
        gen = generation_accuracy(model, tokenizer, generation_items())
    finally:
        torch.set_num_threads(threads)
    for measured, recorded, items in ((mc, held_out["sk_synth_mc"]["acc"], held_out["sk_synth_mc"]["items"]),
                                      (gen, held_out["sk_synth_gen"]["exact_match"],
                                       held_out["sk_synth_gen"]["items"])):
        assert abs(measured - recorded) * items <= EVAL_ITEMS_TOLERANCE + 1e-9, (style, measured, recorded)


SHORT_STEPS = 100  # the warmup: its learning rates do not depend on the total number of steps
# Held-out answer loss (nats per token) after SHORT_STEPS, from ln(320) = 5.77 at the start: measured
# 1.97-2.07 (llama) and 2.18 (gemma) on three rounding paths (ATen's AVX512, AVX2 and default kernels).
SHORT_ANSWER_LOSS = (1.7, 2.5)  # about 0.3 past the measured spread on either side


@pytest.mark.slow
@pytest.mark.parametrize("style", sorted(SPECS))
def test_retraining_is_deterministic_here_and_learns(style, tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    processes = [_train(style, out, SHORT_STEPS) for out in outs]  # concurrently: one thread each
    first, second = (_trained(p, out, timeout=600) for p, out in zip(processes, outs))
    # Same machine, same build: every float operation and its kernel are the same, so the results are exact.
    for record in (first, second):
        del record["train_seconds"]
    assert first == second
    assert (outs[0] / "model.safetensors").read_bytes() == (outs[1] / "model.safetensors").read_bytes()
    low, high = SHORT_ANSWER_LOSS
    assert low <= first["held_out"]["sk_synth_gen"]["answer_loss"] <= high, first["held_out"]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SK_FULL_RETRAIN"), reason="opt-in (SK_FULL_RETRAIN=1): 8-40 min a model")
@pytest.mark.parametrize("style", sorted(SPECS))
def test_full_retraining_clears_the_committed_models_bars(style, tmp_path):
    # MC acc / exact match, committed against ATen's AVX2 and default kernels: llama 0.73 / 0.80, 0.67 / 0.70,
    # 0.64 / 0.70; gemma 0.73 / 0.85, 0.68 / 0.44, 0.77 / 0.89. The bars hold, closeness does not.
    record = _record(style)
    retrained = _trained(_train(style, tmp_path, record["recipe"]["steps"]), tmp_path, timeout=3 * 3600)
    assert retrained["recipe"] == record["recipe"]
    _assert_far_above_chance(retrained["held_out"])
