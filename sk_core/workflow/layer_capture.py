"""Recording an engine's replaceable layers in the process that runs them: constructor arguments and, per
forward call, the inputs' shapes, dtypes and strides. Engine-neutral: `LayerRecorder(bases, op_name)` records
every module that is an instance of `bases`; sk.workflow.capture_worker uses it in vLLM's workers,
sk.workflow.sglang_capture in SGLang's schedulers. The engine must run eagerly: compiled graphs and CUDA graph
replays do not call Python hooks.
"""
from __future__ import annotations

import collections
import inspect
import json
from typing import Callable

import torch

# Constructor arguments that name a layer rather than parametrize its math; left out so layers dedupe.
_NOT_PARAMETERS = {"prefix"}


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


class LayerRecorder:
    def __init__(self, bases: tuple[type, ...], op_name: Callable[[type], str]):
        self.bases, self.op_name = bases, op_name
        self._init_params: dict[int, dict] = {}  # id(module) -> its constructor arguments, described
        self._calls: collections.Counter[str] = collections.Counter()  # JSON of the call -> forward calls

    def _recording_new(self, original_new):
        def new(cls, *args, **kwargs):
            # object.__new__ refuses constructor arguments once a class overrides __new__.
            instance = original_new(cls) if original_new is object.__new__ else original_new(cls, *args, **kwargs)
            try:
                bound = inspect.signature(type(instance).__init__).bind(instance, *args, **kwargs)
                params = {k: describe(v) for k, v in list(bound.arguments.items())[1:] if k not in _NOT_PARAMETERS}
            except TypeError:  # a constructor we cannot bind: keep the raw arguments
                params = {"args": describe(args), "kwargs": {k: describe(v) for k, v in kwargs.items()}}
            self._init_params[id(instance)] = params
            return instance

        return new

    def _record_forward(self, module: torch.nn.Module, args: tuple) -> None:
        if isinstance(module, self.bases):
            cls = type(module)
            key = {"op": self.op_name(cls), "class": cls.__name__, "module": cls.__module__,
                   "init": self._init_params.get(id(module)), "inputs": [describe(a) for a in args]}
            self._calls[json.dumps(key, sort_keys=True)] += 1

    def install(self) -> LayerRecorder:
        """Record from now on: layers built later (constructor arguments) and every forward call."""
        self._originals = {base: base.__dict__.get("__new__") for base in self.bases}
        for base in self.bases:
            base.__new__ = staticmethod(self._recording_new(base.__new__))
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._record_forward)
        return self

    def uninstall(self) -> None:
        """Stop recording (tests; an engine process records until it ends)."""
        self._hook.remove()
        for base, original in self._originals.items():
            if original is None:
                del base.__new__
            else:
                base.__new__ = original

    def reset(self) -> None:
        self._calls.clear()

    def operators(self) -> list[dict]:
        """Each distinct (operator, init params, input signature) executed since the last reset, with its count."""
        return [{**json.loads(key), "count": count} for key, count in sorted(self._calls.items())]
