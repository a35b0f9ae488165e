"""How an engine job names its model: sk-tiny models are written at the requested depth; any other checkpoint
(sk-trained ones: the committed directory) runs truncated on vLLM's dummy weights (it cannot load into fewer
layers)."""
import json
from pathlib import Path

import pytest

from sk.workflow.engine_job import truncated_model_args
from sk.workflow.scenarios import Scenario


def scenario(model, **fields):
    return Scenario(model=model, dtype="float32", workloads=["LLM.mixed"], **fields)


def test_an_sk_tiny_model_is_written_with_the_requested_layers(tmp_path, monkeypatch):
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    monkeypatch.setenv("SK_CACHE_DIR", str(tmp_path))
    args = truncated_model_args(scenario("sk-tiny/llama", model_spec={"hidden_size": 128, "num_layers": 3}), 1)
    assert args["model"].startswith(str(tmp_path))
    config = json.loads((Path(args["model"]) / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (1, 128)
    assert set(args) == {"model"}


def test_other_checkpoints_run_truncated_on_dummy_weights():
    assert truncated_model_args(scenario("org/model"), 4) == {
        "model": "org/model", "hf_overrides": {"num_hidden_layers": 4}, "load_format": "dummy"}
    assert truncated_model_args(scenario("org/model"), None) == {"model": "org/model"}


def test_a_trained_model_is_its_committed_directory():
    trained = str(Path(__file__).resolve().parents[2] / "models" / "trained" / "gemma")
    assert truncated_model_args(scenario("sk-trained/gemma"), None) == {"model": trained}
    assert truncated_model_args(scenario("sk-trained/gemma"), 2) == {
        "model": trained, "hf_overrides": {"num_hidden_layers": 2}, "load_format": "dummy"}
