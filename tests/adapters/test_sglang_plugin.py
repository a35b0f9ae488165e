"""The SGLang adapter at the layer level, in SGLang 0.5.17's own venv (ci/envs/sglang.sh): SGLang's engine needs
a GPU (or an AMX CPU with a CPU build of sgl-kernel), so the in-engine checks run on the H200
(ci/gpu/sglang_check.py); here SGLang's real layer classes are built and called.

Each scenario is one driver run of this file in the SGLang venv. The driver stands for a user's script: it
imports sk.adapters.sglang (or not), then spawns a fresh child, as SGLang spawns its schedulers; the child loads
plugins through SGLang's own `load_plugins()` (entry points), builds the layers, runs the checks and sends back
a verdict per check and its adapter report:
  - stock: installed but not switched on, nothing changes and the adapter is not even imported;
  - torch / triton: switched on, the four classes run our ops (through the PyTorch references, and under
    TRITON_INTERPRET=1 through the real Triton kernels), matching SGLang's own forward_native, in place where
    SGLang's CUDA path is, traceable by Dynamo with fullgraph=True;
  - refused: an unknown SGLang version or layout is refused with a message naming it; strict mode exits;
  - layers-off: with SK_NORM_ACT_LAYERS=0 the four classes stay SGLang's and the fused blocks are still ours.
"""
import argparse
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYER_CLASSES = {"RMSNorm", "GemmaRMSNorm", "SiluAndMul", "GeluAndMul"}
# What the report's `replaced` lists: those, and the decoder layers' fused blocks (test_sglang_fused_blocks.py).
REPLACED = LAYER_CLASSES | {"decoder layers (norm + MLP)"}
# sk.coverage op names the layer checks exercise.
OPS = ("rms_norm", "fused_add_rms_norm", "gemma_rms_norm", "gemma_fused_add_rms_norm", "silu_and_mul",
       "gelu_and_mul")
SCENARIOS = {  # name -> (driver activates the adapter, extra environment)
    "stock": (False, {}),
    "torch": (True, {}),
    "triton": (True, {"TRITON_INTERPRET": "1"}),
    "refused": (True, {}),
    "layers-off": (True, {"SK_NORM_ACT_LAYERS": "0"}),
}
ACTIVE_CHECKS = ("plugin_loaded_through_entry_points", "forwards_are_hooked", "outputs_match_sglang_native",
                 "cuda_path_works_in_place", "unsupported_config_runs_sglang", "compiles_whole_graph",
                 "report_reaches_scheduler_state", "qwen3_layer_communicator_takes_the_fused_block",
                 "gemma3_layer_takes_the_fused_block")
REFUSED_CHECKS = ("unknown_version_left_stock_by_load_plugins", "unknown_layout_refused", "strict_refusal_exits")
LAYERS_OFF_CHECKS = ("norm_act_layers_stay_sglangs", "qwen3_layer_communicator_takes_the_fused_block")
RUN_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """Python of the SGLang venv (built by ci/envs/sglang.sh on first use), or $SK_SGLANG_PYTHON; else skip."""
    if os.environ.get("SK_SGLANG_PYTHON"):
        return os.environ["SK_SGLANG_PYTHON"]
    done = subprocess.run(["bash", str(REPO / "ci/envs/sglang.sh")], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"the SGLang venv could not be built (ci/envs/sglang.sh):\n{done.stderr[-2000:]}")
    return str(Path(done.stdout.strip().splitlines()[-1]) / "bin" / "python")


_runs: dict[str, dict] = {}


