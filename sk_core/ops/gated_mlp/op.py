"""`sk.ops.fused_gated_mlp`: the public function, its argument checks, the custom op `sk::fused_gated_mlp`
(with a fake, so torch.compile(fullgraph=True) traces it) and the dispatch between the Triton kernels and the
PyTorch reference.

Dispatch: bf16/fp16 CUDA tensors on SM90 (or CPU tensors under TRITON_INTERPRET=1) with d_model and d_ff
multiples of 8 within the table's limits run the kernels: the fused ones up to `triton_kernels.fused_max_m` rows
(32; 8 for blocks larger than Gemma-2B's without a tuned "m32" entry), above it (norms "rms" and "gemma_rms") our
norm and activation kernels around cuBLAS's two GEMMs; anything else runs
`gated_mlp_reference` and the miss is recorded under the coverage row `fused_gated_mlp/<norm>` (an error under `sk.coverage.strict()`).
With grad mode on and an input that requires grad, the forward is the same; its backward is autograd of the
reference, recorded as a backward fallback (inference kernels only: training stays correct).
"""
from __future__ import annotations

import contextlib

import functools
from typing import Optional

import torch

from sk import coverage
from sk.ops import weight_cache
from sk.ops._common import FLOAT_DTYPES, LibraryOp, attach_reference_backward, check_float, check_same_device
from sk.ops.act_and_mul import launch as launch_act_and_mul
from sk.ops.gated_mlp import triton_kernels
from sk.ops.gated_mlp.common import is_eager
from sk.ops.gated_mlp.reference import ACTIVATIONS, NORMS, gated_mlp_reference
from sk.ops.rms_norm import GEMMA_OFFSET
from sk.ops.rms_norm import launch as launch_norm

OP = "fused_gated_mlp"


def coverage_name(norm: str) -> str:
    """The Kernel Coverage row of a norm: `fused_gated_mlp/rms`, `/gemma_rms`, `/layer`."""
    return f"{OP}/{norm}"


@functools.lru_cache(maxsize=256)
def shape_miss(norm: str, d: int, ff: int) -> str | None:
    """Why (d_model, d_ff) is outside the kernels' coverage, or None."""
    limits = coverage.table()[coverage_name(norm)].limits
    align = triton_kernels.TMA_ALIGN
    if d % align or ff % align:  # TMA: 16-byte rows
        return f"d_model {d} and d_ff {ff} must be multiples of {align} (TMA needs 16-byte rows)"
    return (coverage.limit_miss("d_model", d, limits.get("max_d_model"))
            or coverage.limit_miss("d_ff", ff, limits.get("max_d_ff")))


def kernel_miss(x: torch.Tensor, norm: str, d_model: int, d_ff: int) -> str | None:
    """Why a call on activations like `x` (its device and dtype) with this (d_model, d_ff) would run the PyTorch
    reference instead of the kernels, or None when the kernels cover it. Records nothing: for planning (the engine
    adapters decide per layer, once, whether the fused block pays)."""
    return coverage.miss_reason(coverage_name(norm), x, shape_miss=shape_miss(norm, d_model, d_ff))


def prepare_weights(norm_weight: torch.Tensor, gate_up_weight: torch.Tensor, *, norm: str = "rms",
                    norm_bias: torch.Tensor | None = None, gate_up_bias: torch.Tensor | None = None,
                    down_weight: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                    refresh: bool = False) -> bool:
    """Make now the weight copies that calls with activations of `dtype` (default: gate/up's) will read, where
    the kernels cover such calls; returns whether they do. The kernels read the weights as given, so copies exist
    only for weights of another dtype than the activations, or not contiguous (a cast, cached per weight
    version: `sk.ops.weight_cache`); the op makes them at its first call otherwise. An engine calls this after
    loading its weights, so that any copy exists before it sizes its caches from the memory left.

    `refresh=True`: after the weights were written in a way their version counters do not show (through
    `.data`, as the engines' weight loaders write), or while CUDA graphs that read a copy stay in use: each copy
    is made again into its own memory, so that those graphs compute with the new weights too. norm_weight,
    norm_bias and gate_up_bias are read as given at every call."""
    if norm not in NORMS:
        raise ValueError(f"sk.ops.gated_mlp.prepare_weights: norm must be one of {', '.join(map(repr, NORMS))}; "
                         f"got {norm!r}")
    if not isinstance(gate_up_weight, torch.Tensor) or gate_up_weight.dim() != 2 or gate_up_weight.shape[0] % 2:
        got = tuple(gate_up_weight.shape) if isinstance(gate_up_weight, torch.Tensor) else type(gate_up_weight)
        raise ValueError(f"sk.ops.gated_mlp.prepare_weights: gate_up_weight must be (2·d_ff, d_model), gate rows "
                         f"first; got {got}")
    dtype = gate_up_weight.dtype if dtype is None else dtype
    d, ff = gate_up_weight.shape[1], gate_up_weight.shape[0] // 2
    probe = gate_up_weight.new_empty((0, d), dtype=dtype)
    if kernel_miss(probe, norm, d, ff) is not None:
        return False
    name = coverage_name(norm)
    for weight in (gate_up_weight, down_weight):
        if weight is not None:
            weight_cache.cast(name, weight, dtype, remake=refresh)
    return True


