"""`sk.ops.linear`: one projection, out = x @ weightᵀ (+ bias), by cuBLAS or on request the family's split-K kernel.

At a few rows a projection is a weight stream: Llama-3-8B's QKV projection reads 50 MB to produce 6144 numbers a
token. cuBLAS runs the engines' QKV and output projections there at 72–76 % of the weight-streaming floor plus a
separate split-K reduction kernel (results/h200/engines/README.md, 2026-12-03 profile); the gated MLP's down
kernel (`triton_kernels._down_kernel`: TMA loads, transposed product for few rows, K split over enough
programs to fill the GPU, the splits summed in a fixed order by the tile's last program) streams at 90 % of it.
This op offers that kernel on its own, for the projections outside the fused MLP block:

    out = x @ weightᵀ (+ bias)      x (..., K), weight [N, K], bias [N]; products accumulated in fp32, rounded once

With its table's configs the kernel is slower than cuBLAS at most projection shapes (0.7–1.0× at M ≤ 32, weights
read from HBM: results/h100/ops/README.md, 2026-12-06); tuned configs (`triton_kernels.LINEAR_TUNED`) beat it at
the shapes swept (Llama-3-8B's QKV and output projections at 1–8 rows: 1.01–1.02× and 1.09–1.12×). So
`backend="cublas"` (`torch.nn.functional.linear`) is the default, `backend="auto"` runs the kernel where a tuned
entry says it wins and cuBLAS elsewhere, and `backend="split_k"` asks for the kernel everywhere it covers. Dispatch: bf16/fp16 CUDA
tensors on SM90 (or CPU tensors under TRITON_INTERPRET=1) with N and K multiples of 8 run the chosen backend
(split_k: up to `LINEAR_MAX_M` rows, cuBLAS above them); anything else runs `linear_reference`, recorded under the
coverage row `linear` (an error under strict mode).
A weight in another dtype or layout is cast once (`weight_cache.cast`), never per call. Training: the backward is
autograd of the reference, recorded.
"""
from __future__ import annotations

import contextlib

import functools
from typing import Optional

import torch

from sk import coverage
from sk.ops import weight_cache
from sk.ops._common import FLOAT_DTYPES, LibraryOp, attach_reference_backward, check_float, check_same_device
from sk.ops.gated_mlp import triton_kernels
from sk.ops.gated_mlp.common import is_eager

OP = "linear"
BACKENDS = ("cublas", "split_k", "auto")


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weightᵀ (+ bias) in x's dtype, accumulated in fp32 (torch's bf16/fp16 matmul), as the engines'
    unquantized linear layers compute it; in fp64 the tests' oracle."""
    return torch.nn.functional.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))


@functools.lru_cache(maxsize=256)
def shape_miss(n: int, k: int) -> str | None:
    """Why an [n, k] weight is outside the kernel's coverage, or None."""
    align = triton_kernels.TMA_ALIGN
    if not n or not k:
        return f"an empty weight ({n} x {k})"
    if n % align or k % align:  # TMA: 16-byte rows of x, weight and out
        return f"N {n} and K {k} must be multiples of {align} (TMA needs 16-byte rows)"
    return None


def linear_kernel_miss(x: torch.Tensor, n: int, k: int) -> str | None:
    """Why a call on activations like `x` (its device and dtype) with an [n, k] weight would run the reference
    instead of the kernel, or None. Records nothing: for planning (the engine adapters decide per layer)."""
    return coverage.miss_reason(OP, x, shape_miss=shape_miss(n, k))


def _forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], backend: str) -> torch.Tensor:
    """x is 2-D and contiguous."""
    n, k = weight.shape
    tensors = [x, weight] + ([bias] if bias is not None else [])
    if not coverage.decide(OP, tensors, shape_miss=shape_miss(n, k)):
        return linear_reference(x, weight, bias)
    dtype = x.dtype
    w = weight_cache.cast(OP, weight, dtype)
    b = None if bias is None else weight_cache.cast(OP, bias, dtype)
    m = x.shape[0]
    if backend == "cublas" or m > triton_kernels.LINEAR_MAX_M or (
            backend == "auto" and not triton_kernels.linear_tuned(m, n, k)):
        return torch.nn.functional.linear(x, w, b)
    tma = triton_kernels.tma_ready
    return triton_kernels.linear_kernels(tma(x), tma(w), b)


