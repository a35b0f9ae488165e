"""The prepared (folded, interleaved) weights the gated-MLP kernels read, made once per weight version through
`sk.ops.weight_cache` and reused: never per call, never inside a CUDA-graph capture of inference (a capture
that finds none made is recorded as a coverage miss; see `weight_cache`).

Layout of the folded gate/up weight W' ([2·d_ff, d_model], the compute dtype, contiguous):

    row 2j     = gate row j ⊙ s          s = w        (norm "rms", "layer")
    row 2j + 1 = up row j   ⊙ s          s = 1 + w    (norm "gemma_rms")

rounded once from fp32 to the compute dtype. Gate and up rows alternate one by one, so any tile of BLOCK_N
consecutive rows holds the gate and up rows of the same BLOCK_N / 2 output columns, whatever BLOCK_N a config
picks (the layout does not depend on the tile shape: one copy serves every shape class); the kernel's
epilogue splits the tile's even and odd columns into g and u. With the scale folded in, the gate/up GEMM runs
on h itself, and the norm becomes a per-row factor in the epilogue:

    rms / gemma_rms:  [g; u] = rstd · (h @ W'ᵀ) + b
    layer:            [g; u] = rstd · (h @ W'ᵀ − μ · Σ_k W') + (W · β + b)

with the row statistics μ, rstd of h (fp32). The two fp32 vectors (`colsum` = Σ_k W' of the rounded W', so the
mean cancels exactly in real arithmetic, and `shift` = W·β + b) are interleaved as the rows; `shift` is None
when there is neither a norm bias nor a gate/up bias, `colsum` None outside "layer". For "layer" the fold adds
an fp32 accumulation error relative to μ rather than to the centered values, ~d_model·2⁻²⁴·|μ|/σ, below a
bf16 rounding unless rows are nearly constant (as the GEGLU op's fold, `geglu.folded_gate_up`).

Memory: one extra copy of gate/up in the compute dtype (2·d_ff·d_model elements: 235 MB for Llama-3-8B's
MLP in bf16, per layer shard), plus 8·d_ff bytes per fp32 vector; the down weight is used as given (a cached
cast only when its dtype or layout differs). Making a fold takes fp32 temporaries of at most `FOLD_CHUNK_ROWS`
rows at a time.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from sk.ops import weight_cache

FOLD_CHUNK_ROWS = 2048  # gate (and up) rows folded per step: bounds the fp32 temporaries to ~2·2048·d_model·4 B


class GateUp(NamedTuple):
    weight: torch.Tensor            # W' [2·d_ff, d_model], compute dtype, rows interleaved (gate 0, up 0, ...)
    colsum: Optional[torch.Tensor]  # fp32 [2·d_ff]: Σ_k W' ("layer" only)
    shift: Optional[torch.Tensor]   # fp32 [2·d_ff]: W·β + b (None when both are absent)


def fold(norm: str, norm_weight: torch.Tensor, norm_bias: Optional[torch.Tensor], gate_up_weight: torch.Tensor,
         gate_up_bias: Optional[torch.Tensor], dtype: torch.dtype) -> GateUp:
    """Make the prepared gate/up weights (uncached: `prepared_gate_up` caches them)."""
    rows, d = gate_up_weight.shape
    ff = rows // 2
    dev = gate_up_weight.device
    with torch.no_grad(), torch.autocast(dev.type, enabled=False):  # fp32 throughout, also under autocast
        scale = norm_weight.detach().float()
        if norm == "gemma_rms":
            scale = scale + 1.0
        w = gate_up_weight.detach()
        out = torch.empty((ff, 2, d), dtype=dtype, device=dev)  # [j, 0] = gate j, [j, 1] = up j
        shift_raw = None
        beta = norm_bias.detach().float() if norm == "layer" and norm_bias is not None else None
        if beta is not None:
            shift_raw = torch.empty((ff, 2), dtype=torch.float32, device=dev)
        for start in range(0, ff, FOLD_CHUNK_ROWS):
            stop = min(ff, start + FOLD_CHUNK_ROWS)
            for half in (0, 1):
                block = w[half * ff + start: half * ff + stop].float()
                out[start:stop, half] = block * scale
                if beta is not None:
                    shift_raw[start:stop, half] = block @ beta
        weight = out.view(2 * ff, d)
        colsum = weight.sum(1, dtype=torch.float32) if norm == "layer" else None
        shift = None if shift_raw is None else shift_raw.view(2 * ff)
        if gate_up_bias is not None:
            b = gate_up_bias.detach().float().view(2, ff).t().reshape(2 * ff)  # interleaved as the rows
            shift = b if shift is None else shift + b
    return GateUp(weight, colsum, None if shift is None else shift.contiguous())


def prepared_gate_up(op: str, norm: str, norm_weight: torch.Tensor, norm_bias: Optional[torch.Tensor],
                     gate_up_weight: torch.Tensor, gate_up_bias: Optional[torch.Tensor],
                     dtype: torch.dtype, remake: bool = False) -> GateUp:
    """The folded gate/up weights for compute dtype `dtype`, cached on the four sources (see the module
    docstring); `op` names the coverage row a capture-time miss is recorded under. `remake`: fold again, into
    the cached copy's own memory (`weight_cache.derived`)."""
    sources = (norm_weight, norm_bias if norm == "layer" else None, gate_up_weight, gate_up_bias)
    return weight_cache.derived(op, sources, ("gated_mlp_fold", norm, dtype),
                                lambda: fold(norm, norm_weight, norm_bias, gate_up_weight, gate_up_bias, dtype),
                                remake=remake)


def prepared_down(op: str, down_weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """down_weight as a contiguous `dtype` tensor: itself when it is one, else a cached cast."""
    return weight_cache.cast(op, down_weight, dtype)
