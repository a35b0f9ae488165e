"""The pre-norm GEGLU feed-forward block as one op, the gated-MLP family's first member:

    y = x + down(gelu(gate(LN(x))) · up(LN(x)))

`sk.ops.fused_pre_norm_geglu` (the public function, below), its PyTorch reference, the custom ops
`sk::fused_pre_norm_geglu` (+ `_backward_act`, `_backward_ln`) with fakes, the autograd (an eager
autograd.Function and the custom op's registered backward, both running the same code), the replay of repeated
training steps from CUDA graphs, and the cached weight copies. The kernels, their configs and the forward launcher
are in `geglu_kernels` (the QuACK CuTe-DSL GEMMs it may choose: `quack_backend`).

Forward routes (`_forward`): outside the Kernel Coverage table, the reference (recorded); inference, the fused
kernels on gate/up weights with the LayerNorm scale folded in (`folded_gate_up`; `SK_GEGLU_FOLD_LN=0` turns it
off); training, the fused kernels normalizing x in the gate/up prologue and storing the pre-activations, or above
the step-graph range (`SK_GEGLU_TRAIN_GEMMS`, "auto") our LayerNorm and GEGLU kernels around cuBLAS products
(`_forward_cublas`).
Matrix products take operands in the activation dtype (bf16/fp16) and accumulate in fp32; LayerNorm reads
its scale and shift in their own precision (the FP32 masters). Training rounds the normalized activation
once to the activation dtype, as eager's LayerNorm output is; inference rounds γ⊙W once instead. Higher-
precision projection weights are cast to the activation dtype once and cached until they change
(`compute_weight`, `folded_gate_up`, `_gate_up_copies`, through `sk.ops.weight_cache`: never re-made inside a
CUDA graph of inference, see there).

Backward: one Triton kernel for the GEGLU derivative (and h, recomputed rather than stored), one for the
LayerNorm backward with the residual's gradient added (and partial sums of the LayerNorm weight and bias
grads); dgrad and wgrad are cuBLAS GEMMs (FP32 masters' weight grads straight from the fp32 accumulator where
cuBLAS offers it, `_mm_as`).

Eager calls run the kernels through an autograd.Function (`_EagerFunction`); torch.compile and other
tracing go through the `torch.library` custom ops (with fake implementations), which run the same code.
Eager training steps that repeat (same shapes, same parameters) are replayed from CUDA graphs of the forward
and the backward once seen twice (`sk_core/ops/_step_graphs.py`; `SK_STEP_GRAPHS=0` turns it off): at the seed
shape the step is otherwise bound by the host's launch work.

Internal, for benchmarks and tests: `OP`, `fused_pre_norm_geglu_reference`, `compute_weight`, `folded_gate_up`,
`fold_gate_up`, `backward_act`, `ln_backward`, the custom ops `geglu_op`, `backward_act_op`, `ln_backward_op`,
`step_graphs` / `make_step_graphs`, `STEP_GRAPH_MAX_WORK`.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from sk import coverage, settings
from sk.ops import weight_cache
from sk.ops._common import FLOAT_DTYPES, LibraryOp, check_float, check_same_device
from sk.ops._step_graphs import StepGraphs
from sk.ops.act_and_mul import launch as _act_launch
from sk.ops.gated_mlp import geglu_kernels as gk
from sk.ops.gated_mlp.common import TMA_ALIGN, align, cdiv, is_eager, next_power_of_2, tma_ready

OP = "fused_pre_norm_geglu"


# ----------------------------------------------------------------------------------------------- weight copies

def compute_weight(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`weight` as a contiguous `dtype` tensor for the projections: cast once and cached until it changes, never
    inside a CUDA-graph capture of inference (see `sk.ops.weight_cache`)."""
    return weight_cache.cast(OP, weight, dtype)


