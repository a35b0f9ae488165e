"""Operator capture inside a vLLM worker process, injected as vLLM's `worker_extension_cls`.

`sk capture` starts the engine with `worker_extension_cls="sk.workflow.capture_worker.OperatorCapture"`; vLLM
imports this module in every worker before the worker builds its model, and mixes OperatorCapture into the
worker class so that `LLM.collective_rpc("sk_capture_...")` reaches it. Nothing else imports this module: the
instrumentation below exists only in engines that `sk capture` started.

A replaceable operator is a layer that vLLM builds through its out-of-tree replacement registry (a CustomOp
or PluggableLayer): the unit a candidate kernel (or our adapter) swaps. sk.workflow.layer_capture records the
constructor arguments (by wrapping the registry's `__new__`, which receives them) and, for each forward call,
the positional inputs' shapes, dtypes and strides, under the name vLLM registers the op by.
"""
from __future__ import annotations

from vllm.model_executor import custom_op

from sk.workflow.layer_capture import LayerRecorder, describe  # noqa: F401  (describe: the record's format)

_REPLACEABLE = tuple(getattr(custom_op, name) for name in ("CustomOp", "PluggableLayer") if hasattr(custom_op, name))
_recorder = LayerRecorder(_REPLACEABLE, lambda cls: getattr(cls, "name", None) or cls.__name__).install()


class OperatorCapture:
    """Methods mixed into the vLLM worker, called through LLM.collective_rpc."""

    def sk_capture_reset(self) -> None:
        _recorder.reset()

    def sk_capture_operators(self) -> list[dict]:
        """Each distinct (operator, init params, input signature) executed since the last reset, with its count."""
        return _recorder.operators()