def scenario(python: str, env: dict, name: str, tmp_root: Path) -> dict:
    """The child's verdicts and report for one scenario (run once per session, then reused)."""
    if name not in _runs:
        report_dir = tmp_root / f"sglang-{name}-reports"
        run_env = {**env, **SCENARIOS[name][1], "SK_REPORT_DIR": str(report_dir)}
        done = subprocess.run([python, __file__, name], env=run_env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)
        if done.returncode:
            pytest.fail(f"SGLang scenario {name!r} failed (rc {done.returncode}):\n{done.stderr[-6000:]}")
        _runs[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return _runs[name]


@pytest.fixture
def run(sglang_python, engine_env, tmp_path_factory):
    root = tmp_path_factory.getbasetemp()
    return lambda name: scenario(sglang_python, engine_env, name, root)


@pytest.mark.sglang
def test_stock_sglang_is_untouched(run):
    result = run("stock")
    assert result["checks"] == {"left_stock": "ok"}, result["checks"]


@pytest.mark.sglang
@pytest.mark.parametrize("variant", ["torch", "triton"])
@pytest.mark.parametrize("check", ACTIVE_CHECKS)
def test_active_adapter(run, variant, check):
    assert run(variant)["checks"][check] == "ok"


@pytest.mark.sglang
def test_child_report_counts_our_ops(run):
    # Through the references every call is a recorded fallback (CPU tensor); interpreted, every call of a
    # supported configuration is a kernel call. The one delegated configuration is recorded as such.
    torch_report, triton_report = run("torch")["report"], run("triton")["report"]
    for report in (torch_report, triton_report):
        assert report["engine"] == "sglang" and report["active"] and report["sglang"] == "SGLang 0.5.17"
        assert set(report["replaced"]) == REPLACED
    torch_fallbacks = {}
    for f in torch_report["coverage"]["fallbacks"]:
        torch_fallbacks[f["op"]] = torch_fallbacks.get(f["op"], 0) + f["count"]
    for op in OPS:
        assert torch_fallbacks.get(op, 0) > 0, (op, torch_report["coverage"])
        assert triton_report["coverage"]["kernel_calls"].get(op, 0) > 0, (op, triton_report["coverage"])
    reasons = {f["reason"] for f in triton_report["coverage"]["fallbacks"] if not f["op"].startswith("fused_gated")}
    assert reasons == {"SGLang's own forward ran: variance over part of the hidden size (var_hidden_size)"}, reasons
    # The Qwen3 check's fused block: fp32 here, which the interpreter runs through the kernels (the coverage
    # table's interpreted_precisions); through the references, its recorded fallback.
    assert not [f for f in triton_report["coverage"]["fallbacks"] if f["op"].startswith("fused_gated")]
    assert triton_report["coverage"]["kernel_calls"].get("fused_gated_mlp/rms", 0) > 0, triton_report["coverage"]
    assert torch_fallbacks.get("fused_gated_mlp/rms", 0) > 0, torch_report["coverage"]


@pytest.mark.sglang
@pytest.mark.parametrize("check", LAYERS_OFF_CHECKS)
def test_norm_act_layers_off_keeps_the_fused_blocks(run, check):
    assert run("layers-off")["checks"][check] == "ok"


@pytest.mark.sglang
@pytest.mark.parametrize("check", REFUSED_CHECKS)
def test_unknown_sglang_is_refused(run, check):
    assert run("refused")["checks"][check] == "ok"


# ------------------------------------------------------------------------------- child checks (SGLang venv)

def _publish_runtime_context() -> None:
    # SGLang's layers read process-wide config (SiluAndMul: get_exec()); the scheduler publishes it in the engine.
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    import sk.models

    runtime_context.publish(ServerArgs(model_path=str(sk.models.tiny_model()), device="cpu"), role="test")


_generator = None  # the child's seeded generator, set in child_main


def _inputs(*shape):
    import torch

    return torch.randn(*shape, generator=_generator)


def _layers() -> dict:
    import torch
    from sglang.srt.layers.activation import GeluAndMul, SiluAndMul
    from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm

    layers = {"RMSNorm": RMSNorm(64, eps=1e-6), "GemmaRMSNorm": GemmaRMSNorm(64, eps=1e-6),
              "SiluAndMul": SiluAndMul(), "GeluAndMul": GeluAndMul(), "GeluAndMul-none": GeluAndMul("none")}
    with torch.no_grad():
        layers["RMSNorm"].weight.copy_(1 + 0.1 * _inputs(64))
        layers["GemmaRMSNorm"].weight.copy_(0.1 * _inputs(64))
    return layers


def plugin_loaded_through_entry_points():
    from importlib.metadata import entry_points

    import sk.adapters.sglang as adapter

    (ep,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "standardkernels"]
    assert ep.value == "sk.adapters.sglang_plugin:register", ep.value
    assert adapter._registration is not None and set(adapter._registration["replaced"]) == REPLACED


def forwards_are_hooked():
    for name, layer in _layers().items():
        cls = type(layer)
        for method in ("forward_cuda", "forward_native"):
            assert hasattr(getattr(cls, method), "__wrapped__"), f"{name}.{method} is stock"
        # On a CPU without AMX SGLang binds forward_native at construction: it must be the hooked one.
        assert layer._forward_method.__func__ is cls.forward_native, name


def outputs_match_sglang_native():
    import torch

    layers = _layers()
    x, res, post = _inputs(5, 64), _inputs(5, 64), _inputs(5, 64)
    gate_up = _inputs(3, 7, 96)
    for name in ("RMSNorm", "GemmaRMSNorm"):
        layer, native = layers[name], type(layers[name]).forward_native.__wrapped__
        for args in ((x,), (x, res), (x, res, post)):
            expected = native(layer, *[a.clone() for a in args])
            for forward in (layer.forward_native, layer.forward_cuda, layer):
                torch.testing.assert_close(forward(*[a.clone() for a in args]), expected, msg=f"{name} {forward}")
    for name in ("SiluAndMul", "GeluAndMul", "GeluAndMul-none"):
        layer, native = layers[name], type(layers[name]).forward_native.__wrapped__
        for forward in (layer.forward_native, layer.forward_cuda, layer):
            torch.testing.assert_close(forward(gate_up), native(layer, gate_up), msg=name)


def cuda_path_works_in_place():
    # As SGLang's CUDA kernels: x becomes the norm, residual the sum; with post_residual_addition the caller's
    # residual stays and a new one comes back. forward_native, like SGLang's, leaves its inputs alone.
    import torch

    for name in ("RMSNorm", "GemmaRMSNorm"):
        layer = _layers()[name]
        x, res, post = _inputs(4, 64), _inputs(4, 64), _inputs(4, 64)
        x_in, res_in = x.clone(), res.clone()
        out, res_out = layer.forward_cuda(x_in, res_in)
        assert out is x_in and res_out is res_in, name
        torch.testing.assert_close(res_out, x + res)
        x_in, res_in = x.clone(), res.clone()
        out, res_out = layer.forward_cuda(x_in, res_in, post)
        assert out is x_in and res_out is not res_in and torch.equal(res_in, res), name
        torch.testing.assert_close(res_out, x + res + post)
        x_in, res_in = x.clone(), res.clone()
        layer.forward_native(x_in, res_in, post)
        assert torch.equal(x_in, x) and torch.equal(res_in, res), name


def unsupported_config_runs_sglang():
    import torch
    from sglang.srt.layers.layernorm import RMSNorm

    import sk

    layer = RMSNorm(64, eps=1e-6, var_hidden_size=32)
    x = _inputs(3, 64)
    before = sk.coverage.report()["kernel_calls"].get("rms_norm", 0)
    torch.testing.assert_close(layer(x), RMSNorm.forward_native.__wrapped__(layer, x))
    assert sk.coverage.report()["kernel_calls"].get("rms_norm", 0) == before
    reasons = [f["reason"] for f in sk.coverage.report()["fallbacks"] if "var_hidden_size" in f["reason"]]
    assert reasons, sk.coverage.report()["fallbacks"]


def compiles_whole_graph():
    # fullgraph=True fails on any graph break: the hooks must be traceable as SGLang's piecewise graphs need.
    import torch

    layers = _layers()
    norm, gemma, act = layers["RMSNorm"], layers["GemmaRMSNorm"], layers["SiluAndMul"]

    def block(x, res, gate_up):
        h, res = norm.forward_cuda(x, res)  # in place, as on CUDA
        h, res = gemma.forward_native(h, res)  # functional, as under SGLang's torch.compile mode
        return h * act.forward_cuda(gate_up)[..., :64], res

    x, res, gate_up = _inputs(4, 64), _inputs(4, 64), _inputs(4, 256)
    expected = block(x.clone(), res.clone(), gate_up)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x.clone(), res.clone(), gate_up), expected)


