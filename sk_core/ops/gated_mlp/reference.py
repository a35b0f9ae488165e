"""The gated-MLP block in PyTorch, with the roundings the engines make: the fallback outside the Kernel Coverage
table, the tests' oracle (run in fp64) and the benchmarks' baseline.

    h   = round(x + residual)                       (h = x without a residual)
    n   = round(norm(h))                            norm: "rms"       h / rms(h) · w
                                                          "gemma_rms" h / rms(h) · (1 + w)
                                                          "layer"     (h − mean(h)) / std(h) · w + b
    [g; u] = n @ gate_up_weightᵀ (+ gate_up_bias)   gate rows first: gate_up_weight is [2·d_ff, d_model]
    a   = round(act(g) · u)                         act: "silu", "gelu" (erf), "gelu_tanh"
    out = a @ down_weightᵀ (+ down_bias)

Returns (out, h). "round" is to x's dtype; statistics and the activation are computed in fp32 (fp64 for fp64
inputs); the projections run in x's dtype with fp32 accumulation (torch's bf16/fp16 matmul), as vLLM's and
SGLang's `fused_add_rms_norm` → GEMM → `silu_and_mul` → GEMM sequence does. The kernels
(`triton_kernels.py`) make the same roundings except one: they keep [g; u] in fp32 for the activation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

NORMS = ("rms", "gemma_rms", "layer")
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def normalize(h: torch.Tensor, norm: str, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """norm(h) in the accumulation dtype (fp32; fp64 for fp64 h), not rounded."""
    hf = h.to(_acc_dtype(h.dtype))
    w = weight.to(hf.dtype)
    if norm == "layer":
        centered = hf - hf.mean(-1, keepdim=True)
        n = centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps) * w
        return n if bias is None else n + bias.to(hf.dtype)
    n = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return n * (1.0 + w) if norm == "gemma_rms" else n * w


def activate(g: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "silu":
        return F.silu(g)
    return F.gelu(g, approximate="tanh" if activation == "gelu_tanh" else "none")


def gated_mlp_reference(
    x: torch.Tensor, norm_weight: torch.Tensor, gate_up_weight: torch.Tensor, down_weight: torch.Tensor,
    eps: float, *, residual: torch.Tensor | None = None, norm: str = "rms", activation: str = "silu",
    norm_bias: torch.Tensor | None = None, gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, h) of the block above, over the last dimension of x (any leading dims); differentiable in every
    tensor input. In fp64 it is the tests' oracle."""
    dtype = x.dtype
    acc = _acc_dtype(dtype)
    h = x if residual is None else (x.to(acc) + residual.to(acc)).to(dtype)
    n = normalize(h, norm, norm_weight, norm_bias, eps).to(dtype)
    gu = F.linear(n, gate_up_weight.to(dtype), None if gate_up_bias is None else gate_up_bias.to(dtype))
    g, u = gu.to(acc).chunk(2, dim=-1)
    a = (activate(g, activation) * u).to(dtype)
    out = F.linear(a, down_weight.to(dtype), None if down_bias is None else down_bias.to(dtype))
    return out, h
