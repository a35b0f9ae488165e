"""SGLang rows (`engine: sglang`) in `sk eval`, `sk capture` and `sk profile`, without SGLang: the rows are
validated, the engine arguments and the memory split are SGLang's, and the scheduler's layer capture
(sk.workflow.sglang_capture) records layers at the layer level, on stand-ins for SGLang's CustomOp classes
(SGLang itself runs on the GPU host; tests/adapters/test_sglang_*.py run its real classes in its own venv)."""
import pytest
import torch
from torch import nn

from sk import settings
from sk.workflow import scenarios, sglang_capture
from sk.workflow.engine_job import memory_args, sglang_engine_args
from sk.workflow.errors import WorkflowError

ROW = """\
scenarios:
  - model: sk-tiny/llama
    engine: sglang
    dtype: bfloat16
    max_model_len: 2048
    engine_args: {mem_fraction_static: 0.8}
    workloads: [LLM.single_request]
"""


def scenario(**fields):
    return scenarios.Scenario(**{"model": "sk-tiny/llama", "engine": "sglang", "dtype": "bfloat16",
                                 "workloads": ["LLM.single_request"], **fields})


def test_sglang_rows_are_accepted_and_validated(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(ROW)
    (row,) = scenarios.load(good)
    assert row.engine == "sglang" and row.slug.endswith("-sglang-tp1-bfloat16")
    bad = tmp_path / "bad.yaml"
    bad.write_text(ROW.replace("max_model_len: 2048", "kv_cache_memory_bytes: 268435456"))
    with pytest.raises(WorkflowError, match="kv_cache_memory_bytes is a vLLM setting"):
        scenarios.load(bad)


def test_two_engines_share_the_device_memory():
    # vLLM's budget is per engine; SGLang's counts what the first engine holds, so the second gets the total.
    vllm = scenario(engine="vllm", engine_args={"gpu_memory_utilization": 0.8})
    assert memory_args(vllm, 0, 2) == memory_args(vllm, 1, 2) == {"gpu_memory_utilization": 0.4}
    sglang = scenario(engine_args={"mem_fraction_static": 0.8})
    assert [memory_args(sglang, s, 2) for s in (0, 1)] == [{"mem_fraction_static": 0.4},
                                                           {"mem_fraction_static": 0.8}]
    assert memory_args(sglang, 0, 1) == {}
    cpu = scenario(engine="vllm", kv_cache_memory_bytes=1 << 28)
    assert memory_args(cpu, 1, 2) == {}


def test_sglang_engine_arguments_use_sglangs_names():
    job = {"model_args": {"model": "/m", "hf_overrides": {"num_hidden_layers": 2}, "load_format": "dummy"},
           "enforce_eager": False, "mode": "capture", "slot": 1, "engines": 2}
    args = sglang_engine_args(scenario(max_model_len=2048, engine_args={"mem_fraction_static": 0.8}), job)
    assert args["model_path"] == "/m" and args["context_length"] == 2048 and args["tp_size"] == 1
    assert args["disable_cuda_graph"] is True and args["mem_fraction_static"] == 0.8
    assert args["json_model_override_args"] == '{"num_hidden_layers": 2}' and args["load_format"] == "dummy"


class CustomOp(nn.Module):  # stands for sglang.srt.custom_op.CustomOp
    def forward(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)


class RMSNorm(CustomOp):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(hidden_size)), eps

    def forward_native(self, x, residual=None):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class QKVLinearLike(CustomOp):
    def forward_native(self, x):
        return x


