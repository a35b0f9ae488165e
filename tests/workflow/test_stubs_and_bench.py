"""Operator map, candidate stubs and the kernel bench, on a capture written here (no engine needed)."""
import json

import pytest
import torch

from sk.cli import main
from sk.workflow import candidates, stubs
from sk.workflow.capture import SCHEMA
from sk.workflow.errors import WorkflowError
from sk.workflow.operators import ARCHITECTURES, OPERATORS, operator


def tensor(*shape, dtype="float32", stride=None):
    stride = stride or [int(torch.tensor(shape[i + 1:]).prod()) for i in range(len(shape))]
    return {"shape": list(shape), "dtype": dtype, "stride": stride, "device": "cpu"}


@pytest.fixture
def capture_dir(tmp_path):
    """A capture as `sk capture` writes it: a norm with and without residual, an activation, a strided rotary."""
    operators = [
        {"op": "rms_norm", "class": "RMSNorm", "init": {"hidden_size": 96, "eps": 1e-6},
         "inputs": [tensor(3, 96), tensor(3, 96)], "count": 10},
        {"op": "rms_norm", "class": "RMSNorm", "init": {"hidden_size": 96, "eps": 1e-6},
         "inputs": [tensor(5, 96)], "count": 2},
        {"op": "silu_and_mul", "class": "SiluAndMul", "init": {}, "inputs": [tensor(4, 64)], "count": 4},
        {"op": "rotary_embedding", "class": "RotaryEmbedding",
         "init": {"head_size": 16, "rotary_dim": 16, "max_position_embeddings": 64, "base": 10000.0,
                  "is_neox_style": True, "dtype": "float32"},
         "inputs": [tensor(3, dtype="int64"), tensor(3, 32, stride=[64, 1]), tensor(3, 16, stride=[64, 1])],
         "count": 6},
    ]
    directory = tmp_path / "captures"
    directory.mkdir()
    (directory / "tiny.mixed.json").write_text(json.dumps({
        "schema": SCHEMA, "workload": "LLM.mixed", "environment": {"architecture": "llama"}, "operators": operators}))
    return directory


def test_every_architecture_names_known_operators():
    for ops in ARCHITECTURES.values():
        assert set(ops) <= set(OPERATORS)


def test_map_lists_coverage_and_captured_shapes(capture_dir, capsys):
    assert main(["list", "--map", "llama", "--captures", str(capture_dir)]) == 0
    out = capsys.readouterr().out
    assert "sk.ops.fused_add_rms_norm" in out and "not covered" in out and "RotaryEmbedding" in out


def test_stubs_keep_the_baseline_class_name_and_signatures(tmp_path):
    outcome = stubs.create("llama", tmp_path, force=False)
    assert set(ARCHITECTURES["llama"]) <= set(outcome)  # vLLM's model class may name more (attention, ...)
    for name in ("rms_norm", "silu_and_mul", "rotary_embedding"):
        assert outcome[name].startswith("created")
        cls = candidates.load_candidate(operator(name), tmp_path)
        assert cls.__name__ == operator(name).vllm_class
    assert "skipped" in outcome["row_parallel_linear"]
    assert stubs.create("llama", tmp_path, force=False)["rms_norm"].startswith("kept")


@pytest.mark.parametrize("target", ["rms_norm", "silu_and_mul", "rotary_embedding"])
def test_self_test_is_correct_and_even(capture_dir, tmp_path, target, capsys):
    assert main(["bench", "--target", target, "--self-test", "--captures", str(capture_dir)]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "FAIL" not in out and "CPU timings" in out


@pytest.mark.parametrize("target", ["rms_norm", "silu_and_mul", "rotary_embedding"])
def test_stub_candidates_pass_the_bench(capture_dir, tmp_path, target, capsys):
    stubs.create("llama", tmp_path / "cands", force=False)
    assert main(["bench", "--target", target, "--captures", str(capture_dir),
                 "--candidates", str(tmp_path / "cands")]) == 0


def test_a_wrong_candidate_fails_the_bench(capture_dir, tmp_path, capsys):
    (tmp_path / "silu_and_mul.py").write_text(
        "import torch\nfrom sk.workflow.baseline_ops import SiluAndMul as B\n"
        "class SiluAndMul(B):\n    def forward(self, x):\n        return torch.relu(x[..., :x.shape[-1] // 2])\n")
    assert main(["bench", "--target", "silu_and_mul", "--captures", str(capture_dir),
                 "--candidates", str(tmp_path)]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("source, message", [
    ("class RMSNorm:\n    def __init__(self, hidden_size, eps=1e-6, var_hidden_size=None, has_weight=True, dtype=None):"
     "\n        pass\n    def forward(self, x):\n        return x\n", r"RMSNorm.forward\(self, x\) does not match"),
    ("class Norm:\n    pass\n", "defines no class RMSNorm"),
    ("import nowhere_to_be_found\n", "failed to import: ModuleNotFoundError"),
])
def test_a_mismatched_candidate_is_refused_with_both_signatures(capture_dir, tmp_path, source, message, capsys):
    (tmp_path / "rms_norm.py").write_text(source)
    with pytest.raises(WorkflowError, match=message):
        candidates.load_candidate(operator("rms_norm"), tmp_path)
    assert main(["bench", "--target", "rms_norm", "--captures", str(capture_dir), "--candidates", str(tmp_path)]) == 2
    assert "Traceback" not in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--target", "softmax"], "unknown operator 'softmax'"),
    (["--target", "gelu_and_mul"], "hold no call of gelu_and_mul"),
    (["--target", "row_parallel_linear"], "no baseline operator yet"),
    (["--target", "rms_norm", "--candidates", "/nonexistent"], "no candidate for rms_norm"),
])
def test_bad_bench_requests_get_a_clear_message(capture_dir, args, message, capsys):
    assert main(["bench", *args, "--captures", str(capture_dir)]) == 2
    out = capsys.readouterr().out
    assert message in out and "Traceback" not in out


def test_missing_captures_are_reported(tmp_path, capsys):
    assert main(["bench", "--target", "rms_norm", "--self-test", "--captures", str(tmp_path / "none")]) == 2
    assert "no capture in" in capsys.readouterr().out


def test_eval_refuses_bad_candidate_folders_before_starting_an_engine(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("scenarios:\n  - model: sk-tiny/llama\n    dtype: float32\n    workloads: [LLM.mixed]\n")
    (tmp_path / "empty").mkdir()
    assert main(["eval", str(scenario), "--candidates", str(tmp_path / "empty")]) == 2
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "silu_and_mul.py").write_text("class SiluAndMul:\n    def forward(self, y):\n        pass\n")
    assert main(["eval", str(scenario), "--candidates", str(tmp_path / "bad")]) == 2
    out = capsys.readouterr().out
    assert "no candidate module in" in out and "does not match the baseline" in out and "Traceback" not in out