def report_reaches_scheduler_state():
    from sglang.srt.managers.scheduler import Scheduler

    import sk.adapters.sglang as adapter

    assert hasattr(Scheduler.get_internal_state, "__wrapped__"), "Scheduler.get_internal_state is not hooked"
    state = {}
    adapter.report_to_caller(state)
    written = Path(os.environ["SK_REPORT_DIR"], f"sglang-{os.getpid()}.json")
    assert json.loads(written.read_text())["replaced"] == state[adapter.REPORT_KEY]["replaced"]


def _one_rank() -> None:
    """SGLang's process groups for one rank (gloo), once per child: its parallel linears need them."""
    import socket

    import torch
    import sglang.srt.layers.dp_attention as dp_attention
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel

    if torch.distributed.is_initialized():
        return
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel(1, 1)
    dp_attention._ATTN_DP_SIZE, dp_attention._ATTN_DP_RANK = 1, 0  # what initialize_dp_attention sets without DP


def gemma3_layer_takes_the_fused_block():
    # SGLang's Gemma-3 layer norms with its own Gemma3RMSNorm (x·rstd·(1 + w), the weight named `eps` beside it),
    # before Gemma3MLP (tanh GELU): the MLP half, pre-feed-forward norm to MLP output, returns what it did stock.
    import torch
    from sglang.srt.layers.layernorm import Gemma3RMSNorm
    from sglang.srt.models.gemma3_causal import Gemma3DecoderLayer, Gemma3MLP

    from sk.adapters.fused_blocks import FusedBlocks
    from sk.adapters.sglang import fused_blocks

    _one_rank()
    layer = Gemma3DecoderLayer.__new__(Gemma3DecoderLayer)
    torch.nn.Module.__init__(layer)
    layer.pre_feedforward_layernorm = Gemma3RMSNorm(64, eps=1e-6)
    layer.mlp = Gemma3MLP(64, 96, "gelu_pytorch_tanh")
    with torch.no_grad():
        layer.pre_feedforward_layernorm.weight.copy_(0.1 * _inputs(64))
        layer.mlp.gate_up_proj.weight.copy_(_inputs(192, 64) / 8)
        layer.mlp.down_proj.weight.copy_(_inputs(64, 96) / 10)
    x, residual = _inputs(5, 64), _inputs(5, 64)

    def mlp_half():  # Gemma3DecoderLayer.forward after the attention
        hidden, res = layer.pre_feedforward_layernorm(x.clone(), residual.clone())
        return layer.mlp(hidden), res

    want = mlp_half()
    blocks = fused_blocks.fuse_layer(layer, "pre_feedforward_layernorm", "model.layers.0", blocks=FusedBlocks(),
                                     all_reduce=lambda t: t)
    assert blocks.fused == {"model.layers.0": "Gemma3DecoderLayer: pre_feedforward_layernorm + mlp, "
                                              "norm=gemma_rms, activation=gelu_tanh"}, blocks.report()
    assert layer.pre_feedforward_layernorm.variance_epsilon == 1e-6
    for g, w in zip(mlp_half(), want):
        torch.testing.assert_close(g, w)