def _gate_up_copies(wg: torch.Tensor, wu: torch.Tensor, dtype: torch.dtype):
    """(gate, up, both): the gate and up weights in `dtype`. Masters in another dtype are cast into one cached
    [gate; up] copy (`both`; gate and up are its halves), so that the backward's dgrad is one GEMM over
    [dg | du] and the cuBLAS training forward one GEMM; weights already in `dtype` are used as they are
    (`both` None: no second copy of them)."""
    if wg.dtype == dtype and wu.dtype == dtype and wg.is_contiguous() and wu.is_contiguous():
        return wg, wu, None
    ff = wg.shape[0]

    def make():
        both = torch.empty((2 * ff, wg.shape[1]), dtype=dtype, device=wg.device)
        both[:ff].copy_(wg.detach())
        both[ff:].copy_(wu.detach())
        return both
    both = weight_cache.derived(OP, (wg, wu), ("gate_up", dtype), make)
    return both[:ff], both[ff:], both


# Inference calls fold the LayerNorm scale into cached gate/up weights (`folded_gate_up`), so that the gate/up
# kernel is a plain GEMM (both operands from shared memory). It costs a second copy of those weights per dtype;
# SK_GEGLU_FOLD_LN=0 (`sk.settings`, "geglu_fold_ln") turns it off (then inference runs as training's forward does).
def folded_gate_up(ln_w, ln_b, wg, bg, wu, bu, dtype):
    """(W', fold): W' = γ⊙W of gate and up in `dtype`, their rows interleaved (gate 0, up 0, gate 1, ...: the
    gate/up kernel computes both with one product), and fold fp32 [[Σ_k W'], [W·β + b]], its columns
    interleaved alike, so that for a row x with mean μ and 1/std r

        gate = r·(x @ W'_gateᵀ − μ·Σ_k W'_gate) + (W_gate·β + b_gate)      (up alike)

    is LayerNorm followed by the projection. The row sums are of the rounded W', so the mean cancels exactly
    in real arithmetic. What remains is the fp32 accumulation error of x @ W'ᵀ, which is relative to μ rather
    than to the centered values: about d_model·2⁻²⁴·|μ|/σ of the output (5e-5·|μ|/σ at d_model = 768),
    below a bf16 rounding (3.9e-3) unless rows are nearly constant (|μ|/σ ≳ 30). Training keeps the prologue
    that normalizes x tiles in fp32, which has no such term.

    Cached by `sk.ops.weight_cache` on all six sources (inference tensors included). None for traced tensors
    and during a CUDA-graph capture that finds no fold made before it (the graph would recompute it on every
    replay): the kernel then normalizes in its prologue. Making a fold takes two fp32 temporaries the size of
    gate + up (about 0.5 GB at d_model 2048, d_ff 16384).
    """
    sources = (ln_w, ln_b, wg, bg, wu, bu)
    if not all(weight_cache.cacheable(t) for t in sources if t is not None):
        return None
    tag = ("geglu_fold", dtype)
    if wg.is_cuda and torch.cuda.is_current_stream_capturing() and not weight_cache.is_cached(sources, tag):
        return None
    return weight_cache.derived(OP, sources, tag, lambda: fold_gate_up(ln_w, ln_b, wg, bg, wu, bu, dtype))


def fold_gate_up(ln_w, ln_b, wg, bg, wu, bu, dtype):
    """`folded_gate_up`'s (W', fold), made afresh (uncached)."""
    ff, d = wg.shape
    with torch.no_grad(), torch.autocast(wg.device.type, enabled=False):  # fp32 throughout, also under autocast
        w = torch.stack([wg, wu], dim=1).reshape(2 * ff, d).float()  # rows interleaved: gate 0, up 0, gate 1, ...
        folded = (w * ln_w.float()).to(dtype)
        fold = torch.zeros((2, 2 * ff), dtype=torch.float32, device=w.device)
        torch.sum(folded, 1, dtype=torch.float32, out=fold[0])
        if ln_b is not None:
            torch.mv(w, ln_b.float(), out=fold[1])
        for b, cols in ((bg, fold[1, 0::2]), (bu, fold[1, 1::2])):
            if b is not None:
                cols += b.float()
    return folded, fold


