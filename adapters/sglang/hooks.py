"""AROUND hooks, installed through SGLang's HookRegistry, that make SGLang's own layer classes run sk.ops.

SGLang fixes each layer's forward at construction (MultiPlatformOp.__init__ -> dispatch_forward): forward_cuda on
CUDA, forward_native on a CPU without AMX, and forward_native again under SGLang's torch.compile mode
(enter_torch_compile). Both are hooked on the classes before any model is built, so every instance runs ours
whichever is bound. Each hook keeps the contract of the path it replaces:
  - the norms' forward_cuda works in place, like SGLang's CUDA kernels: with a residual, residual <- x + residual
    and x <- norm(residual), returning (x, residual); a post_residual_addition is first added to the residual,
    into a new tensor, as SGLang's CUDA path does;
  - forward_native is functional (inputs untouched), like SGLang's own.
Calls no sk op computes as SGLang would (RMSNorm with partial-width variance, HF cast order, fp32 residual, output
dtype override or no weight; SGLang's batch-invariant mode; mixed input dtypes; a GELU other than tanh/none) run
SGLang's own forward, recorded as a fallback with the reason (such a call is recorded twice when SGLang's
forward_cuda itself defers to forward_native).
A hook only checks attributes and dtypes and calls custom ops, so Dynamo traces it whole (SGLang's piecewise
prefill graphs) and CUDA-graph capture records just the ops' kernels; SGLang runs every shape twice before
capturing it, so Triton compiles before capture. SK_NORM_ACT_LAYERS=0 leaves the four classes SGLang's own (the
fused decoder blocks stay ours).
"""
from __future__ import annotations

import pkgutil
from typing import Callable, NamedTuple

import torch
from sglang.srt.batch_invariant_ops import is_batch_invariant_mode_enabled

import sk
from sk import settings

LAYERNORM = "sglang.srt.layers.layernorm"
ACTIVATION = "sglang.srt.layers.activation"
SCHEDULER_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
# Where the fused blocks are checked once the model is loaded (fused_blocks.after_load_model: repacked projections).
LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
# The report's `replaced` entry of the fused decoder blocks (sk.adapters.sglang.fused_blocks).
FUSED_BLOCKS_KEY = "decoder layers (norm + MLP)"


def _record_delegation(op: str, reason: str, *tensors: torch.Tensor | None) -> None:
    # Bookkeeping is Python: skipped while Dynamo traces; eager calls and CUDA-graph capture record it.
    if not torch.compiler.is_compiling():
        sk.coverage.record_fallback(op, [t for t in tensors if t is not None], f"SGLang's own forward ran: {reason}")


def _dtype_miss(x: torch.Tensor, residual: torch.Tensor | None, post: torch.Tensor | None) -> str | None:
    for name, t in (("residual", residual), ("post_residual_addition", post)):
        if t is not None and t.dtype != x.dtype:
            return f"{name} dtype {t.dtype} differs from the input's {x.dtype}"
    return None


def _rms_norm_miss(layer, x, residual, post) -> str | None:
    if layer.variance_size_override is not None:
        return "variance over part of the hidden size (var_hidden_size)"
    if layer.cast_x_before_out_mul:
        return "cast to the input dtype before the weight multiply (cast_x_before_out_mul)"
    if layer.fp32_residual:
        return "fp32 residual (fp32_residual)"
    if layer.override_orig_dtype is not None:
        return "output dtype override (override_orig_dtype)"
    if not layer.has_weight:
        return "no weight (has_weight=False)"
    if is_batch_invariant_mode_enabled():
        return "SGLang's batch-invariant mode"
    return _dtype_miss(x, residual, post)


def _gemma_rms_norm_miss(layer, x, residual, post) -> str | None:
    return _dtype_miss(x, residual, post)


class _NormOps(NamedTuple):
    names: tuple[str, str]  # sk.coverage names of (plain, fused), for fallback records
    plain: Callable
    fused: Callable
    fused_in_place: Callable
    miss: Callable  # (layer, x, residual, post) -> why sk.ops cannot compute this call, or None


RMS_NORM = _NormOps(("rms_norm", "fused_add_rms_norm"), sk.ops.rms_norm, sk.ops.fused_add_rms_norm,
                    sk.ops.fused_add_rms_norm_, _rms_norm_miss)
GEMMA_RMS_NORM = _NormOps(("gemma_rms_norm", "gemma_fused_add_rms_norm"), sk.ops.gemma_rms_norm,
                          sk.ops.gemma_fused_add_rms_norm, sk.ops.gemma_fused_add_rms_norm_, _gemma_rms_norm_miss)


