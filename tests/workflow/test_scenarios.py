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


@pytest.mark.parametrize("name", ["tiny.yaml", "h200-llama.yaml", "h200-gemma.yaml"])
def test_bundled_scenarios_load(name):
    loaded = scenarios.load(REPO / "scenarios" / name)
    assert loaded and all(s.workload_members() for s in loaded)


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
     "unknown project model 'sk-trained/falcon'; known: sk-trained/llama, sk-trained/gemma, sk-tiny/llama"),
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