# ----------------------------------------------------------------------------------------------- backward kernels

def backward_act(dh: torch.Tensor, gu: torch.Tensor, d_model: int, approximate: str
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(d[g | u], h) from the upstream gradient dh and the saved pre-activations [g | u].

    Decides kernel vs PyTorch for the whole backward (recorded once per backward, here), as the LayerNorm
    backward below follows the same inputs.
    """
    m, ff = dh.shape
    if not coverage.decide(OP, (dh, gu), shape_miss=_shape_miss(d_model, ff), backward=True):
        acc_dtype = torch.promote_types(gu.dtype, torch.float32)
        g, u = gu.to(acc_dtype).split(ff, dim=-1)
        dhf = dh.to(acc_dtype)
        act = torch.nn.functional.gelu(g, approximate=approximate)
        dg = torch.ops.aten.gelu_backward(dhf * u, g, approximate=approximate)
        return torch.cat([dg, dhf * act], dim=-1).to(dh.dtype), (act * u).to(dh.dtype)
    dgu = torch.empty_like(gu)
    h = torch.empty_like(dh)
    if m:
        block = min(2048, next_power_of_2(ff))
        gk.geglu_backward_kernel[(m, cdiv(ff, block))](
            dh, gu, dgu, h, m, ff, FF_ALIGN=align(ff), APPROX_TANH=approximate == "tanh", BLOCK=block,
            num_warps=max(1, min(8, block // 256)),
        )
    return dgu, h


def ln_backward(dxn: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, stats: torch.Tensor,
                ln_weight: torch.Tensor, ff: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, [d ln_weight; d ln_bias; d down_bias]) from the normalized activation's gradient dxn and the
    output's dy: LayerNorm's backward plus the residual's dy, and the column sums that are the LayerNorm
    weight and bias grads and the down projection's bias grad, in the statistics' dtype (fp32; fp64 for
    fp64 inputs)."""
    m, d = x.shape
    if coverage.miss_reason(OP, x, shape_miss=_shape_miss(d, ff), backward=True) is not None:
        acc = stats.dtype  # the miss was recorded (or raised) by backward_act for this backward
        dxn_acc = dxn.to(acc)
        dx_ln, d_ln_w, _ = torch.ops.aten.native_layer_norm_backward(
            dxn_acc, x.to(acc), [d], stats[0].view(m, 1), stats[1].view(m, 1), ln_weight.to(acc), None,
            [True, True, False])
        return (dx_ln + dy).to(x.dtype), torch.stack([d_ln_w, dxn_acc.sum(0), dy.sum(0, dtype=acc)])
    dx = torch.empty_like(x)
    if m == 0:
        return dx, torch.zeros((3, d), dtype=torch.float32, device=x.device)
    programs, meta = gk.ln_backward_launch(m, d)
    partial = torch.empty((3, programs, d), dtype=torch.float32, device=x.device)
    gk.ln_backward_kernel[(programs,)](dxn, x, dy, stats, ln_weight, dx, partial, m, d, **meta)
    return dx, partial.sum(1)


# Custom ops of their own so that the backward traces (torch.compile) and decides per call; eager backwards
# call the functions directly (see `is_eager`).
backward_act_op = LibraryOp("sk::fused_pre_norm_geglu_backward_act", backward_act)
ln_backward_op = LibraryOp("sk::fused_pre_norm_geglu_backward_ln", ln_backward)


@backward_act_op.register_fake
def _(dh, gu, d_model, approximate):
    return torch.empty_like(gu), torch.empty_like(dh)


@ln_backward_op.register_fake
def _(dxn, x, dy, stats, ln_weight, ff):
    return torch.empty_like(x), stats.new_empty((3, x.shape[1]))


# ----------------------------------------------------------------------------------------------- reference

def _reference_parts(x2, ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps, approximate):
    """PyTorch computing what the kernels compute, with the same roundings: (y, stats, xn, gu).

    The fallback, and (through `fused_pre_norm_geglu_reference`) the test oracle when run in fp64; it is
    differentiable in every input.
    """
    dtype = x2.dtype
    xf = x2 if dtype == torch.float64 else x2.float()
    mean = xf.mean(-1, keepdim=True)
    centered = xf - mean
    rstd = torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps)
    xn = centered * rstd * ln_w.to(xf.dtype)
    if ln_b is not None:
        xn = xn + ln_b.to(xf.dtype)
    xn = xn.to(dtype)
    biases = None if bg is None and bu is None else torch.cat([
        bg if bg is not None else wg.new_zeros(wg.shape[0]), bu if bu is not None else wu.new_zeros(wu.shape[0])])
    gu = torch.nn.functional.linear(
        xn, torch.cat([wg, wu]).to(dtype), None if biases is None else biases.to(dtype))
    g, u = gu.to(xf.dtype).chunk(2, dim=-1)
    h = (torch.nn.functional.gelu(g, approximate=approximate) * u).to(dtype)
    down = torch.nn.functional.linear(h, wd.to(dtype)).to(xf.dtype)
    if bd is not None:
        down = down + bd.to(xf.dtype)
    y = (xf + down).to(dtype)
    return y, torch.cat([mean, rstd], dim=-1).t().contiguous(), xn, gu