# ----------------------------------------------------------------------------------------------- custom op

def _reference_2d(x, residual, norm_weight, norm_bias, gate_up_weight, gate_up_bias, down_weight, down_bias, eps,
                  norm, activation):
    """The reference with the custom op's signature and outputs (residual_out empty without a residual, kept
    in the autograd graph so that the reference backward can differentiate it)."""
    out, h = gated_mlp_reference(x, norm_weight, gate_up_weight, down_weight, eps, residual=residual, norm=norm,
                                 activation=activation, norm_bias=norm_bias, gate_up_bias=gate_up_bias,
                                 down_bias=down_bias)
    return out, (h if residual is not None else h.reshape(-1)[:0])


def _forward(
    x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor, norm_bias: Optional[torch.Tensor],
    gate_up_weight: torch.Tensor, gate_up_bias: Optional[torch.Tensor], down_weight: torch.Tensor,
    down_bias: Optional[torch.Tensor], eps: float, norm: str, activation: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x and residual are 2-D and contiguous. Returns (out, h); h is empty without a residual."""
    _check_residual(x, residual)
    d, ff = x.shape[1], down_weight.shape[1]
    name = coverage_name(norm)
    tensors = [t for t in (x, residual, norm_weight, gate_up_weight, down_weight) if t is not None]
    if not coverage.decide(name, tensors, shape_miss=shape_miss(norm, d, ff)):
        out, h = _reference_2d(x, residual, norm_weight, norm_bias, gate_up_weight, gate_up_bias, down_weight,
                               down_bias, eps, norm, activation)
        return out, (h if residual is not None else x.new_empty(0))
    dtype = x.dtype
    if x.shape[0] > triton_kernels.fused_max_m(d, ff) and norm != "layer":
        return _composed(x, residual, norm_weight, gate_up_weight, gate_up_bias, down_weight, down_bias, eps, norm,
                         activation, name)
    tma = triton_kernels.tma_ready

    def vector(t):
        return None if t is None else t.contiguous()
    return triton_kernels.forward_kernels(
        tma(x), None if residual is None else tma(residual), vector(norm_weight), vector(norm_bias),
        tma(weight_cache.cast(name, gate_up_weight, dtype)), vector(gate_up_bias),
        tma(weight_cache.cast(name, down_weight, dtype)), vector(down_bias), eps, norm, activation)


def _composed(x, residual, norm_weight, gate_up_weight, gate_up_bias, down_weight, down_bias, eps, norm, activation,
              name):
    """Above `triton_kernels.fused_max_m` rows: our norm and activation kernels around cuBLAS's GEMMs (the engines'
    own sequence, where cuBLAS's tiles beat the fused kernels'); weights and biases in another dtype are cast once
    (`weight_cache.cast`), never per call. The kernels launch directly: this op's checks and coverage decision
    cover theirs (an engine's eager prefill pays each public call's host time per layer)."""
    dtype, rows, ff = x.dtype, x.shape[0], down_weight.shape[1]

    def cast(t):
        return None if t is None else weight_cache.cast(name, t, dtype)
    n = torch.empty(x.shape, dtype=dtype, device=x.device)
    offset = GEMMA_OFFSET if norm == "gemma_rms" else 0.0
    if residual is None:
        h = x.new_empty(0)
        launch_norm(x, norm_weight, n, eps, offset)
    else:
        h = torch.empty(x.shape, dtype=dtype, device=x.device)
        launch_norm(x, norm_weight, n, eps, offset, residual, h)
    gu = torch.nn.functional.linear(n, cast(gate_up_weight), cast(gate_up_bias))
    a = torch.empty((rows, ff), dtype=dtype, device=x.device)
    launch_act_and_mul(gu, a, activation)
    return torch.nn.functional.linear(a, cast(down_weight), cast(down_bias)), h


def _check_residual(x: torch.Tensor, residual: Optional[torch.Tensor]) -> None:
    """The public function checks this; the custom op checks it again, for graphs that a compiler pass rewrote
    after tracing (vLLM's sequence-parallel pass shards the residual across ranks, which nothing here supports)."""
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"sk.ops.{OP}: residual {tuple(residual.shape)} must have x's shape {tuple(x.shape)} (a "
                         f"residual split across tensor-parallel ranks is not supported)")


