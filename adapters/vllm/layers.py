"""Subclasses of vLLM layers whose every forward path runs our ops; registered as vLLM's out-of-tree versions.

`sk.vllm_oot` says how the replacement works. Our ops are torch custom ops, opaque to Dynamo and Inductor, so
a compiled graph calls them too.
"""
import torch
from vllm.model_executor.layers.activation import GeluAndMul, SiluAndMul
from vllm.model_executor.layers.layernorm import GemmaRMSNorm

import sk
from sk import vllm_oot


def _gemma_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None = None):
    # Per-head norms (Gemma-3's q/k norms, x of 3 or more dims) stay vLLM's, as in `ir_providers`.
    if x.dim() > 2:
        return GemmaRMSNorm.forward_native(self, x, residual)
    # Functional like the stock layer: it returns (out, residual) and callers use the returned tensors.
    if residual is None:
        return sk.ops.gemma_rms_norm(x, self.weight.data, self.variance_epsilon)
    return sk.ops.gemma_fused_add_rms_norm(x, residual, self.weight.data, self.variance_epsilon)


def _silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
    return sk.ops.silu_and_mul(x)


def _gelu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
    return sk.ops.gelu_and_mul(x, approximate=self.approximate)


SkGemmaRMSNorm = vllm_oot.replacement(GemmaRMSNorm, _gemma_rms_norm, name="SkGemmaRMSNorm", module=__name__)
SkSiluAndMul = vllm_oot.replacement(SiluAndMul, _silu_and_mul, name="SkSiluAndMul", module=__name__)
SkGeluAndMul = vllm_oot.replacement(GeluAndMul, _gelu_and_mul, name="SkGeluAndMul", module=__name__)

# vLLM class -> ours.
REPLACEMENTS = {GemmaRMSNorm: SkGemmaRMSNorm, SiluAndMul: SkSiluAndMul, GeluAndMul: SkGeluAndMul}


def register_layers() -> dict[str, str]:
    """Register each replacement under its vLLM base class's name (once per process); returns base -> ours."""
    for base, ours in REPLACEMENTS.items():
        vllm_oot.register(base, ours, "standardkernels' adapter")
    return {base.__name__: f"{ours.__module__}.{ours.__qualname__}" for base, ours in REPLACEMENTS.items()}
