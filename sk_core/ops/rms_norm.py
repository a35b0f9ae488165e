"""RMSNorm, Gemma's RMSNorm, and both fused with the residual add, as one Triton kernel.

    y = x / sqrt(mean(x**2) + eps) * (weight + offset)        offset = 0 (RMSNorm) or 1 (Gemma)

With a residual, `x` is first replaced by `x + residual` rounded to the input dtype; that rounded sum is both
the new residual and what gets normalized, as vLLM's and SGLang's kernels do, so the next layer sees exactly
the residual that was normalized here. Statistics and the scaling are computed in fp32; each output is
rounded once. On NVIDIA GPUs from SM90 on the forward kernel launches as a programmatic dependent launch
(`dependent_launch`, `SK_NORM_PDL`), as SGLang's own norm kernels do: chained kernels then overlap their launches.

The backward is a Triton kernel too (`_rms_norm_backward_kernel`), registered as the custom ops' autograd formula:
with n = x·rstd and g = dy·(weight + offset), per row

    dx = rstd · (g − n · mean(g·n))   (+ the residual output's gradient, for the fused forms)
    dweight = Σ_rows dy · n

rstd is recomputed from x in the backward rather than saved by the forward: the backward reads each row of x
anyway, so recomputing costs no memory traffic, and the forward (inference or training) stays the one kernel it
was. The weight gradient is reduced without atomics: each program sums its rows into an fp32 partial row, and a
second kernel sums the partial rows in a fixed order, so it has the same bits on every run.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from sk import coverage, settings
from sk.ops._common import (
    LibraryOp,
    cdiv,
    check_float,
    check_same_device,
    check_writable,
    direct_or_op,
    eager_or_op,
    next_power_of_2,
    refuse_autograd_of_mutating_op,
    rows_view,
)

GEMMA_OFFSET = 1.0


# ----------------------------------------------------------------------------------------------- kernel

@triton.jit(do_not_specialize=["n_rows", "eps"])
def _rms_norm_kernel(
    x_ptr, x_stride, res_ptr, res_stride, w_ptr, y_ptr, y_stride, res_out_ptr, res_out_stride,
    n_rows, n_cols, eps, weight_offset,
    HAS_RESIDUAL: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    # `n_rows` is not specialized so that one compiled kernel serves every batch size (engines capture CUDA
    # graphs for many of them). Narrow rows share a program; each row is a 1-D block held in registers.
    if PDL:
        # Launched while the kernel before it may still run: wait for it before any load or store (the weight
        # too: an optimizer step may be writing it), then let the next kernel launch (`dependent_launch`).
        gdc_wait()
        gdc_launch_dependents()
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + weight_offset
    for i in tl.static_range(ROWS_PER_PROGRAM):
        row = tl.program_id(0).to(tl.int64) * ROWS_PER_PROGRAM + i
        mask = col_mask & (row < n_rows)
        # No eviction hints: evict_first on these streamed rows measured 3-5% slower on an H200.
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0).to(tl.float32)
            summed = (x + r).to(res_out_ptr.dtype.element_ty)
            tl.store(res_out_ptr + row * res_out_stride + cols, summed, mask=mask)
            x = summed.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        tl.store(y_ptr + row * y_stride + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows", "eps"])
def _rms_norm_backward_kernel(
    dy_ptr, dy_stride, x_ptr, x_stride, w_ptr, dres_ptr, dres_stride, dx_ptr, dx_stride, dw_partial_ptr,
    n_rows, n_cols, eps, weight_offset,
    HAS_DRES: tl.constexpr, WEIGHT_GRAD: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    # A persistent grid: program p takes tiles p, p + P, p + 2P, ... of ROWS rows each, and sums its rows'
    # dy·n into an fp32 partial row of the weight gradient (its own row of dw_partial: no atomics).
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + weight_offset
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    n_tiles = tl.cdiv(n_rows, ROWS)
    for tile in tl.range(pid, n_tiles, n_programs, num_stages=NUM_STAGES):  # stages > 1: next tile's loads early
        rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * dy_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        n = x * rstd[:, None]
        g = dy * w[None, :]
        mean_gn = tl.sum(g * n, axis=1) / n_cols
        dx = rstd[:, None] * (g - n * mean_gn[:, None])
        if HAS_DRES:
            dx += tl.load(dres_ptr + rows[:, None] * dres_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + rows[:, None] * dx_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if WEIGHT_GRAD:
            dw += tl.sum(dy * n, axis=0)
    if WEIGHT_GRAD:
        tl.store(dw_partial_ptr + pid.to(tl.int64) * n_cols + cols, dw, mask=col_mask)


@triton.jit
def _sum_rows_kernel(partial_ptr, out_ptr, n_partials, n_cols, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # out[c] = Σ_p partial[p, c], the partial rows taken BLOCK_P at a time in order: the same sum every run.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < n_cols
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for start in range(0, n_partials, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)
        mask = (p < n_partials)[:, None] & col_mask[None, :]
        acc += tl.load(partial_ptr + p[:, None].to(tl.int64) * n_cols + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=col_mask)


def _launch_config(n_cols: int) -> tuple[int, int, int]:
    """(ROWS_PER_PROGRAM, BLOCK_N, num_warps): a whole row in registers, 8 warps from 4096 wide (swept on an
    H200: benchmarks/tune_launch.py); rows narrower than 1024 share a program."""
    block_n = next_power_of_2(n_cols)
    rows_per_program = max(1, min(8, 1024 // block_n))
    num_warps = min(32, max(1, rows_per_program * block_n // 512))
    return rows_per_program, block_n, num_warps


@functools.cache
def _dependent_launch_capable(index: int) -> bool:
    # griddepcontrol is PTX of sm_90 on; ROCm reports some AMD GPUs as (9, x) too.
    return torch.version.hip is None and torch.cuda.get_device_capability(index) >= (9, 0)


def dependent_launch(device: torch.device) -> bool:
    """Whether the forward kernel launches on `device` as a programmatic dependent launch (PDL): an NVIDIA GPU
    of SM90 or later, not under Triton's interpreter, unless SK_NORM_PDL=0. Its prologue then overlaps the tail
    of the kernel before it, and a dependent-launched kernel after it (SGLang's, our gated MLP's) overlaps its
    own tail: inside an engine's CUDA graph, a launch gap saved per kernel boundary."""
    if device.type != "cuda" or not settings.get("norm_pdl") or settings.get("triton_interpret"):
        return False
    return _dependent_launch_capable(device.index if device.index is not None else torch.cuda.current_device())


