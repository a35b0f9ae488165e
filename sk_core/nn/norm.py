"""RMSNorm and Gemma's RMSNorm as nn.Modules over `sk.ops`, with the residual-add form the engines use.

    RMSNorm:       y = x / sqrt(mean(x²) + eps) · weight
    GemmaRMSNorm:  y = x / sqrt(mean(x²) + eps) · (1 + weight)      (weight stored as an offset, initialised to 0)

`forward(x)` returns y; `forward(x, residual)` returns `(norm(x + residual), x + residual)`, the sum rounded to
x's dtype before it is normalized (as vLLM's and SGLang's layers return it). Statistics and the scaling run in
fp32 whatever the dtypes; the output has x's dtype. The weight is the module's own parameter in the dtype it was
made with: FP32 by default (a master the optimizer updates; its gradient is FP32 with BF16 activations).

`from_module` copies a Hugging Face `LlamaRMSNorm` / `Qwen3RMSNorm` / `GemmaRMSNorm` (or any module with a 1-D
`weight` and `eps` / `variance_epsilon` that computes one of the two formulas). Which formula a module computes
is checked by running it once on a probe, so a norm is never swapped for one that computes something else.
"""
from __future__ import annotations

import torch
from torch import nn

from sk import ops
from sk.ops.rms_norm import GEMMA_OFFSET, rms_norm_reference


class RMSNorm(nn.Module):
    weight_offset = 0.0

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, device=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        # RMSNorm starts as the identity scale (weight 1), Gemma's as offset 0 (1 + 0).
        self.weight = nn.Parameter(torch.full((hidden_size,), 1.0 - self.weight_offset, device=device, dtype=dtype))
        self.hidden_size, self.eps = hidden_size, float(eps)

    @property
    def variance_epsilon(self) -> float:  # the attribute's name in Hugging Face's Llama-family norms
        return self.eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        gemma = self.weight_offset == GEMMA_OFFSET
        if residual is None:
            return (ops.gemma_rms_norm if gemma else ops.rms_norm)(x, self.weight, self.eps)
        return (ops.gemma_fused_add_rms_norm if gemma else ops.fused_add_rms_norm)(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"

    @classmethod
    def from_module(cls, module: nn.Module, *, dtype: torch.dtype | None = None) -> "RMSNorm":
        """A copy of `module`'s weight and eps, on its device, in `dtype` (default: the weight's own dtype; pass
        torch.float32 for FP32 masters). Raises ValueError naming what does not fit: no 1-D `weight`, no eps,
        or a forward that is not this class's formula (e.g. a Gemma norm given to RMSNorm: use GemmaRMSNorm)."""
        weight, eps = _weight_and_eps(cls.__name__, module)
        offset = norm_offset(module, weight, eps)
        if offset is None:
            raise ValueError(
                f"{cls.__name__}.from_module: {type(module).__name__} has a weight {tuple(weight.shape)} and eps={eps} "
                f"but its forward computes neither x·rstd·weight (RMSNorm) nor x·rstd·(1 + weight) (GemmaRMSNorm) "
                f"on a probe input")
        if offset != cls.weight_offset:
            want, other = ("GemmaRMSNorm", "x·rstd·(1 + weight)") if offset else ("RMSNorm", "x·rstd·weight")
            raise ValueError(f"{cls.__name__}.from_module: {type(module).__name__} computes {other}; use sk.nn.{want}")
        new = cls(weight.shape[0], eps, device=weight.device, dtype=dtype or weight.dtype)
        with torch.no_grad():
            new.weight.copy_(weight)
        return new


class GemmaRMSNorm(RMSNorm):
    weight_offset = GEMMA_OFFSET


def _weight_and_eps(who: str, module: nn.Module) -> tuple[torch.Tensor, float]:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        raise ValueError(f"{who}.from_module: {type(module).__name__} has no 1-D `weight` parameter "
                         f"(found {type(weight).__name__ if weight is None else tuple(weight.shape)})")
    extra = [n for n, _ in module.named_parameters() if n != "weight"]
    if extra:
        raise ValueError(f"{who}.from_module: {type(module).__name__} has parameters besides `weight` ({extra}); an "
                         f"RMSNorm has none (a LayerNorm's bias, say)")
    for attr in ("variance_epsilon", "eps", "epsilon"):
        eps = getattr(module, attr, None)
        if isinstance(eps, (int, float)) and not isinstance(eps, bool):
            return weight, float(eps)
    raise ValueError(f"{who}.from_module: {type(module).__name__} has no `eps` / `variance_epsilon` attribute")


def norm_offset(module: nn.Module, weight: torch.Tensor, eps: float) -> float | None:
    """0.0 when `module(x)` computes RMSNorm's x·rstd·weight on a probe, 1.0 for Gemma's x·rstd·(1 + weight), None
    for neither. The probe runs in the weight's dtype (a module may refuse other input dtypes); the two formulas
    differ by x·rstd, as large as the output itself, so a bf16 tolerance tells them apart."""
    if weight.device.type == "meta":
        return None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, weight.shape[0], generator=gen).to(weight.device, weight.dtype)
    with torch.no_grad():
        try:
            got = module(x)
        except Exception:  # a module that cannot run on its own (needs other arguments): not a plain norm
            return None
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            return None
        tolerance = 1e-4 if weight.dtype in (torch.float32, torch.float64) else 2e-2
        for offset in (0.0, GEMMA_OFFSET):
            want = rms_norm_reference(x.float(), weight.float(), eps, offset)
            if (got.float() - want).norm() <= tolerance * want.norm() + 1e-30:
                return offset
    return None