_op = LibraryOp("sk::fused_gated_mlp", _forward)


@_op.register_fake
def _(x, residual, norm_weight, norm_bias, gate_up_weight, gate_up_bias, down_weight, down_bias, eps, norm,
      activation):
    _check_residual(x, residual)
    return x.new_empty(x.shape), x.new_empty(x.shape if residual is not None else 0)


attach_reference_backward(_op, lambda inputs: coverage_name(inputs[9]), _reference_2d)


# ----------------------------------------------------------------------------------------------- argument checks

def _check_args(x, norm_weight, gate_up_weight, down_weight, eps, residual, norm, activation, norm_bias,
                gate_up_bias, down_bias) -> None:
    """Raise a clear error naming the argument, its shape or dtype, and what is supported."""
    op = OP
    named = {"x": x, "norm_weight": norm_weight, "gate_up_weight": gate_up_weight, "down_weight": down_weight,
             "residual": residual, "norm_bias": norm_bias, "gate_up_bias": gate_up_bias, "down_bias": down_bias}
    present = {n: t for n, t in named.items() if t is not None}
    for n in ("x", "norm_weight", "gate_up_weight", "down_weight"):
        if named[n] is None:
            raise TypeError(f"sk.ops.{op}: {n} is required (got None)")
    for n, t in present.items():
        check_float(op, n, t)
    check_same_device(op, list(present), list(present.values()))
    if norm not in NORMS:
        raise ValueError(f"sk.ops.{op}: norm must be one of {', '.join(map(repr, NORMS))}; got {norm!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"sk.ops.{op}: activation must be one of {', '.join(map(repr, ACTIVATIONS))}; "
                         f"got {activation!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"sk.ops.{op}: eps must be a non-negative float, got {eps!r}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"sk.ops.{op}: x must be (..., d_model) with d_model >= 1; got x {tuple(x.shape)}")
    if gate_up_weight.dim() != 2 or gate_up_weight.shape[0] % 2 or gate_up_weight.shape[0] == 0:
        raise ValueError(f"sk.ops.{op}: gate_up_weight must be (2·d_ff, d_model), gate rows first, with d_ff >= 1; "
                         f"got {tuple(gate_up_weight.shape)}")
    d, ff = x.shape[-1], gate_up_weight.shape[0] // 2
    expected = {"norm_weight": (d,), "norm_bias": (d,), "gate_up_weight": (2 * ff, d), "gate_up_bias": (2 * ff,),
                "down_weight": (d, ff), "down_bias": (d,), "residual": tuple(x.shape)}
    wrong = [f"{n} {tuple(present[n].shape)} (expected {shape})" for n, shape in expected.items()
             if n in present and tuple(present[n].shape) != shape]
    if wrong:
        raise ValueError(f"sk.ops.{op}: with x {tuple(x.shape)} (d_model={d}) and d_ff={ff} from gate_up_weight "
                         f"{tuple(gate_up_weight.shape)}, these shapes do not fit: {'; '.join(wrong)}")
    if residual is not None and residual.dtype != x.dtype:
        raise TypeError(f"sk.ops.{op}: residual must have x's dtype {x.dtype}; got {residual.dtype}")
    if norm_bias is not None and norm != "layer":
        raise ValueError(f"sk.ops.{op}: norm_bias is only used by norm='layer' (got norm={norm!r}); pass None")