def fused_pre_norm_geglu_reference(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias,
                                   down_weight, down_bias, eps, approximate="none"):
    """The PyTorch computation the op replaces: fallback, test oracle and benchmark baseline."""
    x2 = x.reshape(-1, x.shape[-1])
    y = _reference_parts(x2, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias,
                         down_weight, down_bias, eps, approximate)[0]
    return y.view(x.shape)


# ----------------------------------------------------------------------------------------------- custom op

@functools.lru_cache(maxsize=64)
def _shape_miss(d: int, ff: int) -> str | None:
    limits = coverage.table()[OP].limits
    if d % TMA_ALIGN or ff % TMA_ALIGN or not d or not ff:  # TMA needs 16-byte row strides, and rows
        return f"d_model {d} and d_ff {ff} must be positive multiples of {TMA_ALIGN}"
    return (coverage.limit_miss("d_model", d, limits.get("max_d_model"))
            or coverage.limit_miss("d_ff", ff, limits.get("max_d_ff")))


def _forward(
    x: torch.Tensor, ln_weight: torch.Tensor, ln_bias: Optional[torch.Tensor],
    gate_weight: torch.Tensor, gate_bias: Optional[torch.Tensor],
    up_weight: torch.Tensor, up_bias: Optional[torch.Tensor],
    down_weight: torch.Tensor, down_bias: Optional[torch.Tensor],
    eps: float, approximate: str, save_for_backward: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x is 2-D and contiguous. Returns (y, [mean; rstd], normalized x, [g | u]); the last two are empty
    unless saving for the backward (custom ops cannot return None)."""
    m, d = x.shape
    ff = gate_weight.shape[0]
    tensors = (x, ln_weight, gate_weight, up_weight, down_weight)
    if not coverage.decide(OP, tensors, shape_miss=_shape_miss(d, ff)):
        y, stats, xn, gu = _reference_parts(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias,
                                            down_weight, down_bias, eps, approximate)
        return (y, stats) + ((xn, gu) if save_for_backward else (x.new_empty(0), x.new_empty(0)))
    folded = None if save_for_backward or not settings.get("geglu_fold_ln") else folded_gate_up(
        ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, x.dtype)
    if folded is None:
        wg, wu, both = _gate_up_copies(gate_weight, up_weight, x.dtype)
        wg, wu, fold = tma_ready(wg), tma_ready(wu), None
    else:
        (wg, fold), wu = folded, None
    wd = compute_weight(down_weight, x.dtype)
    if save_for_backward and _cublas_training(m, d, ff):
        return _forward_cublas(x, ln_weight, ln_bias, wg, gate_bias, wu, up_bias, both, wd, down_bias, eps,
                               approximate)
    # The down bias is read as a contiguous vector (QuACK's from a 16-byte boundary too); rarely a copy.
    bd = None if down_bias is None else tma_ready(down_bias.contiguous())
    return gk.forward_kernels(
        tma_ready(x), ln_weight, ln_bias, wg, gate_bias, wu, up_bias,
        tma_ready(wd), bd, eps, approximate, save_for_backward, fold=fold)


def _cublas_training(m: int, d: int, ff: int) -> bool:
    """Whether a training forward runs its products on cuBLAS (`SK_GEGLU_TRAIN_GEMMS`, "geglu_train_gemms")."""
    mode = settings.get("geglu_train_gemms")
    return mode == "cublas" or (mode == "auto" and m * d * ff > STEP_GRAPH_MAX_WORK)


def _forward_cublas(x, ln_w, ln_b, wg, bg, wu, bu, both, wd, bd, eps, approximate):
    """The training forward as our LayerNorm kernel (statistics and the normalized activation, which the backward
    keeps), one cuBLAS GEMM for [g | u] (the saved pre-activations are its output), our GEGLU kernel, and one
    cuBLAS GEMM adding the residual in its epilogue. Returns what `geglu_kernels.forward_kernels` returns."""
    m, d = x.shape
    ff = wd.shape[1]
    dtype = x.dtype
    stats = torch.empty((2, m), dtype=torch.float32, device=x.device)
    xn = torch.empty((m, d), dtype=dtype, device=x.device)
    if m:
        block_d = next_power_of_2(d)
        rows_per_program = max(1, min(16, 2048 // block_d))
        gk.ln_stats_kernel[(cdiv(m, rows_per_program),)](
            x, stats, ln_w, ln_b, xn, stats, m, d, eps, 0,
            D_ALIGN=align(d), HAS_LN_BIAS=ln_b is not None, STORE_XN=True, ARRIVALS_BLOCK=0, PDL=False,
            BLOCK_M=rows_per_program, BLOCK_D=block_d, num_warps=min(16, max(1, rows_per_program * block_d // 512)))
    # Biases in cuBLAS's epilogue (addmm): a separate broadcast add over [g | u] cost 0.77 ms at 8192 × 2048 →
    # 16384 on the H200 (results/h200/geglu/README.md, 2026-12-02).
    if both is None:
        gu = torch.empty((m, 2 * ff), dtype=dtype, device=x.device)
        for w, b, cols in ((wg, bg, gu[:, :ff]), (wu, bu, gu[:, ff:])):
            if b is None:
                torch.mm(xn, w.t(), out=cols)
            else:
                torch.addmm(b.to(dtype), xn, w.t(), out=cols)
    elif bg is None and bu is None:
        gu = xn @ both.t()
    else:
        bias = torch.cat([bg if bg is not None else wg.new_zeros(ff), bu if bu is not None else wu.new_zeros(ff)])
        gu = torch.addmm(bias.to(dtype), xn, both.t())
    h = torch.empty((m, ff), dtype=dtype, device=x.device)
    if m:
        _act_launch(gu, h, "gelu_tanh" if approximate == "tanh" else "gelu")
    residual = x if bd is None else (x.float() + bd.float()).to(dtype)
    return torch.addmm(residual, h, wd.t()), stats, xn, gu


geglu_op = LibraryOp("sk::fused_pre_norm_geglu", _forward)


@geglu_op.register_fake
def _(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, eps,
      approximate, save_for_backward):
    m, d = x.shape
    ff = gate_weight.shape[0]
    stats_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    saved = (x.new_empty((m, d) if save_for_backward else 0), x.new_empty((m, 2 * ff) if save_for_backward else 0))
    return (x.new_empty((m, d)), x.new_empty((2, m), dtype=stats_dtype), *saved)


def _setup_context(ctx, inputs, output):
    x, ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps, approximate, _ = inputs
    _, stats, xn, gu = output
    ctx.approximate = approximate
    ctx.save_for_backward(x, ln_w, wg, wu, wd, stats, xn, gu)
    ctx.bias_dtypes = [b.dtype if b is not None else None for b in (ln_b, bg, bu, bd)]  # their grads are sums
    coverage.note_forward(ctx)


def _setup_op_context(ctx, inputs, output):
    _setup_context(ctx, inputs, output)
    ctx.mark_non_differentiable(*output[1:])


def _backward(ctx, dy, *_):
    with coverage.backward_of(ctx):
        return _backward_body(ctx, dy)


def _backward_body(ctx, dy):
    x, ln_w, wg, wu, wd, stats, xn, gu = ctx.saved_tensors
    if xn.numel() != x.numel():
        raise RuntimeError(f"sk.ops.{OP}: backward through a call made without autograd state; call it with "
                           f"grad mode on and an input that requires grad")
    ff = wg.shape[0]
    dtype = x.dtype
    # The kernels and cuBLAS read dy as dense rows; `.to` alone would keep an expanded dy (`y.sum().backward()`).
    dy = dy.to(dtype).contiguous()
    cwg, cwu, both = _gate_up_copies(wg, wu, dtype)
    cwd = compute_weight(wd, dtype)
    need = ctx.needs_input_grad
    eager = is_eager(dy)

    dh = dy @ cwd
    dgu, h = (backward_act if eager else backward_act_op)(dh, gu, x.shape[1], ctx.approximate)
    if both is not None:  # one GEMM over [dg | du] and [gate; up]
        dxn = dgu @ both
    else:
        dxn = dgu[:, :ff] @ cwg
        dxn.addmm_(dgu[:, ff:], cwu)
    dx, d_ln = (ln_backward if eager else ln_backward_op)(dxn, x, dy, stats, ln_w, ff)
    acc = stats.dtype  # fp32 (fp64 for fp64 inputs): every reduction runs in it
    if need[3] or need[5]:  # gate and up weight grads in one GEMM (views of it are the grads)
        d_gu_w = _mm_as(dgu.t(), xn, torch.promote_types(wg.dtype, wu.dtype))
    d_gu_b = dgu.sum(0, dtype=acc) if need[4] or need[6] else None

    ln_b_dtype, bg_dtype, bu_dtype, bd_dtype = ctx.bias_dtypes
    # Each grad in its input's dtype (FP32 for FP32 masters), computed only where autograd asks for it.
    return (
        dx if need[0] else None,
        d_ln[0].to(ln_w.dtype) if need[1] else None,
        d_ln[1].to(ln_b_dtype) if need[2] else None,
        d_gu_w[:ff].to(wg.dtype) if need[3] else None,
        d_gu_b[:ff].to(bg_dtype) if need[4] else None,
        d_gu_w[ff:].to(wu.dtype) if need[5] else None,
        d_gu_b[ff:].to(bu_dtype) if need[6] else None,
        _mm_as(dy.t(), h, wd.dtype) if need[7] else None,
        d_ln[2].to(bd_dtype) if need[8] else None,
        None, None, None,
    )


geglu_op.register_autograd(_backward, setup_context=_setup_op_context)


def _mm_as(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b in `dtype`: a weight gradient for an FP32 master straight from the fp32 accumulator (one GEMM
    writing fp32, instead of a bf16 product and a cast pass over it) where cuBLAS offers it (`out_dtype`, CUDA
    bf16/fp16 operands); else the product cast."""
    if dtype == torch.float32 and a.dtype in (torch.bfloat16, torch.float16) and a.is_cuda and _mm_out_dtype_ok(a):
        return torch.mm(a, b, out_dtype=torch.float32)
    return (a @ b).to(dtype)


_out_dtype_probes: dict = {}


def _mm_out_dtype_ok(a: torch.Tensor) -> bool:
    """Whether torch.mm takes `out_dtype` for `a`'s dtype and device, probed once outside any capture (inside
    one, unprobed means no: the probe would be captured)."""
    key = (a.dtype, a.device)
    if key not in _out_dtype_probes:
        if torch.cuda.is_current_stream_capturing():
            return False
        try:
            one = torch.ones((1, 1), dtype=a.dtype, device=a.device)
            _out_dtype_probes[key] = torch.mm(one, one, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError):
            _out_dtype_probes[key] = False
    return _out_dtype_probes[key]


def make_step_graphs() -> StepGraphs:
    """A fresh replay cache of this op's training steps (the op's own is `step_graphs`; tests swap in a fresh one)."""
    return StepGraphs(OP, _forward, _setup_context, _backward,
                      settings=lambda: (gk.pdl_on(), settings.get("geglu_train_gemms")))


step_graphs = make_step_graphs()
# Training steps are replayed from CUDA graphs (see `_step_graphs.py`) up to this much work, m·d_model·d_ff:
# there the host's launch cost (~0.3-2 ms a step) is above the kernels' time (18·m·d·ff FLOP, ~0.1 ms at 2^32)
# and a slot's memory stays moderate (160 MiB at the seed shape, m·d·ff ≈ 2^30, growing about in proportion);
# beyond it a step is GPU-bound and replay would gain nothing.
STEP_GRAPH_MAX_WORK = 2 ** 32


class _EagerFunction(torch.autograd.Function):
    """The same forward and backward as the custom op, for eager calls: the custom op's dispatch (schema
    checks, its own autograd wrapper, four outputs through the dispatcher) cost more host time than the
    kernels take on the GPU at the seed shape. torch.compile, fake tensors and functorch take the custom op.
    Repeated small CUDA calls replay their step from CUDA graphs (`step_graphs`)."""

    @staticmethod
    def forward(ctx, *inputs):
        if _replayable(*inputs):
            y = step_graphs.forward(ctx, inputs)
            if y is not None:
                return y
        output = _forward(*inputs)
        _setup_context(ctx, inputs, output)
        return output[0]

    @staticmethod
    def backward(ctx, dy):
        return step_graphs.backward(ctx, dy) if StepGraphs.replays(ctx) else _backward(ctx, dy)


def _replayable(x, ln_weight, ln_bias, gate_weight, *rest) -> bool:
    """A CUDA call on plain tensors (whose memory a graph can read) that the kernels cover (checked without
    recording it), small enough to gain from replay."""
    m, d = x.shape
    ff = gate_weight.shape[0]
    return (x.is_cuda and 0 < m * d * ff <= STEP_GRAPH_MAX_WORK
            and all(weight_cache.cacheable(t) for t in (ln_weight, ln_bias, gate_weight, *rest)
                    if isinstance(t, torch.Tensor))
            and coverage.miss_reason(OP, x, shape_miss=_shape_miss(d, ff)) is None
            and coverage.miss_reason(OP, x, shape_miss=_shape_miss(d, ff), backward=True) is None)


# ----------------------------------------------------------------------------------------------- functional API

def _args_fit(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, eps,
              approximate) -> bool:
    """The common case, checked in a few comparisons per call; `_explain_args` says what is wrong otherwise."""
    if not (isinstance(x, torch.Tensor) and x.dim() and isinstance(gate_weight, torch.Tensor)
            and gate_weight.dim() == 2 and eps >= 0 and approximate in ("none", "tanh")):
        return False
    d, ff = x.shape[-1], gate_weight.shape[0]
    if not d or not ff:
        return False
    device = x.device
    for t, shape in ((x, None), (ln_weight, (d,)), (ln_bias, (d,)), (gate_weight, (ff, d)), (gate_bias, (ff,)),
                     (up_weight, (ff, d)), (up_bias, (ff,)), (down_weight, (d, ff)), (down_bias, (d,))):
        if t is None:  # a bias (or a missing weight, caught below)
            continue
        if (not isinstance(t, torch.Tensor) or t.dtype not in FLOAT_DTYPES or t.device != device
                or shape is not None and t.shape != shape):
            return False
    return ln_weight is not None and up_weight is not None and down_weight is not None


def _explain_args(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, eps,
                  approximate):
    named = {"x": x, "ln_weight": ln_weight, "ln_bias": ln_bias, "gate_weight": gate_weight,
             "gate_bias": gate_bias, "up_weight": up_weight, "up_bias": up_bias, "down_weight": down_weight,
             "down_bias": down_bias}
    present = {n: t for n, t in named.items() if t is not None or not n.endswith("bias")}  # biases may be None
    for name, t in present.items():
        check_float(OP, name, t)
    check_same_device(OP, list(present), list(present.values()))
    if x.dim() == 0:
        raise ValueError(f"sk.ops.{OP}: x must have at least one dimension (..., d_model)")
    if gate_weight.dim() != 2:
        raise ValueError(f"sk.ops.{OP}: gate_weight must be (d_ff, d_model); got {tuple(gate_weight.shape)}")
    d, ff = x.shape[-1], gate_weight.shape[0]
    expected = {"ln_weight": (d,), "ln_bias": (d,), "gate_weight": (ff, d), "gate_bias": (ff,),
                "up_weight": (ff, d), "up_bias": (ff,), "down_weight": (d, ff), "down_bias": (d,)}
    wrong = [f"{n} {tuple(present[n].shape)} (expected {shape})" for n, shape in expected.items()
             if n in present and tuple(present[n].shape) != shape]
    if wrong:
        raise ValueError(f"sk.ops.{OP}: with x {tuple(x.shape)} (d_model={d}) and d_ff={ff} from gate_weight, "
                         f"these shapes do not fit: {'; '.join(wrong)}")
    if not d or not ff:
        raise ValueError(f"sk.ops.{OP}: d_model (x's last dim) and d_ff (gate_weight's rows) must be at least 1; got "
                         f"x {tuple(x.shape)} (d_model={d}) and gate_weight {tuple(gate_weight.shape)} (d_ff={ff})")
    if not eps >= 0:
        raise ValueError(f"sk.ops.{OP}: eps must be a non-negative float, got {eps!r}")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"sk.ops.{OP}: approximate must be 'none' or 'tanh', got {approximate!r}")


