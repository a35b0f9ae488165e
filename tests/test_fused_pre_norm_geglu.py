"""fused_pre_norm_geglu: the kernels against fp64 math (Triton's interpreter on CPU in fp32/fp16; bf16 on the
GPU, where the real shapes run too), forward and backward; the custom op (fake impl, autograd, opcheck,
torch.compile); argument errors; the coverage behaviour (fallback, strict, autocast)."""
import copy
import dataclasses
import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import sk
from numerics import KERNEL_DEVICE, rel_err

geglu = importlib.import_module("sk.ops.gated_mlp.geglu")
gk = importlib.import_module("sk.ops.gated_mlp.geglu_kernels")
INTERPRETED_CPU = KERNEL_DEVICE == "cpu" and sk.settings.get("triton_interpret")
needs_interpreter = pytest.mark.skipif(not INTERPRETED_CPU, reason="needs TRITON_INTERPRET=1 on a CPU-only machine")
EPS = 1e-5
NAMES = ("ln_weight", "ln_bias", "gate_weight", "gate_bias", "up_weight", "up_bias", "down_weight", "down_bias")

# Tolerances on the relative norm error against fp64 math on the same (rounded) inputs and weights:
#   fp32: every product exact-ish, sums in fp32 over ≤ a few thousand terms: far under 1e-5;
#   fp16: the normalized activation, h and y are each rounded once to fp16 (u = 4.9e-4, ~u/√3 each in norm):
#         2e-3 = 4u;
#   bf16 forward: the same three roundings with u = 3.9e-3: 1e-2 (eager bf16 rounds more often and lands
#         near 3e-3); bf16 gradients pass through 3-4 bf16 roundings (dh, d[g|u], dxn and the GEMM outputs),
#         as eager autocast's do: 2e-2. On the GPU each error must also be within 2x eager bf16's own + 1e-3.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
GRAD_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def make_params(d, ff, *, device=KERNEL_DEVICE, dtype=torch.float32, bias=True, seed=0):
    """A trained-looking block: LayerNorm scale near 1 with a shift, weights scaled like nn.Linear's init."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(device, dtype)
    return [1 + rnd(d, scale=0.2), rnd(d, scale=0.1) if bias else None,
            rnd(ff, d, scale=d**-0.5), rnd(ff, scale=0.1) if bias else None,
            rnd(ff, d, scale=d**-0.5), rnd(ff, scale=0.1) if bias else None,
            rnd(d, ff, scale=ff**-0.5), rnd(d, scale=0.1) if bias else None]


def make_x(m, d, dtype, device=KERNEL_DEVICE, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, d, generator=gen) + 0.3).to(device, dtype)  # a non-zero mean, as real activations


def fp64_block(x, ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps=EPS, approximate="none"):
    """The seed page's block in fp64 (torch.nn.functional), independent of the op's own reference."""
    def f64(t):
        return None if t is None else t.double()
    x = f64(x)
    h = F.layer_norm(x, (x.shape[-1],), f64(ln_w), f64(ln_b), eps)
    gated = F.gelu(F.linear(h, f64(wg), f64(bg)), approximate=approximate) * F.linear(h, f64(wu), f64(bu))
    return x + F.linear(gated, f64(wd), f64(bd))


def grads_of(fn, x, params, dy):
    leaves = [x.detach().requires_grad_()] + [p.detach().requires_grad_() if p is not None else None for p in params]
    fn(leaves[0], *leaves[1:]).backward(dy)
    return [t.grad if t is not None else None for t in leaves]


# ----------------------------------------------------------------------------------------------- interpreter (CPU)

SMALL = gk.GemmConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every buffer the op allocates starts as NaN, so an element a kernel fails to write shows up."""
    for name in ("empty", "empty_like"):
        allocate = getattr(torch, name)

        def poisoned(*args, allocate=allocate, **kwargs):
            t = allocate(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t
        monkeypatch.setattr(torch, name, poisoned)


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m,d,ff,split_k", [(1, 48, 200, 1), (7, 40, 72, 1), (33, 64, 48, 4), (20, 72, 104, 2)])
@pytest.mark.parametrize("bias,approximate", [(True, "none"), (False, "tanh")])
@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("launch", [{}, {"swap_ab": True}, {"programs_per_sm": 1, "tma_store": True, "group_m": 2}],
                         ids=["plain", "swap", "persistent"])
def test_interpreted_kernels_match_fp64(dtype, m, d, ff, split_k, bias, approximate, fold, launch, poisoned_outputs):
    """fold: inference's path (γ folded into the gate/up weights, the statistics summed in the gate/up kernel);
    else training's (a statistics pass that also stores the normalized activation, normalized in the prologue,
    pre-activations stored). swap: the products computed transposed (decode's configs; the gate/up kernel
    only with fold). persistent: gate/up programs walking several tiles each (two programs in the interpreter)
    and storing h by TMA; both kernels' row tiles grouped by two (M = 33: a last group of one)."""
    params = make_params(d, ff, bias=bias, seed=m + d)
    for i in (2, 4, 6):  # the projections compute in the activation dtype; the oracle sees the same values
        params[i] = params[i].to(dtype)
    x = make_x(m, d, dtype)
    tile = dataclasses.replace(SMALL, **launch)
    configs = (tile.fitted(m, ff, d), dataclasses.replace(tile.fitted(m, d, ff), split_k=split_k))
    args = list(params)
    folded = geglu.fold_gate_up(*params[:6], dtype) if fold else None
    if fold:  # a rounding of γ⊙W instead of the normalized activation's: the same tolerances hold
        args[2], args[4] = folded[0], None
    y, stats, xn, gu = gk.forward_kernels(x, *args, EPS, approximate, not fold, configs,
                                              fold=folded[1] if fold else None)
    assert y.dtype == dtype and y.shape == (m, d)
    assert rel_err(y, fp64_block(x, *params, approximate=approximate)) < TOL[dtype]
    x64 = x.double()
    assert rel_err(stats[0], x64.mean(-1)) < 1e-6
    assert rel_err(stats[1], torch.rsqrt(x64.var(-1, unbiased=False) + EPS)) < 1e-6
    if fold:
        return
    xn64 = F.layer_norm(x64, (d,), params[0].double(), None if params[1] is None else params[1].double(), EPS)
    assert rel_err(xn, xn64) < TOL[dtype]
    # gu holds the pre-activations computed from the rounded normalized activation: compare against that.
    gu64 = F.linear(xn.double(), torch.cat([params[2], params[4]]).double(),
                    None if not bias else torch.cat([params[3], params[5]]).double())
    assert rel_err(gu, gu64) < TOL[dtype]


@needs_interpreter
@pytest.mark.parametrize("approximate,gemms", [("none", "triton"), ("tanh", "triton"), ("tanh", "cublas")])
def test_interpreted_forward_and_backward_through_the_op(approximate, gemms, poisoned_outputs, settings_override):
    """fp16 is in the coverage table, so on CPU under the interpreter the public op runs every kernel; `cublas`:
    the training forward of large shapes (our LayerNorm and GEGLU kernels around torch's products)."""
    settings_override(geglu_train_gemms=gemms, step_graphs=False)
    m, d, ff = 9, 40, 56
    params = make_params(d, ff)
    x = make_x(m, d, torch.float16)
    dy = make_x(m, d, torch.float16, seed=5)

    def ours(x, *p):
        return sk.ops.fused_pre_norm_geglu(x, *p, EPS, approximate)
    with sk.coverage.strict():
        y = ours(x, *params)
        got = grads_of(ours, x, params, dy)
    assert rel_err(y, fp64_block(x, *params, approximate=approximate)) < TOL[torch.float16]
    want = grads_of(lambda x, *p: fp64_block(x, *p, approximate=approximate), x, params, dy)
    for name, g, w in zip(("x",) + NAMES, got, want):
        assert g.dtype == (torch.float16 if name == "x" else torch.float32), name
        assert rel_err(g, w) < GRAD_TOL[torch.float16], name
    assert sk.coverage.report()["kernel_calls"][geglu.OP] == 3  # forward twice, backward once


@needs_interpreter
@pytest.mark.parametrize("gemms", ["triton", "cublas"])
def test_interpreted_backward_of_a_sum_reads_the_expanded_gradient_densely(gemms, settings_override):
    """`y.sum().backward()` hands the backward an expanded dy (all strides 0): it is made dense before the
    kernels and cuBLAS read it as rows."""
    settings_override(geglu_train_gemms=gemms, step_graphs=False)
    m, d, ff = 5, 24, 40
    params = make_params(d, ff)
    x = make_x(m, d, torch.float16)
    got = grads_of(lambda x, *p: sk.ops.fused_pre_norm_geglu(x, *p, EPS).sum(), x, params, None)
    want = grads_of(lambda x, *p: fp64_block(x, *p).sum(), x, params, None)
    for name, g, w in zip(("x",) + NAMES, got, want):
        assert rel_err(g, w) < GRAD_TOL[torch.float16], name


@needs_interpreter
def test_interpreted_inference_statistics_with_a_large_mean():
    """Inference with mean/std = 1000: the statistics pass stays exact (two passes), the folded GEMM's error
    grows with mean/std (see `geglu.folded_gate_up`): here about 1e-4 on fp32."""
    m, d, ff = 7, 40, 56
    params = make_params(d, ff)
    x = make_x(m, d, torch.float32) + 1000.0
    w_gate_up, fold = geglu.fold_gate_up(*params[:6], torch.float32)
    y, stats, _, _ = gk.forward_kernels(x, params[0], params[1], w_gate_up, params[3], None, params[5], params[6],
                                            params[7], EPS, "none", False, (SMALL, SMALL), fold=fold)
    x64 = x.double()
    assert rel_err(stats[0], x64.mean(-1)) < 1e-7
    assert rel_err(stats[1], torch.rsqrt(x64.var(-1, unbiased=False) + EPS)) < 1e-5
    assert rel_err(y - x, fp64_block(x, *params) - x64) < 1e-3  # the block's output, without the residual


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m,d,programs", [(1, 48, 256), (7, 40, 256), (1000, 40, 4), (37, 1000, 8)])
def test_interpreted_layer_norm_backward_matches_fp64(dtype, m, d, programs, monkeypatch, poisoned_outputs):
    """dx (with the residual's dy), the LayerNorm weight and bias grads and the down bias grad (the sum of dy);
    few programs make each loop over several row blocks, as large M does on the GPU."""
    monkeypatch.setattr(gk, "LN_BACKWARD_PROGRAMS", programs)
    gen = torch.Generator().manual_seed(m)
    x, dxn, dy = ((torch.randn(m, d, generator=gen) + 0.3).to(dtype) for _ in range(3))
    ln_w = 1 + 0.2 * torch.randn(d, generator=gen)
    x64 = x.double()
    mean, var = x64.mean(-1), x64.var(-1, unbiased=False)
    stats = torch.stack([mean, torch.rsqrt(var + EPS)]).float()
    with sk.coverage.strict():
        dx, d_ln = geglu.ln_backward(dxn, x, dy, stats, ln_w, 64)
    leaf = x64.clone().requires_grad_()
    w64, b64 = ln_w.double().requires_grad_(), torch.zeros(d, dtype=torch.float64, requires_grad=True)
    F.layer_norm(leaf, (d,), w64, b64, EPS).backward(dxn.double())
    assert dx.dtype == dtype and d_ln.dtype == torch.float32
    assert rel_err(dx, leaf.grad + dy.double()) < TOL[dtype]
    assert rel_err(d_ln[0], w64.grad) < 1e-5 and rel_err(d_ln[1], b64.grad) < 1e-5
    assert rel_err(d_ln[2], dy.double().sum(0)) < 1e-5


@needs_interpreter
def test_interpreted_compiled_and_eager_paths_agree(poisoned_outputs):
    """Eager calls skip the custom op (an autograd.Function launches the kernels); torch.compile traces the
    custom op, whose backward ops run the same kernels: both must give the same values and gradients."""
    m, d, ff = 9, 40, 56
    params = make_params(d, ff)
    x = make_x(m, d, torch.float16)
    dy = make_x(m, d, torch.float16, seed=5)

    def ours(x, *p):
        return sk.ops.fused_pre_norm_geglu(x, *p, EPS)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    with sk.coverage.strict():
        eager, traced = grads_of(ours, x, params, dy), grads_of(compiled, x, params, dy)
        calls = sk.coverage.report()["kernel_calls"][geglu.OP]
    for name, e, t in zip(("x",) + NAMES, eager, traced):
        assert rel_err(t, e) < 1e-6, name
    assert calls >= 4  # both forwards and both backwards ran the kernels


def test_eager_calls_skip_the_custom_op_dispatch(monkeypatch):
    """The host cost per call is what training pays while the GPU waits: eager calls (forward and backward)
    must not go through the custom ops' dispatch, only traced ones do (see the compile tests)."""
    def refuse(*args, **kwargs):
        raise AssertionError("custom op called in eager mode")
    for name in ("geglu_op", "backward_act_op", "ln_backward_op"):
        monkeypatch.setattr(geglu, name, refuse)
    params = make_params(16, 32)
    x = make_x(3, 16, torch.float16)
    with torch.no_grad():
        sk.ops.fused_pre_norm_geglu(x, *params, EPS)
    grads_of(lambda x, *p: sk.ops.fused_pre_norm_geglu(x, *p, EPS), x, params, torch.ones_like(x))


@needs_interpreter
@pytest.mark.parametrize("m", [65, 200])
def test_interpreted_inference_with_the_tables_configs_and_a_partial_row_tile(m):
    """The op's own configs at the seed width (gate/up: 64-row tiles, one program each, h stored by TMA;
    down: 64-row tiles), M not a multiple of them (partial tiles of one and eight rows): the last tile's rows
    past M come zero-filled from TMA, and the TMA store of h clips them. (The H200 failure at M = 1000
    was not this: see the next test; this shows the interpreter agrees at the GPU's tile shapes.)"""
    d, ff = 768, 1448
    params = make_params(d, ff, seed=m + d + ff)
    x = make_x(m, d, torch.float16, seed=m)
    with torch.no_grad(), sk.coverage.strict():
        y = sk.ops.fused_pre_norm_geglu(x, *params, EPS)
    gate_up, down = gk.choose_configs(m, d, ff)
    assert gate_up.block_m == down.block_m == 64 and gate_up.tma_store and not gate_up.programs_per_sm
    assert m % 64
    assert rel_err(y, fp64_block(x, *params)) < TOL[torch.float16]


def test_decode_configs_swap_only_below_64_rows():
    """Swapped products exist for tiles under wgmma's 64 rows; from 64 rows on the plain orientation takes
    wgmma itself."""
    for m, swapped in ((1, True), (32, True), (33, False), (64, False)):
        gate_up, down = gk.choose_configs(m, 2048, 16384)
        assert gate_up.swap_ab == (gate_up.block_m < 64) == swapped, (m, gate_up)
        assert down.swap_ab and down.block_m < 64  # decode's down tile is 32 rows at most
    assert not any(c.swap_ab for c in gk.choose_configs(1000, 768, 1448))


@pytest.mark.parametrize("m,d,ff", [(1024, 768, 1448), (8192, 2048, 16384)])
def test_only_inference_gate_up_kernels_run_persistent_or_store_by_tma(m, d, ff):
    """The persistent grid (prefill) was timed for the folded inference kernel only, the TMA store of h (seed)
    for both inference kernels; training's keeps one program per tile and masked stores."""
    folded, prologue, training = (gk.choose_configs(m, d, ff, kernel)[0]
                                  for kernel in ("folded", "prologue", "training"))
    assert (folded.programs_per_sm > 0) == (m == 8192) and folded.tma_store == (m == 1024)
    assert prologue.programs_per_sm == 0 and prologue.tma_store == (m == 1024)
    assert training.programs_per_sm == 0 and not training.tma_store


@pytest.mark.parametrize("kernel", ["folded", "prologue", "training"])
def test_large_gate_up_groups_16_mb_of_x_rows(kernel):
    """The prefill class's gate/up groups as many row tiles as hold 16 MB of x (timed at d_model 2048 and 4096:
    32 and 16 row tiles of 128 rows); the other classes keep the default group of 8."""
    for d, ff, group in ((2048, 16384, 32), (4096, 14336, 16), (8192, 28672, 8), (16384, 53248, 4)):
        gate_up, down = gk.choose_configs(8192, d, ff, kernel)
        assert (gate_up.block_m, gate_up.group_m, down.group_m) == (128, group, 8), (d, gate_up)
    for m, d, ff in ((1024, 768, 1448), (32, 2048, 16384)):
        assert gk.choose_configs(m, d, ff, kernel)[0].group_m == 8


# ------------------------------------------------------------------------------------ compiled for sm90 (any machine)

REPO = pathlib.Path(__file__).resolve().parents[1]
_SHARED_BUFFERS = r"""
import json, re, sys
sys.path.insert(0, "benchmarks")
from compile_report_geglu import compile_kernel, gk
found = {}
for m, d, ff in json.loads(sys.argv[1]):
    for kind, c in zip(("gate_up", "down"), gk.choose_configs(m, d, ff)):
        ttgir = compile_kernel(kind, c, d, ff, fold=True).asm["ttgir"]
        tiles = re.findall(r"ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x\d+x\d+x", ttgir)  # [buffers]x[tile]
        found[f"{kind} {m}x{d}x{ff}"] = [c.num_stages, [int(n) for n in tiles]]
print(json.dumps(found))
"""


def test_folded_gate_up_pipelines_every_wgmma_operand_as_deep_as_the_weights():
    """The H200 failure at M = 1000 (bf16 error 1.0e-2, eager 3.5e-3): with the row sums taken from the x tile
    inside the loop, Triton 3.6 gave that tile num_stages − 1 shared buffers (the weights num_stages) while the
    async wgmma reading it was still in flight when the next TMA load refilled the same buffer. No CPU
    interpreter shows a race: this compiles the folded gate/up kernel and the down kernel for sm90 (Triton's own
    ptxas, no GPU) at the inference configs, all on wgmma (decode's fewer-than-64-row tiles swapped), and counts
    the buffers of every operand tile. Subprocess: the interpreter, when on, replaces the kernels the compiler
    needs."""
    # 1 and 32 rows: swapped 16- and 32-row tiles; 64: 64-row tiles; the seed's and prefill's configs
    shapes = [(1, 768, 1448), (32, 2048, 16384), (64, 2048, 16384), (1000, 768, 1448), (8192, 2048, 16384)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _SHARED_BUFFERS, json.dumps(shapes)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for kernel, (stages, buffers) in json.loads(out.stdout.splitlines()[-1]).items():
        assert buffers == [stages] * 2, (kernel, stages, buffers)  # x, W' (gate and up interleaved) / h, W_down


# ----------------------------------------------------------------------------------------------- op, any device

def test_op_reference_matches_the_seed_composition():
    params = make_params(24, 40, device="cpu", dtype=torch.float64)
    x = make_x(5, 24, torch.float64, "cpu")
    for approximate in ("none", "tanh"):
        ref = geglu.fused_pre_norm_geglu_reference(x, *params, EPS, approximate)
        assert rel_err(ref, fp64_block(x, *params, approximate=approximate)) < 1e-14


def test_fp32_fallback_forward_and_backward_match_fp64():
    """Outside coverage (fp32 anywhere) the op runs PyTorch and stays exact to fp32 rounding, grads included."""
    params = make_params(24, 40, bias=False)
    x = make_x(2 * 3, 24, torch.float32).view(2, 3, 24)
    dy = make_x(6, 24, torch.float32, seed=3).view(2, 3, 24)

    def ours(x, *p):
        return sk.ops.fused_pre_norm_geglu(x, *p, EPS)
    assert rel_err(ours(x, *params), fp64_block(x, *params)) < TOL[torch.float32]
    for name, g, w in zip(("x",) + NAMES, grads_of(ours, x, params, dy), grads_of(fp64_block, x, params, dy)):
        assert (g is None) == (w is None), name
        if g is not None:
            assert rel_err(g, w) < 1e-5, name
    fallbacks = sk.coverage.report()["fallbacks"]
    assert fallbacks and all(f["op"] == geglu.OP and "fp32" in f["reason"] for f in fallbacks)


def test_strict_mode_raises_on_fp32():
    params = make_params(16, 32)
    with sk.coverage.strict(), pytest.raises(sk.CoverageError, match="fused_pre_norm_geglu.*fp32"):
        sk.ops.fused_pre_norm_geglu(make_x(3, 16, torch.float32), *params, EPS)


def test_autocast_converts_an_fp32_input_for_this_op_only():
    params = make_params(16, 32)
    x = make_x(4, 16, torch.float32, "cpu").requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = sk.ops.fused_pre_norm_geglu(x, *[p.cpu() if p is not None else None for p in params], EPS)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32  # the conversion is differentiable: the grad reaches the fp32 input


def test_rows_not_16_byte_aligned_take_the_recorded_fallback():
    """TMA needs d_model and d_ff to be multiples of 8 (16-byte rows): others are a recorded shape miss."""
    params = make_params(20, 36)
    x = make_x(3, 20, torch.float16)
    assert rel_err(sk.ops.fused_pre_norm_geglu(x, *params, EPS), fp64_block(x, *params)) < TOL[torch.float16]
    (miss,) = sk.coverage.report()["fallbacks"]
    if KERNEL_DEVICE == "cuda" or INTERPRETED_CPU:
        assert "must be positive multiples of 8" in miss["reason"]


@needs_interpreter
def test_input_view_not_on_a_16_byte_boundary_is_copied_for_tma():
    params = make_params(16, 32)
    flat = make_x(1, 3 * 16 + 1, torch.float16).view(-1)
    x = flat[1:].view(3, 16)  # starts 2 bytes into its storage
    with sk.coverage.strict():
        y = sk.ops.fused_pre_norm_geglu(x, *params, EPS)
    assert rel_err(y, fp64_block(x, *params)) < TOL[torch.float16]


def test_zero_rows():
    params = make_params(16, 32)
    y = sk.ops.fused_pre_norm_geglu(make_x(0, 16, torch.float16), *params, EPS)
    assert y.shape == (0, 16)


@pytest.mark.parametrize("m, d, ff", [(3, 0, 32), (3, 16, 0), (0, 0, 0)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # the kernel's dtype and the fallback's
@pytest.mark.parametrize("grad", [False, True])
def test_zero_width_is_refused_the_same_in_every_path(m, d, ff, dtype, grad):
    shapes = [(d,), (d,), (ff, d), (ff,), (ff, d), (ff,), (d, ff), (d,)]
    params = [torch.ones(s, device=KERNEL_DEVICE).requires_grad_(grad) for s in shapes]
    x = torch.zeros(m, d, device=KERNEL_DEVICE, dtype=dtype)
    with pytest.raises(ValueError, match=rf"d_model \(x's last dim\) and d_ff \(gate_weight's rows\) must be at "
                                         rf"least 1; got x \({m}, {d}\) \(d_model={d}\) and gate_weight "
                                         rf"\({ff}, {d}\) \(d_ff={ff}\)"):
        sk.ops.fused_pre_norm_geglu(x, *params, EPS)


@pytest.mark.parametrize("bad,match", [
    ({"gate_weight": torch.zeros(32, 15)}, r"gate_weight \(32, 15\) \(expected \(32, 16\)\)"),
    ({"down_bias": torch.zeros(32)}, r"down_bias \(32,\) \(expected \(16,\)\)"),
    ({"ln_weight": None}, "ln_weight must be a torch.Tensor"),
    ({"x": torch.zeros(3, 16, dtype=torch.int32)}, "x has dtype torch.int32"),
    ({"eps": -1.0}, "eps must be a non-negative"),
    ({"approximate": "fast"}, "approximate must be 'none' or 'tanh'"),
])
def test_argument_errors_are_clear(bad, match):
    kwargs = dict(zip(NAMES, make_params(16, 32, device="cpu")), x=torch.zeros(3, 16), eps=EPS, approximate="none")
    kwargs.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        sk.ops.fused_pre_norm_geglu(**kwargs)


def test_custom_op_registration_passes_opcheck():
    """Schema, fake (meta) implementation and autograd registration, as torch.library checks them."""
    params = make_params(16, 32, device="cpu", dtype=torch.float64)
    x = make_x(5, 16, torch.float64, "cpu")
    for save in (False, True):
        args = (x.requires_grad_(save), *[p.requires_grad_(save) for p in params], EPS, "none", save)
        torch.library.opcheck(geglu.geglu_op.opoverload, args,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_torch_compile_traces_through_the_fake_impl():
    params = make_params(16, 32, device="cpu")
    x = make_x(6, 16, torch.float32, "cpu")

    def block(x):
        return sk.ops.fused_pre_norm_geglu(x, *params, EPS) * 2
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), block(x))


def test_weight_copies_are_cached_until_the_weight_changes():
    w = torch.randn(8, 4, requires_grad=True)
    first = geglu.compute_weight(w, torch.bfloat16)
    assert geglu.compute_weight(w, torch.bfloat16) is first  # unchanged: no re-cast
    with torch.no_grad():
        w.add_(1.0)  # what an optimizer step does
    second = geglu.compute_weight(w, torch.bfloat16)
    assert second is not first and torch.equal(second, w.detach().to(torch.bfloat16))
    assert geglu.compute_weight(second, torch.bfloat16) is second  # already in the compute dtype: used as is


def test_folded_weights_are_cached_until_a_source_changes():
    ln_w, ln_b, wg, bg, wu, bu = [p.requires_grad_() for p in make_params(16, 32, device="cpu")[:6]]
    first = geglu.folded_gate_up(ln_w, ln_b, wg, bg, wu, bu, torch.float16)
    assert geglu.folded_gate_up(ln_w, ln_b, wg, bg, wu, bu, torch.float16) is first
    with torch.no_grad():
        ln_b.add_(1.0)  # any of the six: here the LayerNorm shift, which only the fp32 constants hold
    second = geglu.folded_gate_up(ln_w, ln_b, wg, bg, wu, bu, torch.float16)
    assert second is not first
    w_gate_up, fold = second  # gate and up rows interleaved, and the fold's columns alike
    assert torch.equal(w_gate_up[0::2], (wg * ln_w).detach().to(torch.float16))
    assert torch.equal(w_gate_up[1::2], (wu * ln_w).detach().to(torch.float16))
    for rows, w, b in ((slice(0, None, 2), wg, bg), (slice(1, None, 2), wu, bu)):
        shift = w.detach().double() @ ln_b.detach().double() + b.detach().double()
        assert rel_err(fold[1][rows], shift) < 1e-6
    assert rel_err(fold[0], w_gate_up.double().sum(1)) < 1e-6
    with torch.inference_mode():
        frozen = torch.randn(16)
    # An inference tensor has no version counter: its fold is cached on identity and storage (sk.ops.weight_cache).
    cached = geglu.folded_gate_up(frozen, ln_b, wg, bg, wu, bu, torch.float16)
    assert cached is not None and geglu.folded_gate_up(frozen, ln_b, wg, bg, wu, bu, torch.float16) is cached


@pytest.mark.skipif(KERNEL_DEVICE == "cpu" and not INTERPRETED_CPU, reason="needs the kernels")
def test_inference_after_an_optimizer_step_uses_the_new_weights():
    """Inference folds the LayerNorm scale into cached weights: an optimizer step must re-make them."""
    torch.manual_seed(0)
    block = sk.nn.PreNormGEGLUFFN(16, 24).to(KERNEL_DEVICE)
    optimizer = torch.optim.SGD(block.parameters(), lr=0.5)
    dtype = torch.bfloat16 if KERNEL_DEVICE == "cuda" else torch.float16  # the interpreter multiplies bf16 wrongly
    x = torch.randn(4, 16, device=KERNEL_DEVICE).to(dtype)
    for _ in range(2):
        with torch.no_grad(), sk.coverage.strict():
            y = block(x)
        assert rel_err(y, copy.deepcopy(block).double()(x.double())) < TOL[torch.bfloat16]
        block(x).float().sum().backward()
        optimizer.step()


# ----------------------------------------------------------------------------------------------- GPU (bf16)

def poison_allocator(*shapes):
    """Fill blocks of these sizes with NaN and free them: the caching allocator hands them to the op's outputs,
    so an element the kernels fail to write shows up as NaN."""
    blocks = [torch.full(s, float("nan"), dtype=torch.bfloat16, device="cuda") for s in shapes]
    del blocks


def eager_bf16(x, *params, approximate="none"):
    """PyTorch's own bf16 path (autocast over fp32 masters), whose error bounds ours."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = F.layer_norm(x, (x.shape[-1],), params[0], params[1], EPS)
        gated = F.gelu(F.linear(h, params[2], params[3]), approximate=approximate) * F.linear(h, params[4], params[5])
        return x + F.linear(gated, params[6], params[7])


GPU_SHAPES = [(1, 768, 1448), (7, 768, 1448), (1000, 768, 1448), (1024, 768, 1448), (32, 2048, 16384),
              (8192, 2048, 16384), (7, 200, 520), (1000, 200, 520), (33, 1000, 3000), (5, 104, 296),
              (100, 40, 24)]  # the last: d_ff below the seed class's 64-column tile (a narrower TMA box)


@pytest.mark.gpu
@pytest.mark.parametrize("m,d,ff", GPU_SHAPES)
@pytest.mark.parametrize("fold", [True, False], ids=["folded", "prologue"])
def test_gpu_forward_bf16(m, d, ff, fold, settings_override):
    """fold=False: inference as it runs where the fold is off (weights made under inference mode, traced
    calls, SK_GEGLU_FOLD_LN=0): x normalized in the gate/up kernel's prologue, with its own configs."""
    settings_override(geglu_fold_ln=fold)
    params = make_params(d, ff, device="cuda", seed=m + d + ff)
    x = make_x(m, d, torch.bfloat16, "cuda", seed=m)
    poison_allocator((m, d), (m, ff))
    with torch.no_grad(), sk.coverage.strict():
        y = sk.ops.fused_pre_norm_geglu(x, *params, EPS)
    assert not y.isnan().any()
    rows = slice(None, 1024)  # rows are independent: an fp64 oracle on the first 1024 keeps prefill quick
    want = fp64_block(x[rows], *params)
    err, eager_err = rel_err(y[rows], want), rel_err(eager_bf16(x[rows], *params), want)
    assert err < TOL[torch.bfloat16] and err <= 2 * eager_err + 1e-3, (err, eager_err)


@pytest.mark.gpu
@pytest.mark.parametrize("m,d,ff,approximate", [
    (1, 768, 1448, "none"), (7, 200, 520, "tanh"), (1000, 768, 1448, "none"), (1024, 768, 1448, "tanh"),
    (32, 2048, 16384, "none"), (33, 1000, 3000, "none")])
@pytest.mark.parametrize("gemms", ["triton", "cublas"])
def test_gpu_backward_bf16(m, d, ff, approximate, gemms, settings_override):
    settings_override(geglu_train_gemms=gemms)
    params = make_params(d, ff, device="cuda", seed=m + d)
    x = make_x(m, d, torch.bfloat16, "cuda", seed=m)
    dy = make_x(m, d, torch.bfloat16, "cuda", seed=m + 1)

    def ours(x, *p):
        return sk.ops.fused_pre_norm_geglu(x, *p, EPS, approximate)
    with sk.coverage.strict():
        got = grads_of(ours, x, params, dy)
    want = grads_of(lambda x, *p: fp64_block(x, *p, approximate=approximate), x, params, dy)
    eager = grads_of(lambda x, *p: eager_bf16(x, *p, approximate=approximate), x, params, dy)
    for name, g, w, e in zip(("x",) + NAMES, got, want, eager):
        err, eager_err = rel_err(g, w), rel_err(e, w)
        assert err < GRAD_TOL[torch.bfloat16] and err <= 2 * eager_err + 1e-3, (name, err, eager_err)


@pytest.mark.gpu
@pytest.mark.parametrize("mean", [3.0, 20.0])
def test_gpu_inference_with_large_row_means(mean):
    """Inference folds γ into the weights and subtracts μ·Σ_k W' after the GEMM (see `geglu.folded_gate_up`): its
    fp32 accumulation error grows with |μ|/σ; at 20 it must still meet the bf16 bounds."""
    m, d, ff = 1024, 768, 1448
    params = make_params(d, ff, device="cuda")
    x = (torch.randn(m, d, device="cuda") + mean).to(torch.bfloat16)
    with torch.no_grad(), sk.coverage.strict():
        y = sk.ops.fused_pre_norm_geglu(x, *params, EPS)
    want = fp64_block(x, *params)
    err, eager_err = rel_err(y, want), rel_err(eager_bf16(x, *params), want)
    assert err < TOL[torch.bfloat16] and err <= 2 * eager_err + 1e-3, (err, eager_err)


@pytest.mark.gpu
def test_gpu_split_k_is_deterministic_across_calls_and_graph_replays():
    """Decode runs the down projection split over K: its partials are summed in split order and its arrival
    counters zeroed on every call, so each call and each replay gives the same bits."""
    m, d, ff = 32, 2048, 16384
    assert gk.choose_configs(m, d, ff)[1].split_k > 1
    params = make_params(d, ff, device="cuda", dtype=torch.bfloat16)
    x = make_x(m, d, torch.bfloat16, "cuda")
    with torch.no_grad():
        first = sk.ops.fused_pre_norm_geglu(x, *params, EPS)
        graph = torch.cuda.CUDAGraph()
        sk.ops.fused_pre_norm_geglu(x, *params, EPS)
        with torch.cuda.graph(graph):
            out = sk.ops.fused_pre_norm_geglu(x, *params, EPS)
        for _ in range(3):
            out.fill_(float("nan"))  # a replay that skipped the epilogue would leave these
            graph.replay()
            assert torch.equal(out, first)
    assert rel_err(first, fp64_block(x, *params)) < TOL[torch.bfloat16]


def pdl_graph_gives_stream_order_bits(calls, settings_override):
    """`calls()` (a list of outputs) launched in plain stream order, against the same calls launched dependently
    (`PDL`) in one CUDA graph, replayed three times onto poisoned outputs: the bits must be equal. Returns the
    stream-order outputs."""
    settings_override(step_graphs=False)  # every call launches
    with sk.settings.override(geglu_pdl=False):
        want = calls()
    settings_override(geglu_pdl=True)
    calls()  # compiles the PDL variants before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = calls()
    for _ in range(3):
        for out in got:
            out.fill_(float("nan"))
        graph.replay()
        for i, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), f"call {i}"
    return want


@pytest.mark.gpu
@pytest.mark.parametrize("m,d,ff,training", [(1, 768, 1448, False), (1, 768, 1448, True), (32, 2048, 16384, False),
                                             (32, 2048, 16384, True), (1000, 768, 1448, True)])
def test_gpu_dependent_launch_gives_the_stream_order_bits(m, d, ff, training, settings_override):
    """With programmatic dependent launch each kernel starts before the one it depends on has finished; a read
    before its gdc_wait would see stale statistics, h or arrival counters. Many back-to-back calls in one graph,
    each into its own buffers (reused by later calls, as a real graph's pool does), must give the bits of calls
    launched in plain stream order. The cases: every table entry that launches dependently (decode; training
    at the seed class)."""
    assert gk.choose_configs(m, d, ff, "training" if training else "folded")[0].dependent_launch != "none"
    params = make_params(d, ff, device="cuda", dtype=torch.float32 if training else torch.bfloat16)
    xs = [make_x(m, d, torch.bfloat16, "cuda", seed=i) for i in range(4)]

    def calls():
        with torch.no_grad() if not training else torch.enable_grad():
            return [sk.ops.fused_pre_norm_geglu(x.requires_grad_(training), *params, EPS).detach() for x in xs * 5]

    want = pdl_graph_gives_stream_order_bits(calls, settings_override)
    assert all(torch.equal(a, b) for a, b in zip(calls(), want))  # and launched eagerly


@pytest.mark.gpu
@pytest.mark.parametrize("m,d,ff,training", [(1024, 768, 1448, False), (1000, 768, 1448, False),
                                             (4097, 768, 1448, False), (32, 2048, 16384, False),
                                             (1000, 768, 1448, True)])
def test_gpu_chained_calls_read_the_previous_calls_output(m, d, ff, training, settings_override):
    """The op's first kernel launches dependently on the kernel before it, which in a stack of blocks is the
    previous block's down GEMM writing this block's x: it must wait for that kernel before reading x, and, where
    it is the statistics kernel, let gate/up (whose main loop reads x) launch only after that. Calls chained
    through their outputs in one graph must give the bits of calls launched in stream order. The cases: gate/up
    computing the statistics itself (the seed and M = 1000, where QuACK's GEMMs run), the statistics kernel
    before QuACK's gate/up (M = 4097), decode, training. bf16 parameters throughout, so that no cast of the
    masters runs between the calls in stream order."""
    params = make_params(d, ff, device="cuda", dtype=torch.bfloat16)
    x0 = make_x(m, d, torch.bfloat16, "cuda")

    def chain(synchronized=False):
        x, outs = x0, []
        with torch.no_grad() if not training else torch.enable_grad():
            for _ in range(8):
                x = sk.ops.fused_pre_norm_geglu(x.detach().requires_grad_(training), *params, EPS).detach()
                outs.append(x)
                if synchronized:  # no kernel of a call overlaps the previous call's, whatever launches early
                    torch.cuda.synchronize()
        return outs

    want = pdl_graph_gives_stream_order_bits(chain, settings_override)
    assert all(out.isfinite().all() for out in want)
    assert all(torch.equal(a, b) for a, b in zip(chain(synchronized=True), want))


@pytest.mark.gpu
@pytest.mark.parametrize("m,d,ff", [(1000, 768, 1448), (4097, 2048, 16384), (8192, 2048, 16384)])
def test_gpu_tables_gate_up_gives_the_masked_one_program_per_tile_bits(m, d, ff):
    """The seed class stores h by TMA, the prefill class runs gate/up on a persistent grid (a program walks
    several tiles) in groups of 32 row tiles: every tile must be computed once, edges clipped (M = 1000 and 4097
    end in partial tiles, 4097 in a last group of one row tile), with the same bits as one program per tile in
    groups of 8 storing through masks."""
    table, down = gk.choose_configs(m, d, ff)
    per_tile = dataclasses.replace(table, programs_per_sm=0, tma_store=False, group_m=8, group_rows_bytes=0)
    assert table != per_tile
    params = list(make_params(d, ff, device="cuda", dtype=torch.bfloat16))
    x = make_x(m, d, torch.bfloat16, "cuda")
    folded, fold = geglu.fold_gate_up(*params[:6], torch.bfloat16)
    args = params[:2] + [folded, params[3], None] + params[5:]
    poison_allocator((m, d), (m, ff))
    outs = [gk.forward_kernels(x, *args, EPS, "none", False, (c, down), fold=fold)[0]
            for c in (table, per_tile)]
    assert not outs[0].isnan().any()
    assert torch.equal(*outs)