def qwen3_layer_communicator_takes_the_fused_block():
    # SGLang's real LayerCommunicator at one attention rank calls the stand-in the swap gives it, and passes the
    # pair on: the MLP half of a Qwen3 layer (communicator, norm, Qwen2MLP as SGLang builds them) returns what it
    # returned stock. The layer's attention is not built (SGLang's CPU rotary needs vLLM's kernels).
    import torch
    from sglang.srt.layers.communicator import LayerCommunicator, LayerScatterModes
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.models.qwen2 import Qwen2MLP
    from sglang.srt.models.qwen3 import Qwen3DecoderLayer

    from sk.adapters.fused_blocks import FusedBlocks
    from sk.adapters.sglang import fused_blocks

    _one_rank()
    layer = Qwen3DecoderLayer.__new__(Qwen3DecoderLayer)
    torch.nn.Module.__init__(layer)
    layer.input_layernorm, layer.post_attention_layernorm = RMSNorm(64, eps=1e-6), RMSNorm(64, eps=1e-6)
    layer.mlp = Qwen2MLP(64, 96, "silu")
    with torch.no_grad():
        layer.post_attention_layernorm.weight.copy_(1 + 0.1 * _inputs(64))
        layer.mlp.gate_up_proj.weight.copy_(_inputs(192, 64) / 8)
        layer.mlp.down_proj.weight.copy_(_inputs(64, 96) / 10)
    modes = LayerScatterModes.init_new(layer_id=0, num_layers=1, is_layer_sparse=False,
                                       is_previous_layer_sparse=False, is_next_layer_sparse=False)
    layer.layer_communicator = LayerCommunicator(layer_scatter_modes=modes, input_layernorm=layer.input_layernorm,
                                                 post_attention_layernorm=layer.post_attention_layernorm)
    x, residual = _inputs(5, 64), _inputs(5, 64)

    def mlp_half():  # Qwen3DecoderLayer.forward after the attention
        hidden, res = layer.layer_communicator.prepare_mlp(x.clone(), residual.clone(), None)
        hidden = layer.mlp(hidden, forward_batch=None)
        return layer.layer_communicator.postprocess_layer(hidden, res, None)

    want = mlp_half()
    blocks = fused_blocks.fuse_layer(layer, "post_attention_layernorm", "model.layers.0", blocks=FusedBlocks(),
                                     all_reduce=lambda t: t)
    assert list(blocks.fused) == ["model.layers.0"] and not blocks.engine_path, blocks.report()
    assert layer.layer_communicator.post_attention_layernorm is layer.post_attention_layernorm
    got = mlp_half()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    # SGLang's weight loader v2 asks the MLP to load its own weights (gate_proj and up_proj merged): the
    # stand-in keeps Qwen2MLP's load_weights, on the same parameters.
    gate, up = _inputs(96, 64) / 8, _inputs(96, 64) / 8
    assert layer.mlp.load_weights([("gate_proj.weight", gate), ("up_proj.weight", up)]) == {"gate_up_proj.weight"}
    torch.testing.assert_close(layer.mlp.gate_up_proj.weight, torch.cat([gate, up]))