def test_the_scheduler_capture_records_layers_and_hands_them_over(monkeypatch):
    monkeypatch.setattr(sglang_capture, "_recorder", None)
    recorder = sglang_capture.install(bases=(CustomOp,))
    try:
        norm, other = RMSNorm(64, eps=1e-5), QKVLinearLike()
        x = torch.randn(3, 64)
        for _ in range(2):
            norm(x)
        other(x[:, :8])
        state = sglang_capture.hand_over({"other": 1})
        calls = {c["op"]: c for c in state[sglang_capture.STATE_KEY]}
        assert set(calls) == {"rms_norm", "q_k_v_linear_like"}
        assert calls["rms_norm"]["class"] == "RMSNorm" and calls["rms_norm"]["count"] == 2
        assert calls["rms_norm"]["init"] == {"hidden_size": 64, "eps": 1e-5}
        assert calls["rms_norm"]["inputs"] == [{"shape": [3, 64], "dtype": "float32", "stride": [64, 1],
                                                "device": "cpu"}]
        assert state["other"] == 1
        assert sglang_capture.hand_over({})[sglang_capture.STATE_KEY] == []  # each ask starts a new record
    finally:
        recorder.uninstall()


def test_the_plugin_entry_point_installs_the_capture_when_asked(monkeypatch):
    from sk.adapters import sglang_plugin

    installed = []
    monkeypatch.setattr(sglang_capture, "install", lambda: installed.append(True))
    monkeypatch.delenv(settings.env_name("adapters"), raising=False)
    monkeypatch.setenv(settings.env_name("capture"), "1")
    sglang_plugin.register()
    monkeypatch.setenv(settings.env_name("capture"), "0")
    sglang_plugin.register()
    assert installed == [True]


class _FakeSglangEngine:
    """sglang.Engine's generate as SGLang 0.5.17 answers it: per request output_ids and, asked for top
    log-probabilities, meta_info["output_top_logprobs"] (per position (logprob, token id, text) triples)."""

    def __init__(self):
        self.calls = []

    def generate(self, input_ids, sampling_params, **options):
        self.calls.append(options)
        top = [[(-0.1, 7, None), (-2.3, 9, None)], [(-0.5, 8, None), (-0.6, 3, None)]]
        return [{"output_ids": [7, 8], "meta_info": {"output_top_logprobs": top} if options else {}}
                for _ in input_ids]


def test_sglang_match_asks_for_the_top_logprobs_and_reads_them():
    from sk.workflow import engine_job, prompts

    engine = engine_job.SglangEngine.__new__(engine_job.SglangEngine)
    engine.engine = _FakeSglangEngine()
    requests = [prompts.Request(prompt_token_ids=[1, 2, 3], max_tokens=2)]
    tokens, top = engine.generate(requests, top_logprobs=5)
    assert engine.engine.calls[-1] == {"return_logprob": True, "top_logprobs_num": 5}
    assert tokens == [[7, 8]] and top == [[[[7, -0.1], [9, -2.3]], [[8, -0.5], [3, -0.6]]]]
    tokens, top = engine.generate(requests)  # the timed batches ask for none
    assert engine.engine.calls[-1] == {} and top is None


def test_sglang_engine_generate_takes_the_logprob_options(tmp_path):
    """The options the fake above is given are the real sglang.Engine.generate's, and flush_cache answers with a
    success flag (in SGLang's own venv)."""
    import os
    import pathlib
    import subprocess

    python = os.environ.get("SK_SGLANG_PYTHON")
    if not python:
        repo = pathlib.Path(__file__).resolve().parents[2]
        done = subprocess.run(["bash", str(repo / "ci/envs/sglang.sh")], capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"the SGLang venv could not be built (ci/envs/sglang.sh):\n{done.stderr[-2000:]}")
        python = str(pathlib.Path(done.stdout.strip().splitlines()[-1]) / "bin" / "python")
    code = ("import inspect, sglang; from sglang.srt.managers.io_struct import FlushCacheReqOutput as F; "
            "p = inspect.signature(sglang.Engine.generate).parameters; "
            "print('return_logprob' in p and 'top_logprobs_num' in p and callable(sglang.Engine.flush_cache) "
            "and 'success' in F.__annotations__)")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.stdout.strip().splitlines()[-1:] == ["True"], done.stdout + done.stderr
