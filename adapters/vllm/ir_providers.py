"""Our norms as a `vllm.ir` provider named "sk", placed first in the platform's IR op priority.

vLLM's RMSNorm layer calls `vllm.ir.ops.rms_norm` and `vllm.ir.ops.fused_add_rms_norm.maybe_inplace` on every
path (eager, and under Inductor where its IR lowering pass substitutes the selected provider), so a provider
replaces RMSNorm without touching the layer class and keeps vLLM's IR-level fusion passes working.

The priority is set from the platform default while vLLM builds its config in the front end; the config,
with "sk" in it, is what engine core and workers receive and install (and it enters vLLM's compile-cache hash).
"""
from torch import Tensor

import sk

PROVIDER = "sk"


def _rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return sk.ops.rms_norm(x, weight, epsilon)


def _fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    # In place, as vLLM's own kernel: residual <- x + residual, x <- norm(residual). vLLM clones the inputs
    # first wherever it needs the functional form.
    sk.ops.fused_add_rms_norm_(x, x_residual, weight, epsilon)
    return x, x_residual


# Partial-width variance and weightless norms have no sk op; vLLM then takes the next provider in priority.
# Per-head norms (x of 3 or more dims: Qwen3's q/k norms on views of the QKV output) stay with
# vLLM's: Inductor fuses them with the split and rotary around them, where ours would add a launch and a copy of
# the strided view per norm (part of Qwen3-8B-shaped decode's loss with them ours: results/h100/engines/README.md).
# vLLM requires each op's own parameter names here too, hence one predicate per op.
def _rms_norm_supported(x, weight, epsilon, variance_size=None) -> bool:
    return variance_size is None and weight is not None and weight.dtype == x.dtype and x.dim() <= 2


def _fused_add_rms_norm_supported(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    return variance_size is None and weight is not None and weight.dtype == x.dtype


def register_providers() -> list[str]:
    """Register the "sk" provider on each IR op (once per process) and put it first in the default priority."""
    from vllm import ir
    from vllm.platforms import current_platform

    providers = {
        "rms_norm": (_rms_norm, _rms_norm_supported, False),
        "fused_add_rms_norm": (_fused_add_rms_norm, _fused_add_rms_norm_supported, True),
    }
    for name, (impl, supports_args, inplace) in providers.items():
        op = getattr(ir.ops, name)
        if PROVIDER not in op.impls:
            op.register_impl(PROVIDER, supports_args=supports_args, inplace=inplace)(impl)

    platform = type(current_platform)
    if not getattr(platform.get_default_ir_op_priority, "_sk_first", False):
        platform_default = platform.get_default_ir_op_priority

        def sk_first(cls, vllm_config):
            priority = platform_default(vllm_config)
            for name in providers:
                order = getattr(priority, name)
                if PROVIDER not in order:
                    setattr(priority, name, [PROVIDER, *order])
            return priority

        sk_first._sk_first = True
        platform.get_default_ir_op_priority = classmethod(sk_first)
    return list(providers)
