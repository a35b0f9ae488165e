"""How an engine job names its model: sk-tiny models are written at the requested depth; any other checkpoint
(sk-trained ones: the committed directory) runs truncated on vLLM's dummy weights (it cannot load into fewer
layers). How it times a batch: the prefix cache is emptied first, so a repeated prompt's prefill is timed."""
import json
from pathlib import Path

import pytest

from sk.workflow import engine_job, prompts
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


class _RecordingEngine:
    """An engine that logs what the job asks of it, in order."""

    def __init__(self):
        self.log = []

    def tokenizer(self):
        return None

    def reset_prefix_cache(self):
        self.log.append("reset")

    def generate(self, requests, progress=False, top_logprobs=0):
        self.log.append("generate")
        return [[1] * r.max_tokens for r in requests], None

    def batch(self, requests):
        return self.generate(requests, progress=True)[0], {}

    def profile(self, run, keep=None):
        self.log.append("profile")
        self.kept = keep
        run()
        return {}


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(engine_job, "workload_requests",
                        lambda engine, token, max_requests: [prompts.Request([1, 2, 3], 4)])
    return engine_job.Server(_RecordingEngine(), {"max_requests": None})


def test_each_timed_batch_starts_from_an_empty_prefix_cache(server):
    assert server.batch("LLM.decode_batch_1")["output_tokens"] == 4
    server.batch("LLM.decode_batch_1")
    assert server.engine.log == ["reset", "generate", "reset", "generate"]


def test_the_profiled_batch_starts_from_an_empty_prefix_cache(server):
    server.batch("LLM.decode_batch_1")  # the warm-up
    server.profile("LLM.decode_batch_1", keep="/out/traces/x.rank{rank}.trace.json.gz")
    assert server.engine.log == ["reset", "generate", "reset", "profile", "generate"]
    assert server.engine.kept == "/out/traces/x.rank{rank}.trace.json.gz"  # the engine's ranks fill it in


class _Flushing:
    """sglang.Engine.flush_cache as 0.5.17 answers it: not done while the scheduler still holds a request."""

    def __init__(self, busy_answers):
        self.busy_answers, self.calls = busy_answers, 0

    def flush_cache(self):
        from types import SimpleNamespace

        self.calls += 1
        return SimpleNamespace(success=self.calls > self.busy_answers, message="")


def test_a_reset_refused_while_the_engine_retires_its_batch_is_retried(monkeypatch):
    monkeypatch.setattr(engine_job, "RESET_PAUSE_S", 0.0)
    engine = engine_job.SglangEngine.__new__(engine_job.SglangEngine)
    engine.engine = _Flushing(busy_answers=3)
    engine.reset_prefix_cache()
    assert engine.engine.calls == 4


def test_a_reset_never_done_is_an_error_naming_the_call(monkeypatch):
    monkeypatch.setattr(engine_job, "RESET_PAUSE_S", 0.0)
    engine = engine_job.SglangEngine.__new__(engine_job.SglangEngine)
    engine.engine = _Flushing(busy_answers=10**6)
    with pytest.raises(RuntimeError, match=r"SGLang's flush_cache\(\) did not succeed .* still holds requests"):
        engine.reset_prefix_cache()
    assert engine.engine.calls == engine_job.RESET_TRIES


@pytest.mark.parametrize("uuid, recorded", [
    ("58e1b8a2-1c3d-4e5f-8a9b-0c1d2e3f4a5b", True), ("GPU-58e1b8a2-1c3d-4e5f-8a9b-0c1d2e3f4a5b", True),
    ("<torch._C._CUuuid object at 0x7f3a2c>", False), (None, False)])
def test_a_run_records_the_card_it_measured(monkeypatch, uuid, recorded):
    import types

    import torch

    # The card's UUID where torch gives one (sk profile --compare tells two cards apart by it); never an object's
    # repr, which differs from process to process on one card.
    properties = types.SimpleNamespace(**({"uuid": uuid} if uuid else {}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
    expected = {"device": "NVIDIA H100 80GB HBM3"} | ({"device_uuid": uuid} if recorded else {})
    assert engine_job.device_identity() == expected


def test_a_cpu_run_records_the_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engine_job.device_identity() == {"device": "cpu"}
