"""RMSNorm, Gemma's RMSNorm, and both fused with the residual add, as one Triton kernel.

    y = x / sqrt(mean(x**2) + eps) * (weight + offset)        offset = 0 (RMSNorm) or 1 (Gemma)

With a residual, `x` is first replaced by `x + residual` rounded to the input dtype; that rounded sum is both
the new residual and what gets normalized, as vLLM's and SGLang's kernels do, so the next layer sees exactly
the residual that was normalized here. Statistics and the scaling are computed in fp32; each output is
rounded once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sk import coverage
from sk.ops._common import (
    attach_reference_backward,
    check_float,
    check_same_device,
    check_writable,
    refuse_autograd_of_mutating_op,
    rows_view,
)

GEMMA_OFFSET = 1.0


# ----------------------------------------------------------------------------------------------- kernel

@triton.jit(do_not_specialize=["n_rows", "eps"])
def _rms_norm_kernel(
    x_ptr, x_stride, res_ptr, res_stride, w_ptr, y_ptr, y_stride, res_out_ptr, res_out_stride,
    n_rows, n_cols, eps, weight_offset,
    HAS_RESIDUAL: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # `n_rows` is not specialized so that one compiled kernel serves every batch size (engines capture CUDA
    # graphs for many of them). Narrow rows share a program; each row is a 1-D block held in registers.
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


def _launch_config(n_cols: int) -> tuple[int, int, int]:
    """(ROWS_PER_PROGRAM, BLOCK_N, num_warps): a whole row in registers, 8 warps from 4096 wide (swept on an
    H200: benchmarks/tune_launch.py); rows narrower than 1024 share a program."""
    block_n = triton.next_power_of_2(n_cols)
    rows_per_program = max(1, min(8, 1024 // block_n))
    num_warps = min(32, max(1, rows_per_program * block_n // 512))
    return rows_per_program, block_n, num_warps


def _launch(x2, w, y2, eps, weight_offset, res2=None, res_out2=None) -> None:
    n_rows, n_cols = x2.shape
    if n_rows == 0 or n_cols == 0:
        return
    rows_per_program, block_n, num_warps = _launch_config(n_cols)
    has_res = res2 is not None
    _rms_norm_kernel[(triton.cdiv(n_rows, rows_per_program),)](
        x2, x2.stride(0), res2 if has_res else x2, res2.stride(0) if has_res else 0, w,
        y2, y2.stride(0), res_out2 if has_res else y2, res_out2.stride(0) if has_res else 0,
        n_rows, n_cols, eps, weight_offset,
        HAS_RESIDUAL=has_res, ROWS_PER_PROGRAM=rows_per_program, BLOCK_N=block_n, num_warps=num_warps,
    )


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


# ----------------------------------------------------------------------------------------------- custom ops

def _coverage_name(base: str, weight_offset: float) -> str:
    return f"gemma_{base}" if weight_offset == GEMMA_OFFSET else base


def _shape_miss(name: str, n_cols: int) -> str | None:
    return coverage.limit_miss("hidden size", n_cols, coverage.table()[name].limits.get("max_hidden"))


@torch.library.custom_op("sk::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
    name = _coverage_name("rms_norm", weight_offset)
    if not coverage.decide(name, (x, weight), shape_miss=_shape_miss(name, x.shape[-1])):
        return rms_norm_reference(x, weight, eps, weight_offset)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(rows_view(x), weight, rows_view(y), eps, weight_offset)
    return y


@_rms_norm_op.register_fake
def _(x, weight, eps, weight_offset):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


attach_reference_backward(_rms_norm_op, lambda args: _coverage_name("rms_norm", args[3]), rms_norm_reference)


@torch.library.custom_op("sk::fused_add_rms_norm", mutates_args=())
def _fused_add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    name = _coverage_name("fused_add_rms_norm", weight_offset)
    if not coverage.decide(name, (x, residual, weight), shape_miss=_shape_miss(name, x.shape[-1])):
        return fused_add_rms_norm_reference(x, residual, weight, eps, weight_offset)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(rows_view(x), weight, rows_view(y), eps, weight_offset, rows_view(residual), rows_view(res_out))
    return y, res_out


@_fused_add_rms_norm_op.register_fake
def _(x, residual, weight, eps, weight_offset):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(
        x, memory_format=torch.contiguous_format)


attach_reference_backward(
    _fused_add_rms_norm_op, lambda args: _coverage_name("fused_add_rms_norm", args[4]), fused_add_rms_norm_reference)


@torch.library.custom_op("sk::fused_add_rms_norm_", mutates_args=("x", "residual"))
def _fused_add_rms_norm_inplace_op(
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
    return _rms_norm_op(x, weight, float(eps), 0.0)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x², -1) + eps) · (1 + weight): Gemma's RMSNorm, whose weight is stored as an offset."""
    _check("gemma_rms_norm", x, weight, eps)
    return _rms_norm_op(x, weight, float(eps), GEMMA_OFFSET)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; returns (rms_norm(h) · weight, h), with h rounded to x's dtype before normalizing."""
    _check("fused_add_rms_norm", x, weight, eps, residual)
    return _fused_add_rms_norm_op(x, residual, weight, float(eps), 0.0)


def _fused_add_rms_norm_in_place(op: str, x, residual, weight, eps, weight_offset) -> None:
    _check(op, x, weight, eps, residual)
    if torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad or weight.requires_grad):
        # Mutating custom ops get no autograd: the functional op runs on copies (its saved inputs), copy_ records.
        check_writable(op, ("x", "residual"), (x, residual), op.removesuffix("_"))
        y, res_out = _fused_add_rms_norm_op(x.clone(), residual.clone(), weight, float(eps), weight_offset)
        residual.copy_(res_out)
        x.copy_(y)
        return
    _fused_add_rms_norm_inplace_op(x, residual, weight, float(eps), weight_offset)


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
    return _fused_add_rms_norm_op(x, residual, weight, float(eps), GEMMA_OFFSET)


def gemma_fused_add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> None:
    """In place: residual ← x + residual, then x ← rms_norm(residual) · (1 + weight); differentiable as
    `fused_add_rms_norm_`."""
    _fused_add_rms_norm_in_place("gemma_fused_add_rms_norm_", x, residual, weight, eps, GEMMA_OFFSET)
