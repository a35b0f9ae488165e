"""Standard Kernels ops: plain functions, one fused kernel call each, with the PyTorch reference as fallback."""
from sk.ops.act_and_mul import gelu_and_mul, silu_and_mul
from sk.ops.gated_mlp import fused_gated_mlp, fused_pre_norm_geglu, linear
from sk.ops.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_,
    gemma_fused_add_rms_norm,
    gemma_fused_add_rms_norm_,
    gemma_rms_norm,
    rms_norm,
)

__all__ = [
    "rms_norm", "gemma_rms_norm",
    "fused_add_rms_norm", "fused_add_rms_norm_", "gemma_fused_add_rms_norm", "gemma_fused_add_rms_norm_",
    "silu_and_mul", "gelu_and_mul",
    "fused_pre_norm_geglu",
    "fused_gated_mlp",
    "linear",
]
