"""vLLM (CPU) with our adapter generates exactly what stock vLLM generates, and its worker ran our ops.

Each engine runs once in its own subprocess (this file is also the driver script), in fp32 on the project's
trained Llama-style and Gemma-style models (models/trained) with prompts of their corpus, whose greedy tokens
win by wide logit margins (rounding cannot flip them, a wrong kernel does); greedy, eager and compiled (vLLM's
default compile mode on CPU).
The adapter runs twice: through our PyTorch references, and with TRITON_INTERPRET=1 through the real Triton
kernels, interpreted on CPU. All assertions share the engine runs.
"""
import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest

from sk.reports import model_process_reports, read_reports

# Tasks of sk.models.corpus (addition, reversal, bracket closing): in distribution, the logits are peaked.
PROMPTS = ["add 478+95=", "rev kqzma=", "close ([{}(=", "rev standard="]
# The longest answer and its newline; past them the models' continuation was never trained.
MAX_TOKENS = 9
STYLES = ("llama", "gemma")
MODES = ("eager", "compiled")
# Adapter variants: the environment that switches them on.
VARIANTS = {
    "stock": {},
    "sk-torch": {"SK_ADAPTERS": "vllm"},
    "sk-triton": {"SK_ADAPTERS": "vllm", "TRITON_INTERPRET": "1"},
}
# The sk.coverage op names each model style must show in the worker.
OPS = {
    "llama": ("rms_norm", "fused_add_rms_norm", "silu_and_mul"),
    "gemma": ("gemma_rms_norm", "gemma_fused_add_rms_norm", "gelu_and_mul"),
}
RUN_TIMEOUT_S = 900

@pytest.fixture(scope="module")
def engine_run(vllm_python, engine_env, tmp_path_factory):
    """engine_run(style, mode, variant): tokens and per-process adapter reports of that engine run, which
    runs once per module and is then shared by every assertion."""
    runs: dict[tuple[str, str, str], dict] = {}

    def run(style: str, mode: str, variant: str) -> dict:
        key = (style, mode, variant)
        if key not in runs:
            work = tmp_path_factory.mktemp(f"vllm-{style}-{mode}-{variant}")
            env = {**engine_env, **VARIANTS[variant], "SK_REPORT_DIR": str(work / "reports")}
            out = work / "tokens.json"
            done = subprocess.run([vllm_python, __file__, "--style", style, "--mode", mode, "--out", str(out)],
                                  env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            if done.returncode:
                pytest.fail(f"engine run {key} failed (rc {done.returncode}):\n{done.stderr[-6000:]}")
            runs[key] = {**json.loads(out.read_text()), "reports": read_reports(work / "reports")}
        return runs[key]

    return run


def worker_reports(run: dict) -> list[dict]:
    return model_process_reports(run["reports"])


@pytest.mark.vllm
@pytest.mark.parametrize("variant", ["sk-torch", "sk-triton"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("style", STYLES)
def test_adapter_tokens_equal_stock(engine_run, style, mode, variant):
    stock = engine_run(style, mode, "stock")
    ours = engine_run(style, mode, variant)
    assert len(stock["tokens"]) == len(PROMPTS)
    assert ours["tokens"] == stock["tokens"]


@pytest.mark.vllm
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("style", STYLES)
def test_worker_report_shows_our_ops(engine_run, style, mode):
    # Through the references every call is a recorded fallback with its reason; interpreted, every call is
    # a kernel call and nothing falls back.
    torch_run = engine_run(style, mode, "sk-torch")
    triton_run = engine_run(style, mode, "sk-triton")
    (torch_worker,) = worker_reports(torch_run)
    (triton_worker,) = worker_reports(triton_run)
    for report in (torch_worker, triton_worker):
        assert report["rank"] == 0
        assert {"GemmaRMSNorm", "SiluAndMul", "GeluAndMul", "vllm.ir.ops.rms_norm"} <= set(report["replaced"])
    fallback_counts = {}
    for f in torch_worker["coverage"]["fallbacks"]:
        assert f["reason"].startswith("CPU tensor")
        fallback_counts[f["op"]] = fallback_counts.get(f["op"], 0) + f["count"]
    for op in OPS[style]:
        assert fallback_counts.get(op, 0) > 0, (op, torch_worker["coverage"])
        assert triton_worker["coverage"]["kernel_calls"].get(op, 0) > 0, (op, triton_worker["coverage"])
    assert triton_worker["coverage"]["fallbacks"] == []
    # Asked while running, the worker already shows the kernel calls it made so far.
    (live,) = triton_run["on_request"]
    assert live["rank"] == 0 and live["pid"] == triton_worker["pid"]
    for op in OPS[style]:
        assert 0 < live["coverage"]["kernel_calls"][op] <= triton_worker["coverage"]["kernel_calls"][op]


@pytest.mark.vllm
def test_stock_run_replaces_nothing(engine_run):
    stock = engine_run("llama", "eager", "stock")
    assert stock["reports"] == []  # the plugin is installed but not switched on: no process activated it


# ------------------------------------------------------------------------------------------------ the driver

def generate(style: str, mode: str) -> dict:
    from vllm import LLM, SamplingParams

    import sk.models
    from sk.adapters.vllm import report as adapter_report

    model = sk.models.trained_model(style)
    ask_workers = bool(os.environ.get("SK_ADAPTERS"))
    if ask_workers:
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc ships a function (pickled)
    llm = LLM(str(model), dtype="float32", enforce_eager=mode == "eager", seed=0, max_model_len=512,
              kv_cache_memory_bytes=256 << 20)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    # The adapter's report, asked of each worker while the engine runs (the at-exit files come later).
    on_request = llm.collective_rpc(adapter_report) if ask_workers else []
    return {"tokens": [list(o.outputs[0].token_ids) for o in outputs], "on_request": on_request}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Generate greedily with vLLM on a trained model; write the tokens.")
    parser.add_argument("--style", choices=STYLES, required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--out", required=True)
    cli = parser.parse_args()
    Path(cli.out).write_text(json.dumps(generate(cli.style, cli.mode)))
