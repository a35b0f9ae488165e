"""vLLM (CPU) with our adapter generates exactly what stock vLLM generates, and its worker ran our ops.

Each engine runs once in its own subprocess (this file is also the driver script), in fp32 on the project's
trained Llama-style and Gemma-style models (models/trained) with prompts of their corpus, whose greedy tokens
win by wide logit margins (rounding cannot flip them, a wrong kernel does); greedy, eager and compiled (vLLM's
default compile mode on CPU).
The adapter runs twice: through our PyTorch references, and with TRITON_INTERPRET=1 through the real Triton
kernels, interpreted on CPU; in both the decoder layers' norm + MLP are one sk.ops.fused_gated_mlp call (its
recorded reference in the first; its kernels in the second: the coverage table's interpreted_precisions let the
interpreter run them in fp32, which the GPU leaves to the reference). Once more, with
SK_FUSED_MLP=0, for the A/B switch (llama, eager); with SK_NORM_ACT_LAYERS=0 (llama, compiled), the fused blocks
amid vLLM's own norms; and with SK_ATTENTION_LINEAR=1 (llama), the attention projections through sk.ops.linear.
All assertions share the engine runs.
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
STYLES = ("llama", "gemma", "qwen3")
MODES = ("eager", "compiled")
# Adapter variants: the environment that switches them on.
VARIANTS = {
    "stock": {},
    "sk-torch": {"SK_ADAPTERS": "vllm"},  # the default: SK_FUSED_MLP=1
    "sk-triton": {"SK_ADAPTERS": "vllm", "TRITON_INTERPRET": "1"},
    "sk-unfused": {"SK_ADAPTERS": "vllm", "SK_FUSED_MLP": "0"},
    "sk-linear": {"SK_ADAPTERS": "vllm", "SK_ATTENTION_LINEAR": "1"},
    "sk-blocks-only": {"SK_ADAPTERS": "vllm", "SK_NORM_ACT_LAYERS": "0"},
}
# The sk.coverage op names each model style must show in the worker: norms, and the fused block that stands
# for post_attention_layernorm + MLP (the activation runs inside it).
# Qwen3's q/k norms are rms_norm calls too.
OPS = {
    "llama": ("rms_norm", "fused_add_rms_norm"),
    "gemma": ("gemma_rms_norm", "gemma_fused_add_rms_norm"),
    "qwen3": ("rms_norm", "fused_add_rms_norm"),
}
FUSED = {"llama": "fused_gated_mlp/rms", "gemma": "fused_gated_mlp/gemma_rms", "qwen3": "fused_gated_mlp/rms"}
# Without the fused blocks (SK_FUSED_MLP=0) the MLP's activation is our op again.
UNFUSED_ACT = {"llama": "silu_and_mul", "gemma": "gelu_and_mul", "qwen3": "silu_and_mul"}
LAYERS = 4  # decoder layers of the trained models
RUN_TIMEOUT_S = 900

@pytest.fixture(scope="module")
def engine_run(vllm_python, engine_env, tmp_path_factory):
    """engine_run(style, mode, variant): tokens and per-process adapter reports of that engine run, which
    runs once per module and is then shared by every assertion."""
    runs: dict[tuple[str, str, str], dict] = {}

    def run(style: str, mode: str, variant: str, *extra: str) -> dict:
        key = (style, mode, variant, *extra)
        if key not in runs:
            work = tmp_path_factory.mktemp(f"vllm-{style}-{mode}-{variant}")
            env = {**engine_env, **VARIANTS[variant], "SK_REPORT_DIR": str(work / "reports")}
            out = work / "tokens.json"
            done = subprocess.run([vllm_python, __file__, "--style", style, "--mode", mode, "--out", str(out),
                                   *extra], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
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
    assert fallback_counts.get(FUSED[style], 0) > 0, torch_worker["coverage"]
    assert UNFUSED_ACT[style] not in fallback_counts  # the activation runs inside the fused block
    # Interpreted, nothing falls back: the fused block's kernels too (fp32 runs them under the interpreter).
    assert not triton_worker["coverage"]["fallbacks"], triton_worker["coverage"]["fallbacks"]
    for report in (torch_worker, triton_worker):
        blocks = report["fused_blocks"]
        assert blocks["enabled"] and blocks["layers_fused"] == LAYERS and blocks["engine_path"] == {}, blocks
    torch_blocks, triton_blocks = torch_worker["fused_blocks"], triton_worker["fused_blocks"]
    assert torch_blocks["fallback_calls"] > 0 and torch_blocks["kernel_calls"] == {}, torch_blocks
    assert triton_blocks["fallback_calls"] == 0 and triton_blocks["kernel_calls"][FUSED[style]] > 0, triton_blocks
    # No weight copies: the kernels read the layers' own weights (vLLM's KV cache is stock's size).
    assert triton_blocks["weights_prepared"] == {}, triton_blocks
    # Asked while running, the worker already shows the kernel calls it made so far.
    (live,) = triton_run["on_request"]
    assert live["rank"] == 0 and live["pid"] == triton_worker["pid"]
    for op in OPS[style]:
        assert 0 < live["coverage"]["kernel_calls"][op] <= triton_worker["coverage"]["kernel_calls"][op]


@pytest.mark.vllm
def test_fused_blocks_switch_off(engine_run):
    # SK_FUSED_MLP=0: same tokens, the MLPs run the engine's layers with our activation, nothing fused.
    stock, unfused = engine_run("llama", "eager", "stock"), engine_run("llama", "eager", "sk-unfused")
    assert unfused["tokens"] == stock["tokens"]
    (worker,) = worker_reports(unfused)
    ops = {f["op"] for f in worker["coverage"]["fallbacks"]}
    assert UNFUSED_ACT["llama"] in ops and not any(op.startswith("fused_gated_mlp") for op in ops), ops
    assert worker["fused_blocks"]["enabled"] is False and worker["fused_blocks"]["layers_fused"] == 0
    assert worker["replaced"]["decoder layers (norm + MLP)"] == "off (SK_FUSED_MLP=0)"


@pytest.mark.vllm
def test_fused_blocks_without_our_norm_and_activation_layers(engine_run):
    # SK_NORM_ACT_LAYERS=0: vLLM's own norms (compiled by Inductor here) around our fused blocks; same tokens.
    stock, blocks = engine_run("llama", "compiled", "stock"), engine_run("llama", "compiled", "sk-blocks-only")
    assert blocks["tokens"] == stock["tokens"]
    (worker,) = worker_reports(blocks)
    assert set(worker["replaced"]) == {"decoder layers (norm + MLP)"}, worker["replaced"]
    assert worker["fused_blocks"]["layers_fused"] == LAYERS
    coverage = worker["coverage"]
    ops = set(coverage["kernel_calls"]) | {f["op"] for f in coverage["fallbacks"]}
    assert ops == {FUSED["llama"]}, ops


@pytest.mark.vllm
@pytest.mark.parametrize("mode", MODES)
def test_attention_projections_through_sk_linear(engine_run, mode):
    # SK_ATTENTION_LINEAR=1: vLLM's own QKV and output projections call sk.ops.linear (fp32 here: its recorded
    # reference), beside the fused blocks; same tokens, eager and compiled.
    stock, routed = engine_run("llama", mode, "stock"), engine_run("llama", mode, "sk-linear")
    assert routed["tokens"] == stock["tokens"]
    (worker,) = worker_reports(routed)
    projections = worker["fused_blocks"]["projections"]
    assert projections["routed"] == 2 * LAYERS and projections["engine_path"] == {}, projections
    assert projections["fallback_calls"] > 0 and projections["fallback_reasons"] == [
        "CPU tensor: the kernels need a CUDA GPU (TRITON_INTERPRET=1 runs them interpreted, for testing)"]
    assert worker["fused_blocks"]["layers_fused"] == LAYERS
    assert "QKV and output projections -> sk.ops.linear" in worker["replaced"]["decoder layers (norm + MLP)"]


@pytest.mark.vllm
def test_an_engine_started_with_other_graph_settings_compiles_its_own_graph(vllm_python, engine_env, tmp_path):
    # vLLM keys its compiled graphs (torch_compile_cache, AOT artifacts) by its config and environment, not by
    # ours: before the adapter folded SK_FUSED_MLP and SK_ATTENTION_LINEAR into VllmConfig.compute_hash, an
    # engine started without the routed projections after one with them loaded that one's graph and ran
    # sk.ops.linear (H100, results/h100/engines/README.md, 2026-12-06; here the stale artifact happened to fail
    # to load, and vLLM compiled again into the same key). Same cache, routed engine first: two keys.
    def run(variant: str) -> dict:
        work = tmp_path / variant
        env = {**engine_env, **VARIANTS[variant], "SK_REPORT_DIR": str(work / "reports"),
               "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
        done = subprocess.run([vllm_python, __file__, "--style", "llama", "--mode", "compiled",
                               "--out", str(work / "tokens.json")], env=env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-6000:]
        (worker,) = model_process_reports(read_reports(work / "reports"))
        return worker

    def linear_calls(worker: dict) -> int:
        coverage = worker["coverage"]
        return coverage["kernel_calls"].get("linear", 0) + sum(
            f["count"] for f in coverage["fallbacks"] if f["op"] == "linear")
    assert linear_calls(run("sk-linear")) > 0
    plain = run("sk-torch")
    assert plain["fused_blocks"]["projections"]["routed"] == 0 and linear_calls(plain) == 0, plain["coverage"]
    keys = [d.name for d in (tmp_path / "vllm-cache" / "torch_compile_cache" / "torch_aot_compile").iterdir()]
    assert len(keys) == 2, keys


@pytest.fixture(scope="module")
def zeroed_llama(tmp_path_factory) -> str:
    """The trained llama-style model with every post-attention norm weight zero (its MLPs then add nothing): new
    weights for an in-place reload, which change the greedy tokens."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    import sk.models

    target = tmp_path_factory.mktemp("zeroed-llama")
    shutil.copytree(sk.models.trained_model("llama"), target, dirs_exist_ok=True)
    for f in target.glob("*.safetensors"):
        tensors = {k: torch.zeros_like(v) if "post_attention_layernorm" in k else v for k, v in load_file(f).items()}
        save_file(tensors, f, metadata={"format": "pt"})
    return str(target)