def _norm_forward(ops: _NormOps, in_place: bool) -> Callable:
    """A norm's forward hook: in place with a residual (forward_cuda's contract) or functional (forward_native's)."""

    def forward(original, layer, x, residual=None, post_residual_addition=None):
        reason = ops.miss(layer, x, residual, post_residual_addition)
        if reason is not None:
            _record_delegation(ops.names[residual is not None], reason, x, residual, layer.weight)
            return original(layer, x, residual, post_residual_addition)
        if residual is None:
            return ops.plain(x, layer.weight.data, layer.variance_epsilon)
        if post_residual_addition is not None:
            residual = residual + post_residual_addition
        if in_place:
            ops.fused_in_place(x, residual, layer.weight.data, layer.variance_epsilon)
            return x, residual
        return ops.fused(x, residual, layer.weight.data, layer.variance_epsilon)

    return forward


def silu_and_mul_forward(original, layer, x):
    return sk.ops.silu_and_mul(x)


def gelu_and_mul_forward(original, layer, x):
    if layer.approximate not in ("tanh", "none"):
        _record_delegation("gelu_and_mul", f"GELU approximation {layer.approximate!r}", x)
        return original(layer, x)
    return sk.ops.gelu_and_mul(x, approximate=layer.approximate)


# Layer class -> (its module, {forward method: hook}, what the report says replaced it).
LAYER_HOOKS = {
    "RMSNorm": (LAYERNORM, {"forward_cuda": _norm_forward(RMS_NORM, in_place=True),
                            "forward_native": _norm_forward(RMS_NORM, in_place=False)},
                "sk.ops.rms_norm / fused_add_rms_norm (in place on forward_cuda)"),
    "GemmaRMSNorm": (LAYERNORM, {"forward_cuda": _norm_forward(GEMMA_RMS_NORM, in_place=True),
                                 "forward_native": _norm_forward(GEMMA_RMS_NORM, in_place=False)},
                     "sk.ops.gemma_rms_norm / gemma_fused_add_rms_norm (in place on forward_cuda)"),
    "SiluAndMul": (ACTIVATION, {"forward_cuda": silu_and_mul_forward, "forward_native": silu_and_mul_forward},
                   "sk.ops.silu_and_mul"),
    "GeluAndMul": (ACTIVATION, {"forward_cuda": gelu_and_mul_forward, "forward_native": gelu_and_mul_forward},
                   "sk.ops.gelu_and_mul (tanh and none)"),
}


def install_hooks(report_to_caller: Callable[[dict], None]) -> dict[str, str]:
    """Register and apply our hooks in this process; returns layer class -> what replaced its forwards.

    `report_to_caller(internal_state)` runs after each Scheduler.get_internal_state, on the state it returns.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sk.adapters.sglang import fused_blocks

    def report_in_internal_state(result, scheduler, recv_req):
        report_to_caller(result.internal_state)

    layer_hooks = LAYER_HOOKS if settings.get("norm_act_layers") else {}  # SK_NORM_ACT_LAYERS=0: SGLang's own
    hooks = [(f"{module}.{cls}.{method}", hook, HookType.AROUND)
             for cls, (module, methods, _) in layer_hooks.items() for method, hook in methods.items()]
    hooks.append((SCHEDULER_STATE, report_in_internal_state, HookType.AFTER))
    fused = fused_blocks.hooks()  # decoder layers' __init__: norm + MLP -> fused_gated_mlp (none when off)
    hooks += [(target, hook, HookType.AFTER) for target, (hook, _) in fused.items()]
    if fused and fused_blocks.BLOCKS.disabled is None:  # layers whose projections SGLang repacked at load go back
        hooks.append((LOAD_MODEL, fused_blocks.after_load_model, HookType.AFTER))
    originals = {target: pkgutil.resolve_name(target) for target, _, _ in hooks}
    for target, hook, kind in hooks:
        HookRegistry.register(target, hook, kind)
    # load_plugins() applies hooks after the plugins ran; applying here too (idempotent) lets us check the result.
    HookRegistry.apply_hooks()
    # apply_hooks() logs and skips a target it cannot patch: a layer left stock must not pass as replaced.
    unpatched = [t for t, original in originals.items()
                 if getattr(pkgutil.resolve_name(t), "__wrapped__", None) is not original]
    if unpatched:
        raise RuntimeError(f"standardkernels could not hook {', '.join(unpatched)} through SGLang's HookRegistry "
                           f"(already patched by another plugin?); see SGLang's log for the reason")
    replaced = {cls: f"{module}.{cls}.forward_cuda/forward_native -> {what}"
                for cls, (module, _, what) in layer_hooks.items()}
    replaced[FUSED_BLOCKS_KEY] = fused_blocks.summary(fused)
    return replaced