def fused_pre_norm_geglu(
    x: torch.Tensor,
    ln_weight: torch.Tensor, ln_bias: torch.Tensor | None,
    gate_weight: torch.Tensor, gate_bias: torch.Tensor | None,
    up_weight: torch.Tensor, up_bias: torch.Tensor | None,
    down_weight: torch.Tensor, down_bias: torch.Tensor | None,
    eps: float = 1e-5,
    approximate: str = "none",
) -> torch.Tensor:
    """x + down(gelu(gate(h)) · up(h)), h = layer_norm(x), over the last dimension of x (..., d_model).

    Weights as torch.nn.Linear / LayerNorm store them: gate/up (d_ff, d_model), down (d_model, d_ff); any bias
    may be None. GELU is exact (erf) by default, `approximate="tanh"` as in torch.nn.functional.gelu.
    The kernel runs on bf16/fp16 inputs where the Kernel Coverage table says so: LayerNorm statistics in fp32,
    projections on copies of the weights in the input's dtype, fp32 accumulation. Under autocast an fp32 input
    is converted to the autocast dtype for this op; outside it, an fp32 input takes the recorded fallback.
    """
    args = (ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, eps, approximate)
    if not _args_fit(x, *args):
        _explain_args(x, *args)
    device_type = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(device_type):
        x = x.to(torch.get_autocast_dtype(device_type))
    weights = (ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias)
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *weights))
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    if not is_eager(x2):
        y = geglu_op(x2, *weights, float(eps), approximate, save)[0]
    elif save:
        y = _EagerFunction.apply(x2, *weights, float(eps), approximate, True)
    else:
        y = _forward(x2, *weights, float(eps), approximate, False)[0]
    return y.view(x.shape)
