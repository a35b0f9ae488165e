"""Operator capture inside SGLang's scheduler processes, for `sk capture` on `engine: sglang` rows.

`sk capture` sets SK_CAPTURE=1 in the engine's environment; SGLang's schedulers inherit it, and our
`sglang.srt.plugins` entry point (sk.adapters.sglang_plugin) calls `install()` in each of them before the model
is built. Every layer that is an SGLang CustomOp (RMSNorm, GemmaRMSNorm, SiluAndMul, GeluAndMul,
RotaryEmbedding, ...) is recorded as sk.workflow.layer_capture records vLLM's, under our operator names. The
record leaves the scheduler through SGLang's `Scheduler.get_internal_state` (Engine.get_server_info): each ask
returns the calls since the previous one under STATE_KEY and starts a new record.
"""
from __future__ import annotations

import re

from sk.workflow.layer_capture import LayerRecorder
from sk.workflow.operators import OPERATORS

STATE_KEY = "standardkernels_capture"
SCHEDULER_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
# SGLang classes named as vLLM's: our operator names (sk bench --target) for them.
_OP_BY_CLASS = {op.vllm_class: op.name for op in OPERATORS.values()}

_recorder: LayerRecorder | None = None


def op_name(cls: type) -> str:
    """Our operator name for an SGLang layer class: the catalog's, else the class name in snake case."""
    return _OP_BY_CLASS.get(cls.__name__) or re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


def custom_op_bases() -> tuple[type, ...]:
    """SGLang's CustomOp base class, found through a layer class that derives from it (its module has moved
    between SGLang versions)."""
    from sglang.srt.layers.layernorm import RMSNorm

    bases = tuple(k for k in RMSNorm.__mro__ if k.__name__ == "CustomOp")
    if not bases:
        raise RuntimeError("sk capture: SGLang's RMSNorm derives from no CustomOp class; this SGLang's layers "
                           "cannot be recorded")
    return bases


def hand_over(internal_state: dict) -> dict:
    """Put the record since the last ask into a scheduler's internal state, and start a new one."""
    internal_state[STATE_KEY] = _recorder.operators() if _recorder else []
    if _recorder:
        _recorder.reset()
    return internal_state


def install(bases: tuple[type, ...] | None = None) -> LayerRecorder:
    """Record this process's CustomOp layers from now on, and hand the record over in get_internal_state."""
    global _recorder
    if _recorder is None:
        _recorder = LayerRecorder(bases or custom_op_bases(), op_name).install()
        if bases is None:  # the real SGLang: hook its scheduler (tests pass fake bases, and no scheduler)
            from sglang.srt.plugins.hook_registry import HookRegistry, HookType

            HookRegistry.register(SCHEDULER_STATE, lambda result, scheduler, req: hand_over(result.internal_state),
                                  HookType.AFTER)
            HookRegistry.apply_hooks()
    return _recorder
