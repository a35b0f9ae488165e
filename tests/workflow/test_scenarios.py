"""Scenario files: the bundled ones load; bad ones are refused with the file, the row and the field named."""
from pathlib import Path

import pytest

from sk.cli import main
from sk.workflow import scenarios
from sk.workflow.errors import WorkflowError

REPO = Path(__file__).resolve().parents[2]
GOOD_ROW = "  - model: sk-tiny/llama\n    dtype: float32\n    workloads: [LLM.mixed]\n"


def write(tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "scenarios").glob("*.yaml")))
def test_bundled_scenarios_load_and_fit_their_device(name):
    loaded = scenarios.load(REPO / "scenarios" / name)
    assert loaded and all(s.workload_members() for s in loaded)
    scenarios.check_fits(loaded, 2, name)  # sk eval's two engines side by side


FULL_DEPTH = {  # file stem -> (layers, hidden, intermediate, heads, kv heads, head_dim) of the real model
    "h200-llama3-8b": (32, 4096, 14336, 32, 8, 128), "h200-llama3.2-1b": (16, 2048, 8192, 32, 8, 64),
    "h200-qwen3-8b": (36, 4096, 12288, 32, 8, 128), "h200-qwen3-0.6b": (28, 1024, 3072, 16, 8, 128),
    "h200-gemma-2b": (18, 2048, 16384, 8, 1, 256),
}


@pytest.mark.parametrize("stem", FULL_DEPTH)
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_full_depth_scenarios_have_the_real_shapes_and_the_benchmark_workloads(stem, engine):
    (row,) = scenarios.load(REPO / "scenarios" / f"{stem}-{engine}.yaml")
    spec = row.tiny_model_spec()
    assert (spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.num_heads, spec.num_kv_heads,
            spec.head_dim) == FULL_DEPTH[stem]
    assert row.engine == engine and row.dtype == "bfloat16" and spec.weights_dtype == "bfloat16"
    assert {"LLM.throughput", "LLM.decode_batch_1", "LLM.decode_batch_8", "LLM.decode_batch_32"} <= set(row.workloads)
    assert spec.style == ("qwen3" if "qwen3" in stem else "gemma" if "gemma" in stem else "llama")


def test_a_scenario_that_cannot_fit_the_device_is_refused(tmp_path):
    row = ("  - model: sk-tiny/llama\n    dtype: bfloat16\n    device_memory_gib: 80\n"
           "    model_spec: {hidden_size: 8192, intermediate_size: 28672, num_layers: 80, num_heads: 64, "
           "num_kv_heads: 8, head_dim: 128}\n    workloads: [LLM.mixed]\n")
    loaded = scenarios.load(write(tmp_path, "scenarios:\n" + row))
    with pytest.raises(WorkflowError, match=r"s.yaml: scenarios.0 \(sk-tiny/llama \(vllm, tp=1\)\) does not fit the "
                                            r"device: it needs 1\d\d\.\d GiB per engine \(weights 1\d\d\.\d, kv one "
                                            r"sequence 1\.\d, overhead 2\.0\), and 2 engine\(s\) on 80 GiB at "
                                            r"gpu_memory_utilization 0.9 get 36.0 GiB each"):
        scenarios.check_fits(loaded, 2, write(tmp_path, "scenarios:\n" + row))


def test_sk_eval_refuses_a_scenario_that_cannot_fit_before_any_engine_starts(tmp_path, capsys, monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("an engine was started"))
    path = write(tmp_path, "scenarios:\n  - model: sk-tiny/gemma\n    dtype: bfloat16\n    device_memory_gib: 8\n"
                           "    model_spec: {hidden_size: 2048, intermediate_size: 16384, num_layers: 18, "
                           "vocab_size: 256000}\n    workloads: [LLM.mixed]\n")
    assert main(["eval", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "does not fit the device" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_tiny_runs_the_trained_models_in_fp32_on_cpu():
    tiny = scenarios.load(REPO / "scenarios" / "tiny.yaml")
    assert {s.model for s in tiny} == {"sk-trained/llama", "sk-trained/gemma"}
    assert {s.checkpoint() for s in tiny} == {str(REPO / "models" / "trained" / style) for style in ("llama", "gemma")}
    assert all(s.dtype == "float32" and s.kv_cache_memory_bytes for s in tiny)


def test_a_trained_model_missing_from_the_install_is_refused_clearly(tmp_path, monkeypatch):
    import sk.models.trained

    monkeypatch.setattr(sk.models.trained, "LOCATIONS", (tmp_path / "package", tmp_path / "checkout"))
    with pytest.raises(WorkflowError, match=r"sk-trained/llama: trained model 'llama' not found in .*package/llama "
                                            r"or .*checkout/llama; it is part of the repository \(models/trained/\)"):
        scenarios.load(write(tmp_path, "scenarios:\n" + GOOD_ROW.replace("sk-tiny", "sk-trained")))


@pytest.mark.parametrize("text, message", [
    ("scenarios:\n" + GOOD_ROW.replace("LLM.mixed", "LLM.bogus"),
     "scenarios.0.workloads.*unknown workload 'LLM.bogus'"),
    ("scenarios:\n  - dtype: float32\n    workloads: [LLM.mixed]\n", "scenarios.0.model: Field required"),
    ("scenarios:\n" + GOOD_ROW.replace("float32", "float8"), "scenarios.0.dtype"),
    ("scenarios:\n" + GOOD_ROW.replace("sk-tiny/llama", "./no/such/dir"),
     "model directory './no/such/dir' does not exist"),
    ("scenarios:\n" + GOOD_ROW.replace("sk-tiny/llama", "sk-tiny/falcon"), "unknown project model 'sk-tiny/falcon'"),
    ("scenarios:\n" + GOOD_ROW.replace("sk-tiny/llama", "sk-trained/falcon"),
     "unknown project model 'sk-trained/falcon'; known: sk-trained/llama, sk-trained/gemma, sk-trained/qwen3, sk-tiny/llama"),
    ("scenarios:\n" + GOOD_ROW.replace("sk-tiny", "sk-trained") + "    model_spec: {num_layers: 1}\n",
     "model_spec sizes a random-weight project model \\(sk-tiny/<style>\\), not 'sk-trained/llama'"),
    ("scenarios:\n" + GOOD_ROW + "    tpp: 2\n", "scenarios.0.tpp: Extra inputs are not permitted"),
    ("scenarios:\n" + GOOD_ROW + "    model_spec: {hidden: 8}\n", "model_spec: .*hidden"),
    ("scenarios: [\n", "is not valid YAML"),
    ("scenarios: []\n", "scenarios: List should have at least 1 item"),
])
def test_bad_scenarios_are_refused_clearly(tmp_path, text, message):
    with pytest.raises(WorkflowError, match=message):
        scenarios.load(write(tmp_path, text))


def test_the_cli_reports_a_bad_scenario_without_a_traceback(tmp_path, capsys):
    path = write(tmp_path, "scenarios:\n" + GOOD_ROW.replace("LLM.mixed", "LLM.bogus"))
    assert main(["eval", str(path)]) == 2
    assert main(["capture", str(tmp_path / "missing.yaml")]) == 2
    out = capsys.readouterr().out
    assert "unknown workload 'LLM.bogus'" in out and "does not exist" in out and "Traceback" not in out