_op = LibraryOp("sk::linear", _forward)


@_op.register_fake
def _(x, weight, bias, backend):
    return x.new_empty((x.shape[0], weight.shape[0]))


attach_reference_backward(_op, lambda inputs: OP, lambda x, weight, bias, backend: linear_reference(x, weight, bias))


def _check_args(x, weight, bias) -> None:
    """Raise a clear error naming the argument, its shape or dtype, and what is supported."""
    named = {"x": x, "weight": weight, "bias": bias}
    present = {name: t for name, t in named.items() if t is not None}
    for name in ("x", "weight"):
        if named[name] is None:
            raise TypeError(f"sk.ops.{OP}: {name} is required (got None)")
    for name, t in present.items():
        check_float(OP, name, t)
    check_same_device(OP, list(present), list(present.values()))
    if x.dim() == 0:
        raise ValueError(f"sk.ops.{OP}: x must be (..., K); got a 0-d tensor")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"sk.ops.{OP}: weight must be (N, K) with K = x's last dim {x.shape[-1]}; got weight "
                         f"{tuple(weight.shape)} for x {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"sk.ops.{OP}: bias must be (N,) = ({weight.shape[0]},) for weight {tuple(weight.shape)}; "
                         f"got {tuple(bias.shape)}")


def _args_fit(x, weight, bias) -> bool:
    """The common case in a few comparisons per call; `_check_args` says what is wrong otherwise."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor) or not x.dim() or weight.dim() != 2:
        return False
    if weight.shape[1] != x.shape[-1] or x.dtype not in FLOAT_DTYPES or weight.dtype not in FLOAT_DTYPES:
        return False
    if weight.device != x.device:
        return False
    return bias is None or (isinstance(bias, torch.Tensor) and bias.dtype in FLOAT_DTYPES and bias.device == x.device
                            and tuple(bias.shape) == (weight.shape[0],))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           backend: str = "cublas") -> torch.Tensor:
    """A projection, with our split-K weight-streaming kernel on request:

        out = x @ weightᵀ (+ bias)          x (..., K), weight [N, K], bias [N]  ->  out (..., N)

    Products accumulated in fp32 and rounded once to x's dtype. `backend`: "cublas" (default; torch's linear,
    as fast as our kernel or faster at most projection shapes), "split_k" (our kernel up to 32 rows, cuBLAS
    above; its K splits summed in a fixed order, the same bits every run) or "auto" (our kernel where its tuned
    table measured it faster than cuBLAS for these rows and this weight shape, cuBLAS elsewhere), for bf16 and
    fp16 on SM90 with N and K multiples of 8; anything else (fp32, CPU, other widths) the PyTorch reference, recorded in
    the Kernel Coverage report. A weight in another dtype than x is cast once and the copy reused (one copy of
    the weight in x's dtype), so call the op once before capturing a CUDA graph (that call also zeroes the
    split counters each captured call then takes for itself, so graphs may be replayed concurrently). Under
    autocast an fp32 x is converted to the autocast dtype; the output has x's dtype.
    """
    if not _args_fit(x, weight, bias):
        _check_args(x, weight, bias)
    if backend not in BACKENDS:
        raise ValueError(f"sk.ops.{OP}: backend must be one of {BACKENDS}; got {backend!r}")
    device_type = x.device.type
    autocast = torch.is_autocast_enabled(device_type)
    if x.dtype == torch.float32 and autocast:
        x = x.to(torch.get_autocast_dtype(device_type))
    k = x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    # Under autocast both backends compute in x's dtype, as the kernel and the fake do.
    with torch.autocast(device_type, enabled=False) if autocast else contextlib.nullcontext():
        out = _forward(x2, weight, bias, backend) if not grad and is_eager(x2) else _op(x2, weight, bias, backend)
    return out.view(*x.shape[:-1], weight.shape[0])