def _assert_layers_stock():
    from sglang.srt.layers.activation import GeluAndMul, SiluAndMul
    from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm

    for cls in (RMSNorm, GemmaRMSNorm, SiluAndMul, GeluAndMul):
        for method in ("forward_cuda", "forward_native"):
            assert not hasattr(getattr(cls, method), "__wrapped__"), f"{cls.__name__}.{method} was hooked"


def norm_act_layers_stay_sglangs():
    import sk.adapters.sglang as adapter

    _assert_layers_stock()
    assert set(adapter._registration["replaced"]) == REPLACED - LAYER_CLASSES, adapter._registration


def left_stock():
    assert "sk.adapters.sglang" not in sys.modules, "the inactive entry point imported the adapter"
    _assert_layers_stock()


def unknown_version_left_stock_by_load_plugins():
    # Run before load_plugins() in this child: SGLang logs a plugin's exception and goes on, stock.
    import sglang

    import sk.adapters.sglang as adapter

    real = sglang.__version__
    sglang.__version__ = "0.6.0"
    try:
        from sglang.srt.plugins import load_plugins

        load_plugins()
    finally:
        sglang.__version__ = real
    _assert_layers_stock()
    refused = adapter.report()["refused"]
    assert "SGLang 0.6.0" in refused and "SGLang 0.5.17" in refused, refused


