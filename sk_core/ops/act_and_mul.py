"""Gated activations of LLM MLPs: SiLU-and-mul (SwiGLU) and GELU-and-mul (GEGLU), as one Triton kernel.

    x = [g, u] along the last dimension (gate first, then up, each d wide)
    y = act(g) · u,        act = silu(g) = g·sigmoid(g)
                                 gelu(g) = g/2 · (1 + erf(g/√2))                        (approximate="none")
                                 gelu(g) = g/2 · (1 + tanh(√(2/π)·(g + 0.044715·g³)))   (approximate="tanh")

Computed in fp32 and rounded once. vLLM's `GeluAndMul` defaults to erf and SGLang's to tanh; both are here.

The backward is one Triton kernel as well, registered as the custom op's autograd formula: it reads x and dy and
writes dx = [dy · u · act'(g), dy · act(g)], recomputing act(g) from the saved input (no extra forward output).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sk import coverage
from sk.ops._common import (
    LibraryOp,
    cdiv,
    check_float,
    check_same_device,
    direct_or_op,
    eager_or_op,
    next_power_of_2,
    refuse_autograd_of_mutating_op,
    refuse_out_autograd,
    rows_view,
)

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
# Kernels may read module globals only when they are constexpr.
_SQRT_HALF = tl.constexpr(0.7071067811865476)
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
_GELU_TANH_CUBIC = tl.constexpr(0.044715)


# ----------------------------------------------------------------------------------------------- kernel

@triton.jit
def _erf(x):
    # Abramowitz & Stegun 7.1.26: |error| < 1.5e-7, i.e. fp32 precision, with one exp and one division.
    # libdevice's erf costs enough instructions to make erf-GELU compute-bound on an H200.
    t = 1.0 / (1.0 + 0.3275911 * tl.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    y = 1.0 - poly * tl.exp(-x * x)
    return tl.where(x < 0, -y, y)


@triton.jit
def activate(g, ACT: tl.constexpr):
    """act(g) in fp32 for ACT "silu", "gelu" (erf) or "gelu_tanh"; the gated-MLP kernels call it too."""
    if ACT == "silu":
        return g * tl.sigmoid(g)
    elif ACT == "gelu":
        return 0.5 * g * (1.0 + _erf(g * _SQRT_HALF))
    else:
        # tanh(z) = 2·sigmoid(2z) − 1: exact in fp32 and available in Triton's interpreter too.
        z = _SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
        return g * tl.sigmoid(2.0 * z)  # = g/2 · (1 + tanh(z))


@triton.jit(do_not_specialize=["n_rows"])
def _act_and_mul_kernel(x_ptr, x_stride, y_ptr, y_stride, n_rows, d, ACT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * y_stride + cols, (activate(g, ACT) * u).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows"])
def _act_and_mul_backward_kernel(
    dy_ptr, dy_stride, x_ptr, x_stride, dx_ptr, dx_stride, n_rows, d, ACT: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == "silu":
        s = tl.sigmoid(g)
        a = g * s
        da = s * (1.0 + g * (1.0 - s))
    elif ACT == "gelu":
        cdf = 0.5 * (1.0 + _erf(g * _SQRT_HALF))
        a = g * cdf
        da = cdf + g * tl.exp(-0.5 * g * g) * _INV_SQRT_2PI
    else:
        # a = g·s with s = sigmoid(2z) = (1 + tanh z)/2, so a' = s + 2·g·s·(1 − s)·z'.
        z = _SQRT_2_OVER_PI * (g + _GELU_TANH_CUBIC * g * g * g)
        s = tl.sigmoid(2.0 * z)
        a = g * s
        da = s + 2.0 * g * s * (1.0 - s) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_CUBIC * g * g)
    tl.store(dx_ptr + row * dx_stride + cols, (dy * u * da).to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dx_ptr + row * dx_stride + d + cols, (dy * a).to(dx_ptr.dtype.element_ty), mask=mask)


# Below this many outputs a launch has too few programs to fill the GPU with 2048-wide blocks (decode-sized
# batches): smaller blocks spread it over more SMs. Swept on an H200 (benchmarks/tune_launch.py).
SMALL_PROBLEM = 1 << 20


# Above SMALL_PROBLEM, SiLU's rows wider than 2048 take one block of up to 16384 columns at 16 elements a thread:
# at 16384 × 14336 bf16, 322 µs against 336 µs for (2048, 8 warps) (results/h200/ops, 2026-12-03, third pass).
# The GELU forwards were not timed with it and keep (2048, 8).
LARGE_BLOCK = 16384


def launch_config(n_rows: int, d: int, activation: str = "silu") -> tuple[int, int]:
    """(BLOCK, num_warps): 8 contiguous elements per thread (16-byte bf16 accesses); 16 in SiLU's wide blocks."""
    if n_rows * d <= SMALL_PROBLEM:
        block = min(512, next_power_of_2(d))
    else:
        block = min(LARGE_BLOCK if activation == "silu" else 2048, next_power_of_2(d))
        if block > 2048:
            return block, min(32, block // 512)
    return block, max(1, min(8, block // 256))


def _launch(x2: torch.Tensor, y2: torch.Tensor, activation: str) -> None:
    n_rows, d = y2.shape
    if n_rows == 0 or d == 0:
        return
    block, num_warps = launch_config(n_rows, d, activation)
    _act_and_mul_kernel[(n_rows, cdiv(d, block))](
        x2, x2.stride(0), y2, y2.stride(0), n_rows, d, ACT=activation, BLOCK=block, num_warps=num_warps
    )


# The launcher without checks, for ops that run this kernel inside their own (`fused_pre_norm_geglu`'s training
# forward): 2-D views with unit stride along the last dim; activation "silu", "gelu" or "gelu_tanh".
launch = _launch


# The backward's block and warps above SMALL_PROBLEM (below it, the forward's launch): it reads three streams and
# writes two, so it is timed apart from the forward (`benchmarks/bench_training_ops.py --sweep`, results/h200/ops).
# Erf GELU's backward (two exps and a division an element) was slower with them: it keeps the forward's launch.
BACKWARD_BLOCK = 8192
BACKWARD_NUM_WARPS = 16


def _backward_launch_config(n_rows: int, d: int, activation: str) -> tuple[int, int]:
    if n_rows * d <= SMALL_PROBLEM or activation == "gelu":
        return launch_config(n_rows, d, activation)
    block = min(BACKWARD_BLOCK, next_power_of_2(d))
    return block, max(1, min(BACKWARD_NUM_WARPS, block // 256))  # narrow rows: fewer warps, as the forward's


def _launch_backward(dy2: torch.Tensor, x2: torch.Tensor, dx2: torch.Tensor, activation: str) -> None:
    n_rows, d = dy2.shape
    if n_rows == 0 or d == 0:
        return
    block, num_warps = _backward_launch_config(n_rows, d, activation)
    _act_and_mul_backward_kernel[(n_rows, cdiv(d, block))](
        dy2, dy2.stride(0), x2, x2.stride(0), dx2, dx2.stride(0), n_rows, d, ACT=activation, BLOCK=block,
        num_warps=num_warps,
    )


# ----------------------------------------------------------------------------------------------- reference

def act_and_mul_reference(x: torch.Tensor, activation: str) -> torch.Tensor:
    """The PyTorch op the kernel replaces: fallback, test oracle and benchmark baseline."""
    d = x.shape[-1] // 2
    xf = x.float() if x.dtype != torch.float64 else x
    g, u = xf[..., :d], xf[..., d:]
    if activation == "silu":
        a = torch.nn.functional.silu(g)
    else:
        a = torch.nn.functional.gelu(g, approximate="tanh" if activation == "gelu_tanh" else "none")
    return (a * u).to(x.dtype)


def act_and_mul_backward_reference(dy: torch.Tensor, x: torch.Tensor, activation: str) -> torch.Tensor:
    """The backward kernel's PyTorch twin (fallback and baseline): dx of `act_and_mul_reference` at x for the
    output gradient dy, from the derivatives' formulas in fp32 (fp64 for fp64), in x's dtype."""
    d = x.shape[-1] // 2
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf, dyf = x.to(acc), dy.to(acc)
    g, u = xf[..., :d], xf[..., d:]
    if activation == "silu":
        s = torch.sigmoid(g)
        a, da = g * s, s * (1 + g * (1 - s))
    elif activation == "gelu":
        cdf = 0.5 * (1 + torch.special.erf(g * 0.7071067811865476))
        a, da = g * cdf, cdf + g * torch.exp(-0.5 * g * g) * 0.3989422804014327
    else:
        c = 0.7978845608028654
        s = torch.sigmoid(2 * c * (g + 0.044715 * g ** 3))
        a, da = g * s, s + 2 * g * s * (1 - s) * c * (1 + 3 * 0.044715 * g * g)
    return torch.cat([dyf * u * da, dyf * a], -1).to(x.dtype)


# ----------------------------------------------------------------------------------------------- custom ops

def _coverage_name(activation: str) -> str:
    return "silu_and_mul" if activation == "silu" else "gelu_and_mul"


def _out_shape(x: torch.Tensor) -> tuple[int, ...]:
    return (*x.shape[:-1], x.shape[-1] // 2)


def _compute_into(y: torch.Tensor, x: torch.Tensor, activation: str) -> None:
    if not coverage.decide(_coverage_name(activation), (x,)):
        y.copy_(act_and_mul_reference(x, activation))
        return
    y2 = rows_view(y)
    _launch(rows_view(x), y2, activation)
    if y2.data_ptr() != y.data_ptr():  # `out` was not viewable as rows: write the result back
        y.copy_(y2.view(y.shape))


def _act_and_mul_impl(x: torch.Tensor, activation: str) -> torch.Tensor:
    y = torch.empty(_out_shape(x), dtype=x.dtype, device=x.device)
    _compute_into(y, x, activation)
    return y


_act_and_mul_op = LibraryOp("sk::act_and_mul", _act_and_mul_impl)


@_act_and_mul_op.register_fake
def _(x, activation):
    return x.new_empty(_out_shape(x))




def _act_and_mul_backward_impl(dy: torch.Tensor, x: torch.Tensor, activation: str) -> torch.Tensor:
    if not coverage.decide(_coverage_name(activation), (x, dy), backward=True):
        return act_and_mul_backward_reference(dy, x, activation).contiguous()
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch_backward(rows_view(dy), rows_view(x), rows_view(dx), activation)
    return dx


_act_and_mul_backward_op = LibraryOp("sk::act_and_mul_backward", _act_and_mul_backward_impl)


_act_and_mul_backward = direct_or_op(_act_and_mul_backward_op, _act_and_mul_backward_impl)


@_act_and_mul_backward_op.register_fake
def _(dy, x, activation):
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output):
    # Only called when a gradient is wanted: inference saves nothing.
    x, ctx.activation = inputs
    ctx.save_for_backward(x)
    coverage.note_forward(ctx)


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    with coverage.backward_of(ctx):
        return _act_and_mul_backward(dy, x, ctx.activation), None


_act_and_mul_op.register_autograd(_backward, setup_context=_setup_context)


_act_and_mul_call = eager_or_op(_act_and_mul_op, _act_and_mul_impl, _setup_context, _backward)


def _act_and_mul_out_impl(out: torch.Tensor, x: torch.Tensor, activation: str) -> None:
    _compute_into(out, x, activation)


_act_and_mul_out_op = LibraryOp("sk::act_and_mul_out", _act_and_mul_out_impl, mutates_args=("out",))


refuse_autograd_of_mutating_op(_act_and_mul_out_op, "sk.ops.silu_and_mul / sk.ops.gelu_and_mul without out=")


# ----------------------------------------------------------------------------------------------- functional API

def _act_and_mul(op: str, x: torch.Tensor, activation: str, out: torch.Tensor | None) -> torch.Tensor:
    check_float(op, "x", x)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"sk.ops.{op}: x's last dimension must be even ([gate, up] halves); got x {tuple(x.shape)}")
    if out is None:
        return _act_and_mul_call(x, activation)
    check_float(op, "out", out)
    check_same_device(op, ("x", "out"), (x, out))
    if tuple(out.shape) != _out_shape(x) or out.dtype != x.dtype:
        raise ValueError(
            f"sk.ops.{op}: out must have shape {_out_shape(x)} and dtype {x.dtype}; "
            f"got {tuple(out.shape)} {out.dtype}"
        )
    refuse_out_autograd(op, ("x", "out"), (x, out))
    _act_and_mul_out_op.run(out, x, activation)
    return out


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = silu(x[..., :d]) · x[..., d:] with d = x.shape[-1] / 2; written into `out` when given."""
    return _act_and_mul("silu_and_mul", x, "silu", out)


def gelu_and_mul(x: torch.Tensor, approximate: str = "none", out: torch.Tensor | None = None) -> torch.Tensor:
    """y = gelu(x[..., :d]) · x[..., d:], exact (erf) GELU or approximate="tanh"; written into `out` when given."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"sk.ops.gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _act_and_mul("gelu_and_mul", x, "gelu_tanh" if approximate == "tanh" else "gelu", out)