def _launch(x2, w, y2, eps, weight_offset, res2=None, res_out2=None) -> None:
    n_rows, n_cols = x2.shape
    if n_rows == 0 or n_cols == 0:
        return
    rows_per_program, block_n, num_warps = _launch_config(n_cols)
    has_res = res2 is not None
    pdl = dependent_launch(x2.device)
    _rms_norm_kernel[(cdiv(n_rows, rows_per_program),)](
        x2, x2.stride(0), res2 if has_res else x2, res2.stride(0) if has_res else 0, w.contiguous(),
        y2, y2.stride(0), res_out2 if has_res else y2, res_out2.stride(0) if has_res else 0,
        n_rows, n_cols, eps, weight_offset,
        HAS_RESIDUAL=has_res, ROWS_PER_PROGRAM=rows_per_program, BLOCK_N=block_n, PDL=pdl, num_warps=num_warps,
        launch_pdl=pdl,
    )


# The launcher without checks, for ops that run this kernel inside their own (`fused_gated_mlp` above its fused
# kernels' rows): 2-D views with unit stride along the last dim; residual in and out together or neither.
launch = _launch


# The backward's launch: a persistent grid of BACKWARD_PROGRAMS_PER_SM programs per SM, its row loop
# software-pipelined BACKWARD_NUM_STAGES deep (the next tile's loads issued early); a tile holds
# max(1, BACKWARD_TILE_ELEMENTS // BLOCK_N) rows, one warp per BACKWARD_ELEMENTS_PER_WARP of its elements. The
# fastest of the launches two runs of `benchmarks/bench_training_ops.py --sweep` timed on an H200 at 16384 and
# 32768 x 4096 (results/h200/ops/README.md, 2026-12-03: 1.7-2.1x the launch before, then 1.6x that with 3 stages
# and the narrow sum below). The weight-gradient partial rows are
# P x N fp32, written and read once: < 1% of the traffic at 32768 x 4096 bf16.
BACKWARD_PROGRAMS_PER_SM = 2
BACKWARD_NUM_STAGES = 3
# Each stage past the first buffers a tile of the inputs in shared memory: the stages are cut until they fit in
# this many bytes (two programs per SM then fit in an H200's 228 KB), down to 1 (65536-wide rows: no pipelining).
BACKWARD_PIPELINE_BYTES = 64 * 1024
BACKWARD_TILE_ELEMENTS = 2048
BACKWARD_ELEMENTS_PER_WARP = 512
# The weight gradient's sum over the P partial rows: one program per BACKWARD_SUM_COLUMNS columns, adding
# up to 4096 / BACKWARD_SUM_COLUMNS partial rows a step. Its steps are a chain of dependent loads, so few wide column
# blocks (4 programs at 4096 wide, 8 rows a step, as before) leave it latency-bound; narrow blocks spread it.
BACKWARD_SUM_COLUMNS = 64
# Under Triton's interpreter (CPU tests) a fixed count: several programs, so the partial-row sum is exercised.
INTERPRETED_PROGRAMS = 3


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _backward_programs(n_tiles: int, device: torch.device) -> int:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return max(1, min(n_tiles, BACKWARD_PROGRAMS_PER_SM * _sm_count(index)))
    return max(1, min(n_tiles, INTERPRETED_PROGRAMS))