def _args_fit(x, norm_weight, gate_up_weight, down_weight, eps, residual, norm, activation, norm_bias,
              gate_up_bias, down_bias) -> bool:
    """The common case in a few comparisons per call; `_check_args` says what is wrong otherwise."""
    if not (type(x) is torch.Tensor or isinstance(x, torch.Tensor)) or not x.dim():
        return False
    if norm not in NORMS or activation not in ACTIVATIONS or isinstance(eps, bool) or not (
            isinstance(eps, (int, float)) and eps >= 0):
        return False
    if not isinstance(gate_up_weight, torch.Tensor) or gate_up_weight.dim() != 2:
        return False
    d, rows = x.shape[-1], gate_up_weight.shape[0]
    ff = rows // 2
    if not d or not ff or rows % 2 or (norm_bias is not None and norm != "layer"):
        return False
    device = x.device
    for t, shape in ((x, None), (norm_weight, (d,)), (norm_bias, (d,)), (gate_up_weight, (rows, d)),
                     (gate_up_bias, (rows,)), (down_weight, (d, ff)), (down_bias, (d,)), (residual, x.shape)):
        if t is None:
            continue
        if (not isinstance(t, torch.Tensor) or t.dtype not in FLOAT_DTYPES or t.device != device
                or shape is not None and t.shape != shape):
            return False
    return (norm_weight is not None and down_weight is not None
            and (residual is None or residual.dtype == x.dtype))


# ----------------------------------------------------------------------------------------------- public function

def fused_gated_mlp(
    x: torch.Tensor, norm_weight: torch.Tensor, gate_up_weight: torch.Tensor, down_weight: torch.Tensor,
    eps: float = 1e-6, *, residual: torch.Tensor | None = None, norm: str = "rms", activation: str = "silu",
    norm_bias: torch.Tensor | None = None, gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The feed-forward block of Llama-, Qwen- and Gemma-style models in one op, in the engines' form:

        h   = x + residual            (rounded to x's dtype; h = x when residual is None)
        n   = norm(h)                 "rms": h / rms(h) · w;  "gemma_rms": · (1 + w);  "layer": LayerNorm(w, norm_bias)
        [g; u] = n @ gate_up_weightᵀ (+ gate_up_bias)      gate_up_weight [2·d_ff, d_model], gate rows first
        a   = act(g) · u              act: "silu", "gelu" (erf), "gelu_tanh"
        out = a @ down_weightᵀ (+ down_bias)               down_weight [d_model, d_ff]

    Returns (out, h), both shaped like x (h is x itself without a residual). A tensor-parallel shard (d_ff / tp
    rows of gate and up, the matching columns of down) is just a smaller d_ff. Statistics and the activation in
    fp32, products accumulated in fp32; bf16 and fp16 run the Triton kernels where the Kernel Coverage table
    says so, anything else (fp32, CPU, other widths) the PyTorch reference, recorded. The kernels read the
    weights as given; weights of another dtype than x's (or not contiguous) are cast once per weight version
    (`prepare_weights`), so call the op once before capturing a CUDA graph with such weights.
    Under autocast an fp32 x (and residual) is converted to the autocast dtype; the outputs have x's dtype.
    """
    args = (x, norm_weight, gate_up_weight, down_weight, eps, residual, norm, activation, norm_bias, gate_up_bias,
            down_bias)
    if not _args_fit(*args):
        _check_args(*args)
    device_type = x.device.type
    autocast = torch.is_autocast_enabled(device_type)
    if x.dtype == torch.float32 and autocast:
        dtype = torch.get_autocast_dtype(device_type)
        x = x.to(dtype)
        residual = None if residual is None else residual.to(dtype)
    d = x.shape[-1]
    x2 = x.reshape(-1, d).contiguous()
    r2 = None if residual is None else residual.reshape(-1, d).contiguous()
    tensors = (x, residual, norm_weight, norm_bias, gate_up_weight, gate_up_bias, down_weight, down_bias)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    inputs = (x2, r2, norm_weight, norm_bias, gate_up_weight, gate_up_bias, down_weight, down_bias, float(eps),
              norm, activation)
    # Under autocast, every route computes in x's dtype, as the kernels and the fake do (the reference's and the
    # composed route's F.linear would otherwise autocast, and the output dtype would depend on the rows).
    with torch.autocast(device_type, enabled=False) if autocast else contextlib.nullcontext():
        out, h = _forward(*inputs) if not grad and is_eager(x2) else _op(*inputs)
    return out.view(x.shape), (x if residual is None else h.view(x.shape))