@pytest.mark.vllm
def test_weights_reloaded_in_place_are_the_ones_the_fused_blocks_compute_with(engine_run, zeroed_llama):
    # vLLM's reload_weights writes new weights into the loaded model (its weight loaders, through .data); the
    # kernels (interpreted) read the Parameters themselves: after the reload the engine answers as an engine
    # started on the new weights does.
    reloaded = engine_run("llama", "eager", "sk-triton", "--reload-from", zeroed_llama)
    fresh = engine_run("llama", "eager", "sk-triton", "--model-dir", zeroed_llama)
    assert reloaded["tokens"] == engine_run("llama", "eager", "stock")["tokens"]  # before the reload
    assert reloaded["reloaded"] != reloaded["tokens"] and reloaded["reloaded"] == fresh["tokens"]
    (worker,) = worker_reports(reloaded)
    assert worker["fused_blocks"]["weights_prepared"] == {}, worker["fused_blocks"]


@pytest.mark.vllm
def test_stock_run_replaces_nothing(engine_run):
    stock = engine_run("llama", "eager", "stock")
    assert stock["reports"] == []  # the plugin is installed but not switched on: no process activated it


# ------------------------------------------------------------------------------------------------ the driver

def generate(style: str, mode: str, enable_lora: bool = False, model_dir: str | None = None,
             reload_from: str | None = None) -> dict:
    from vllm import LLM, SamplingParams

    import sk.models
    from sk.adapters.vllm import report as adapter_report

    model = model_dir or sk.models.trained_model(style)
    ask_workers = bool(os.environ.get("SK_ADAPTERS"))
    if ask_workers:
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc ships a function (pickled)
    lora = {"enable_lora": True, "max_loras": 1, "max_lora_rank": 8} if enable_lora else {}
    llm = LLM(str(model), dtype="float32", enforce_eager=mode == "eager", seed=0, max_model_len=512,
              kv_cache_memory_bytes=256 << 20, **lora)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(PROMPTS, greedy)
    # The adapter's report, asked of each worker while the engine runs (the at-exit files come later).
    on_request = llm.collective_rpc(adapter_report) if ask_workers else []
    result = {"tokens": [list(o.outputs[0].token_ids) for o in outputs], "on_request": on_request}
    if reload_from:  # vLLM's in-place reload from another checkpoint of the same model
        llm.collective_rpc("reload_weights", kwargs={"weights_path": reload_from})
        result["reloaded"] = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy)]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Generate greedily with vLLM on a trained model; write the tokens.")
    parser.add_argument("--style", choices=STYLES, required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--enable-lora", action="store_true", help="vLLM's LoRA support on (no adapter loaded)")
    parser.add_argument("--model-dir", help="this checkpoint instead of the style's trained model")
    parser.add_argument("--reload-from", help="after generating, reload the weights in place from this checkpoint "
                                              "and generate again")
    cli = parser.parse_args()
    Path(cli.out).write_text(json.dumps(generate(cli.style, cli.mode, cli.enable_lora, cli.model_dir,
                                                 cli.reload_from)))
