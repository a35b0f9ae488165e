"""Operator capture inside a vLLM worker process, injected as vLLM's `worker_extension_cls`.

`sk capture` starts the engine with `worker_extension_cls="sk.workflow.capture_worker.OperatorCapture"`; vLLM
imports this module in every worker before the worker builds its model, and mixes OperatorCapture into the
worker class so that `LLM.collective_rpc("sk_capture_...")` reaches it. Nothing else imports this module: the
instrumentation below exists only in engines that `sk capture` started.

A replaceable operator is a layer that vLLM builds through its out-of-tree replacement registry (a CustomOp
or PluggableLayer): the unit a candidate kernel (or our adapter) swaps. For each one we record the constructor
arguments (by wrapping the registry's `__new__`, which receives them) and, for each forward call, the
positional inputs' shapes, dtypes and strides. The engine must run eagerly: compiled graphs do not call
Python hooks.
"""
from __future__ import annotations

import collections
import inspect
import json

import torch
from vllm.model_executor import custom_op

_REPLACEABLE = tuple(getattr(custom_op, name) for name in ("CustomOp", "PluggableLayer") if hasattr(custom_op, name))
# Constructor arguments that name a layer rather than parametrize its math; left out so layers dedupe.
_NOT_PARAMETERS = {"prefix"}
# id(module) -> its constructor arguments, described.
_init_params: dict[int, dict] = {}
# JSON of (op, class, init, inputs) -> forward calls since the last reset.
_calls: collections.Counter[str] = collections.Counter()


def describe(value):
    """A JSON-able description of an argument: tensors by shape/dtype/stride/device, plain values as they are."""
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch."),
                "stride": list(value.stride()), "device": value.device.type}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    return {"type": type(value).__qualname__}


def _recording_new(original_new):
    def new(cls, *args, **kwargs):
        instance = original_new(cls, *args, **kwargs)
        try:
            bound = inspect.signature(type(instance).__init__).bind(instance, *args, **kwargs)
            params = {k: describe(v) for k, v in list(bound.arguments.items())[1:] if k not in _NOT_PARAMETERS}
        except TypeError:  # a constructor we cannot bind: keep the raw arguments
            params = {"args": describe(args), "kwargs": {k: describe(v) for k, v in kwargs.items()}}
        _init_params[id(instance)] = params
        return instance

    return new


def _record_forward(module: torch.nn.Module, args: tuple) -> None:
    if isinstance(module, _REPLACEABLE):
        cls = type(module)
        key = {"op": getattr(cls, "name", None) or cls.__name__, "class": cls.__name__,
               "module": cls.__module__, "init": _init_params.get(id(module)),
               "inputs": [describe(a) for a in args]}
        _calls[json.dumps(key, sort_keys=True)] += 1


for _base in _REPLACEABLE:
    _base.__new__ = staticmethod(_recording_new(_base.__new__))
torch.nn.modules.module.register_module_forward_pre_hook(_record_forward)


class OperatorCapture:
    """Methods mixed into the vLLM worker, called through LLM.collective_rpc."""

    def sk_capture_reset(self) -> None:
        _calls.clear()

    def sk_capture_operators(self) -> list[dict]:
        """Each distinct (operator, init params, input signature) executed since the last reset, with its count."""
        return [{**json.loads(key), "count": count} for key, count in sorted(_calls.items())]
