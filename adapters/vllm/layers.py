"""Subclasses of vLLM layers whose every forward path runs our ops; registered as vLLM's out-of-tree versions.

vLLM's `CustomOp.__new__` looks the class name up in its out-of-tree registry, so once registered, building a
`GemmaRMSNorm(...)` anywhere yields ours, with the stock constructor and weight names. At construction vLLM
binds one of forward_native/forward_cuda/forward_cpu/... (native under Inductor, where custom ops default to
off); routing all of them here means ours runs whichever is bound, eager or compiled, with no custom_ops flags.
Our ops are torch custom ops, opaque to Dynamo and Inductor, so the compiled graph calls them too.
"""
import torch
from vllm.model_executor.layers.activation import GeluAndMul, SiluAndMul
from vllm.model_executor.layers.layernorm import GemmaRMSNorm

import sk


class _EveryForwardIsSk:
    """Mixin placed before the vLLM class: each platform's forward goes to `forward_sk`."""

    def forward_sk(self, *args, **kwargs):
        raise NotImplementedError

    def forward_native(self, *args, **kwargs):
        return self.forward_sk(*args, **kwargs)

    forward_cuda = forward_hip = forward_xpu = forward_cpu = forward_tpu = forward_oot = forward_native


class SkGemmaRMSNorm(_EveryForwardIsSk, GemmaRMSNorm):
    def forward_sk(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        # Functional like the stock layer: it returns (out, residual) and callers use the returned tensors.
        if residual is None:
            return sk.ops.gemma_rms_norm(x, self.weight.data, self.variance_epsilon)
        return sk.ops.gemma_fused_add_rms_norm(x, residual, self.weight.data, self.variance_epsilon)


class SkSiluAndMul(_EveryForwardIsSk, SiluAndMul):
    def forward_sk(self, x: torch.Tensor) -> torch.Tensor:
        return sk.ops.silu_and_mul(x)


class SkGeluAndMul(_EveryForwardIsSk, GeluAndMul):
    def forward_sk(self, x: torch.Tensor) -> torch.Tensor:
        return sk.ops.gelu_and_mul(x, approximate=self.approximate)


# vLLM class -> ours.
REPLACEMENTS = {GemmaRMSNorm: SkGemmaRMSNorm, SiluAndMul: SkSiluAndMul, GeluAndMul: SkGeluAndMul}


def register_layers() -> dict[str, str]:
    """Register each replacement under its vLLM base class's name (once per process); returns base -> ours."""
    from vllm.model_executor.custom_op import op_registry_oot

    replaced = {}
    for base, ours in REPLACEMENTS.items():
        current = op_registry_oot.get(base.__name__)
        if current is None:
            base.register_oot(ours)
            # register_oot names ours after the class; keep vLLM's op name so custom_ops and logs read as usual.
            ours.name = base.name
        elif current is not ours:
            raise RuntimeError(
                f"vLLM's {base.__name__} is already replaced by {current.__module__}.{current.__qualname__}; "
                f"standardkernels' adapter will not override another plugin's layer"
            )
        replaced[base.__name__] = f"{ours.__module__}.{ours.__qualname__}"
    return replaced