def _backward_launch_config(n_cols: int) -> tuple[int, int, int]:
    """(ROWS, BLOCK_N, num_warps): a whole row in registers as in the forward; narrow rows share a tile."""
    block_n = next_power_of_2(n_cols)
    rows = max(1, min(16, BACKWARD_TILE_ELEMENTS // block_n))
    num_warps = min(32, max(1, rows * block_n // BACKWARD_ELEMENTS_PER_WARP))
    return rows, block_n, num_warps


def backward_stages(rows: int, block_n: int, input_bytes: int) -> int:
    """The pipeline depth: BACKWARD_NUM_STAGES, less while the buffered tiles ((stages - 1) x rows x block_n
    elements of every input, input_bytes per element of all of them) exceed BACKWARD_PIPELINE_BYTES."""
    stages = BACKWARD_NUM_STAGES
    while stages > 1 and (stages - 1) * rows * block_n * input_bytes > BACKWARD_PIPELINE_BYTES:
        stages -= 1
    return stages


def _launch_backward(dy2, x2, w, dx2, eps, weight_offset, dres2=None, dw=None) -> None:
    """dx2 ← the input gradient; dw (when given, in the weight's dtype) ← the weight gradient."""
    n_rows, n_cols = x2.shape
    if n_cols == 0:
        return
    if n_rows == 0:
        if dw is not None:
            dw.zero_()
        return
    rows, block_n, num_warps = _backward_launch_config(n_cols)
    programs = _backward_programs(cdiv(n_rows, rows), x2.device)
    partial = torch.empty((programs, n_cols), dtype=torch.float32, device=x2.device) if dw is not None else dx2
    has_dres = dres2 is not None
    input_bytes = x2.element_size() + dy2.element_size() + (dres2.element_size() if has_dres else 0)
    _rms_norm_backward_kernel[(programs,)](
        dy2, dy2.stride(0), x2, x2.stride(0), w.contiguous(),
        dres2 if has_dres else dy2, dres2.stride(0) if has_dres else 0,
        dx2, dx2.stride(0), partial, n_rows, n_cols, eps, weight_offset,
        HAS_DRES=has_dres, WEIGHT_GRAD=dw is not None, ROWS=rows, BLOCK_N=block_n,
        NUM_STAGES=backward_stages(rows, block_n, input_bytes),
        num_warps=num_warps,
    )
    if dw is not None:
        block_c = min(BACKWARD_SUM_COLUMNS, next_power_of_2(n_cols))
        block_p = max(1, min(4096 // block_c, next_power_of_2(programs)))
        _sum_rows_kernel[(cdiv(n_cols, block_c),)](
            partial, dw, programs, n_cols, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=4)


# ----------------------------------------------------------------------------------------------- references

def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    """The PyTorch op the kernel replaces: fallback, test oracle and benchmark baseline."""
    xf = x.float() if x.dtype != torch.float64 else x
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * (weight.to(xf.dtype) + weight_offset)).to(x.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    residual_out = (x.float() + residual.float()).to(x.dtype) if x.dtype != torch.float64 else x + residual
    return rms_norm_reference(residual_out, weight, eps, weight_offset), residual_out


def rms_norm_backward_reference(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0,
    residual_grad: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward kernel's PyTorch twin (fallback and baseline): (dx, dweight) of `rms_norm_reference` at x for
    the output gradient dy, plus `residual_grad` (the fused forms' gradient of their residual output) in dx.
    Computed in fp32 (fp64 for fp64); dx in x's dtype, dweight in the weight's."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf, dyf = x.to(acc), dy.to(acc)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    n = xf * rstd
    g = dyf * (weight.to(acc) + weight_offset)
    dx = rstd * (g - n * (g * n).mean(-1, keepdim=True))
    if residual_grad is not None:
        dx = dx + residual_grad.to(acc)
    dw = dyf * n
    dw = dw.sum(tuple(range(x.dim() - 1))) if x.dim() > 1 else dw
    return dx.to(x.dtype), dw.to(weight.dtype)


# ----------------------------------------------------------------------------------------------- custom ops

def _coverage_name(base: str, weight_offset: float) -> str:
    return f"gemma_{base}" if weight_offset == GEMMA_OFFSET else base


def _shape_miss(name: str, n_cols: int) -> str | None:
    return coverage.limit_miss("hidden size", n_cols, coverage.table()[name].limits.get("max_hidden"))


def _rms_norm_impl(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
    name = _coverage_name("rms_norm", weight_offset)
    if not coverage.decide(name, (x, weight), shape_miss=_shape_miss(name, x.shape[-1])):
        return rms_norm_reference(x, weight, eps, weight_offset)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(rows_view(x), weight, rows_view(y), eps, weight_offset)
    return y


_rms_norm_op = LibraryOp("sk::rms_norm", _rms_norm_impl)


@_rms_norm_op.register_fake
def _(x, weight, eps, weight_offset):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)




def _rms_norm_backward_impl(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, residual_grad: Optional[torch.Tensor], eps: float,
    weight_offset: float, fused: bool, weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) of the norms; `x` is what was normalized (the fused forms' residual output) and
    `residual_grad` the gradient of that residual output. dweight is empty unless `weight_grad`."""
    name = _coverage_name("fused_add_rms_norm" if fused else "rms_norm", weight_offset)
    tensors = (x, dy, weight) if residual_grad is None else (x, dy, residual_grad, weight)
    if not coverage.decide(name, tensors, shape_miss=_shape_miss(name, x.shape[-1]), backward=True):
        dx, dw = rms_norm_backward_reference(dy, x, weight, eps, weight_offset, residual_grad)
        return dx.contiguous(), dw if weight_grad else weight.new_empty(0)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = torch.empty(weight.shape if weight_grad else 0, dtype=weight.dtype, device=weight.device)
    _launch_backward(rows_view(dy), rows_view(x), weight, rows_view(dx), eps, weight_offset,
                     None if residual_grad is None else rows_view(residual_grad), dw if weight_grad else None)
    return dx, dw


_rms_norm_backward_op = LibraryOp("sk::rms_norm_backward", _rms_norm_backward_impl)


_norm_backward = direct_or_op(_rms_norm_backward_op, _rms_norm_backward_impl)


@_rms_norm_backward_op.register_fake
def _(dy, x, weight, residual_grad, eps, weight_offset, fused, weight_grad):
    return x.new_empty(x.shape), weight.new_empty(weight.shape if weight_grad else 0)


def _rms_norm_setup_context(ctx, inputs, output):
    # Only called when a gradient is wanted (torch runs the op without autograd state otherwise): inference
    # saves nothing. rstd is recomputed from x in the backward, where x is read anyway.
    x, weight, ctx.eps, ctx.weight_offset = inputs
    ctx.save_for_backward(x, weight)
    coverage.note_forward(ctx)


def _rms_norm_backward(ctx, dy):
    x, weight = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[:2]
    with coverage.backward_of(ctx):
        dx, dw = _norm_backward(dy, x, weight, None, ctx.eps, ctx.weight_offset, False, need_w)
    return dx if need_x else None, dw if need_w else None, None, None


_rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup_context)


_rms_norm = eager_or_op(_rms_norm_op, _rms_norm_impl, _rms_norm_setup_context, _rms_norm_backward)


def _fused_add_rms_norm_impl(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    name = _coverage_name("fused_add_rms_norm", weight_offset)
    if not coverage.decide(name, (x, residual, weight), shape_miss=_shape_miss(name, x.shape[-1])):
        return fused_add_rms_norm_reference(x, residual, weight, eps, weight_offset)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(rows_view(x), weight, rows_view(y), eps, weight_offset, rows_view(residual), rows_view(res_out))
    return y, res_out


_fused_add_rms_norm_op = LibraryOp("sk::fused_add_rms_norm", _fused_add_rms_norm_impl)


@_fused_add_rms_norm_op.register_fake
def _(x, residual, weight, eps, weight_offset):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(
        x, memory_format=torch.contiguous_format)




def _fused_add_rms_norm_setup_context(ctx, inputs, output):
    # The backward needs what was normalized, h = x + residual: the residual output, kept alive by the model
    # anyway. Gradients flow through the rounding of h to the dtype as through an identity (as autograd of
    # the reference has it).
    _, _, weight, ctx.eps, ctx.weight_offset = inputs
    ctx.save_for_backward(output[1], weight)
    coverage.note_forward(ctx)


def _fused_add_rms_norm_backward(ctx, dy, dh):
    h, weight = ctx.saved_tensors
    need_x, need_r, need_w = ctx.needs_input_grad[:3]
    with coverage.backward_of(ctx):
        dx, dw = _norm_backward(dy, h, weight, dh, ctx.eps, ctx.weight_offset, True, need_w)
    # d/dx and d/dresidual of h = x + residual are the same tensor, as torch's add gives both.
    return dx if need_x else None, dx if need_r else None, dw if need_w else None, None, None


_fused_add_rms_norm_op.register_autograd(_fused_add_rms_norm_backward, setup_context=_fused_add_rms_norm_setup_context)


_fused_add_rms_norm = eager_or_op(_fused_add_rms_norm_op, _fused_add_rms_norm_impl,
                                  _fused_add_rms_norm_setup_context, _fused_add_rms_norm_backward)


def _fused_add_rms_norm_inplace_impl(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
) -> None:
    name = _coverage_name("fused_add_rms_norm", weight_offset)
    if not coverage.decide(name, (x, residual, weight), shape_miss=_shape_miss(name, x.shape[-1])):
        y, res_out = fused_add_rms_norm_reference(x, residual, weight, eps, weight_offset)
        residual.copy_(res_out)
        x.copy_(y)
        return
    x2, r2 = rows_view(x), rows_view(residual)
    # Each program reads its rows before writing them, so outputs may alias inputs.
    _launch(x2, weight, x2, eps, weight_offset, r2, r2)
    # rows_view copies only when the leading dims cannot be flattened; then the results are written back.
    if x2.data_ptr() != x.data_ptr():
        x.copy_(x2.view(x.shape))
    if r2.data_ptr() != residual.data_ptr():
        residual.copy_(r2.view(residual.shape))


_fused_add_rms_norm_inplace_op = LibraryOp("sk::fused_add_rms_norm_", _fused_add_rms_norm_inplace_impl,
                                           mutates_args=("x", "residual"))


refuse_autograd_of_mutating_op(
    _fused_add_rms_norm_inplace_op,
    "sk.ops.fused_add_rms_norm_ / sk.ops.gemma_fused_add_rms_norm_, which record the write, or their functional forms")


# ----------------------------------------------------------------------------------------------- functional API

def _check(op: str, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> None:
    check_float(op, "x", x)
    check_float(op, "weight", weight)
    names, tensors = ["x", "weight"], [x, weight]
    if residual is not None:
        check_float(op, "residual", residual)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(
                f"sk.ops.{op}: residual must match x; got residual {tuple(residual.shape)} {residual.dtype}, "
                f"x {tuple(x.shape)} {x.dtype}"
            )
        names.append("residual")
        tensors.append(residual)
    check_same_device(op, names, tensors)
    if x.dim() == 0 or weight.shape != (x.shape[-1],):
        raise ValueError(
            f"sk.ops.{op}: weight must have shape (N,) with N = x.shape[-1]; got weight {tuple(weight.shape)}, "
            f"x {tuple(x.shape)}"
        )
    if not eps >= 0:
        raise ValueError(f"sk.ops.{op}: eps must be a non-negative float, got {eps!r}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x², -1) + eps) · weight, over the last dimension (fp32 statistics)."""
    _check("rms_norm", x, weight, eps)
    return _rms_norm(x, weight, float(eps), 0.0)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x², -1) + eps) · (1 + weight): Gemma's RMSNorm, whose weight is stored as an offset."""
    _check("gemma_rms_norm", x, weight, eps)
    return _rms_norm(x, weight, float(eps), GEMMA_OFFSET)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; returns (rms_norm(h) · weight, h), with h rounded to x's dtype before normalizing."""
    _check("fused_add_rms_norm", x, weight, eps, residual)
    return _fused_add_rms_norm(x, residual, weight, float(eps), 0.0)


def _fused_add_rms_norm_in_place(op: str, x, residual, weight, eps, weight_offset) -> None:
    _check(op, x, weight, eps, residual)
    if torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad or weight.requires_grad):
        # Mutating custom ops get no autograd: the functional op runs on copies (its saved inputs), copy_ records.
        check_writable(op, ("x", "residual"), (x, residual), op.removesuffix("_"))
        y, res_out = _fused_add_rms_norm(x.clone(), residual.clone(), weight, float(eps), weight_offset)
        residual.copy_(res_out)
        x.copy_(y)
        return
    _fused_add_rms_norm_inplace_op.run(x, residual, weight, float(eps), weight_offset)


def fused_add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
    """In place, as engines call it: residual ← x + residual, then x ← rms_norm(residual) · weight.

    Differentiable like torch's in-place ops: with grad mode on and an input that requires grad, the write is
    recorded in x's and residual's autograd history (and refused into a leaf that requires grad)."""
    _fused_add_rms_norm_in_place("fused_add_rms_norm_", x, residual, weight, eps, 0.0)


def gemma_fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; returns (rms_norm(h) · (1 + weight), h)."""
    _check("gemma_fused_add_rms_norm", x, weight, eps, residual)
    return _fused_add_rms_norm(x, residual, weight, float(eps), GEMMA_OFFSET)


def gemma_fused_add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> None:
    """In place: residual ← x + residual, then x ← rms_norm(residual) · (1 + weight); differentiable as
    `fused_add_rms_norm_`."""
    _fused_add_rms_norm_in_place("gemma_fused_add_rms_norm_", x, residual, weight, eps, GEMMA_OFFSET)