def unknown_layout_refused():
    from sglang.srt.layers.layernorm import RMSNorm

    import sk.adapters.sglang as adapter
    from sk.adapters.sglang.support import UnsupportedSglangError

    def forward_cuda(self, x, residual=None):
        raise AssertionError("not to be called")

    real = RMSNorm.__dict__["forward_cuda"]
    RMSNorm.forward_cuda = forward_cuda
    adapter._registration = None
    try:
        adapter.register()
    except UnsupportedSglangError as e:
        assert "SGLang 0.5.17 does not have the structure" in str(e) and "RMSNorm.forward_cuda" in str(e), str(e)
    else:
        raise AssertionError("an unknown SGLang layout was accepted")
    finally:
        RMSNorm.forward_cuda = real


def strict_refusal_exits():
    import sglang

    import sk
    import sk.adapters.sglang as adapter

    real = sglang.__version__
    sglang.__version__ = "0.6.0"
    adapter._registration = None
    try:
        with sk.coverage.strict():
            adapter.register()
    except SystemExit as e:
        assert "SK_STRICT=1" in str(e) and "SGLang 0.6.0" in str(e), str(e)
    else:
        raise AssertionError("strict mode let a refused SGLang run stock")
    finally:
        sglang.__version__ = real


def child_main(name: str, results) -> None:
    """In the spawned child: load plugins as SGLang does, run the scenario's checks, send back verdicts."""
    import torch

    import sk

    global _generator
    _generator = torch.Generator().manual_seed(0)
    checks = {"stock": ("left_stock",), "torch": ACTIVE_CHECKS, "triton": ACTIVE_CHECKS,
              "refused": REFUSED_CHECKS, "layers-off": LAYERS_OFF_CHECKS}[name]
    verdicts = {}
    if name != "refused":
        from sglang.srt.plugins import load_plugins

        load_plugins()
    _publish_runtime_context()
    sk.coverage.reset()
    for check in checks:
        try:
            globals()[check]()
            verdicts[check] = "ok"
        except BaseException as e:  # reported per check to the test process
            verdicts[check] = f"{type(e).__name__}: {e}"
    adapter = sys.modules.get("sk.adapters.sglang")
    results.put({"checks": verdicts, "report": adapter.report() if adapter and name != "stock" else None})


if __name__ == "__main__":
    from queue import Empty

    parser = argparse.ArgumentParser(description="One SGLang adapter scenario: a spawned child's verdicts as JSON.")
    parser.add_argument("scenario", choices=list(SCENARIOS))
    cli = parser.parse_args()
    if SCENARIOS[cli.scenario][0]:
        import sk.adapters.sglang  # noqa: F401  (the user's switch; the child inherits it)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=child_main, args=(cli.scenario, queue))
    child.start()
    # A child that dies before sending its verdicts ends the run now, with its exit code, not after the timeout.
    result, waited = None, 0
    while result is None and waited < RUN_TIMEOUT_S:
        try:
            result = queue.get(timeout=5)
        except Empty:
            waited += 5
            if not child.is_alive():
                sys.exit(f"the scenario's child exited with code {child.exitcode} before sending its verdicts")
    if result is None:
        child.kill()
        sys.exit(f"the scenario's child sent no verdicts in {RUN_TIMEOUT_S} s")
    child.join()
    print(json.dumps(result))
