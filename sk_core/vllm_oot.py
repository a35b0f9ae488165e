"""vLLM's out-of-tree layer replacement, as our adapter (`sk.adapters.vllm`) and `sk eval --candidates` use it.

vLLM's `CustomOp.__new__` looks a layer's class name up in its out-of-tree registry, so once a subclass is
registered under that name, building the layer anywhere yields the subclass, with the stock constructor and
weight names. At construction vLLM binds one of its per-platform forwards (forward_native under Inductor,
where custom ops default to off): a replacement routes every one of them to the same function, so it runs
whichever is bound, eager or compiled. Importing this module imports no vLLM.
"""
from __future__ import annotations

from typing import Callable

# Every forward vLLM's CustomOp may bind at construction (one per platform).
FORWARDS = ("forward_native", "forward_cuda", "forward_hip", "forward_xpu", "forward_cpu", "forward_tpu",
            "forward_oot")


def replacement(base: type, forward: Callable, methods: dict | None = None, *, name: str | None = None,
                module: str | None = None) -> type:
    """A subclass of the vLLM layer `base` with `methods`, whose every platform forward is `forward`."""
    namespace = {**(methods or {}), **dict.fromkeys(FORWARDS, forward)}
    if module is not None:
        namespace["__module__"] = module
    return type(name or base.__name__, (base,), namespace)


def register(base: type, ours: type, owner: str) -> None:
    """Register `ours` as vLLM's out-of-tree `base` (once per process); another plugin's replacement is refused."""
    from vllm.model_executor.custom_op import op_registry_oot

    current = op_registry_oot.get(base.__name__)
    if current is ours:
        return
    if current is not None:
        raise RuntimeError(f"vLLM's {base.__name__} is already replaced by {current.__module__}."
                           f"{current.__qualname__}; {owner} will not override another plugin's layer")
    base.register_oot(ours)
    ours.name = base.name  # register_oot names ours after the class; keep vLLM's op name for custom_ops and logs
