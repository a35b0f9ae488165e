"""CUDA-graph inference for a module: warm up and capture once, then replay with new inputs.

    graphed = make_graphed_callables(block, (sample_x,))     # under torch.inference_mode() or no_grad
    y = graphed(next_x)                                      # copies next_x in, replays, returns static output

Contract of the returned callable:
- every input must match its sample's shape, dtype, device, layout and strides; anything else is a
  `ValueError` naming the argument and the difference (a graph replays fixed addresses and sizes);
- the output is a static tensor that the next call overwrites: `.clone()` it to keep it;
- parameters and buffers are fixed for its lifetime. The graph reads the memory they (and any weight
  copies the ops made before capture, e.g. BF16 copies of FP32 masters, see `sk.ops.weight_cache`) had at
  capture, so an in-place update or a reassignment would be silently ignored; instead the callable checks
  each one's identity, storage and version counter on every call and raises `RuntimeError` if any changed:
  capture again after updating. The check compares the tensors' version counters and storages, and the sizes
  of their owners' tables, with those at capture (a few tuple comparisons; `_Snapshot`); each slot's object only
  after some module registered or reassigned a tensor. Inference tensors have no version counter: for them
  identity and storage are checked.

Per call from Python it costs the checks, one copy per input and the replay's launch: a few microseconds
over `graph.replay()` (results/h200/geglu/README.md measures it).
"""
from __future__ import annotations

import operator
from typing import Sequence

import torch


class GraphedCallable:
    def __init__(self, module: torch.nn.Module, sample_args: Sequence[torch.Tensor], warmup_iters: int = 3):
        if isinstance(sample_args, torch.Tensor):
            raise ValueError(f"make_graphed_callables: sample_args must be a sequence of CUDA tensors, one per input "
                             f"of the module, e.g. (x,); got a tensor of shape {tuple(sample_args.shape)} itself")
        sample_args = tuple(sample_args)
        # The capture's device and stream come from the samples: at least one is needed.
        if not sample_args:
            raise ValueError("make_graphed_callables: sample_args must hold at least one CUDA tensor, one per input "
                             "of the module, e.g. (x,); got an empty sequence ()")
        for i, a in enumerate(sample_args):
            if not isinstance(a, torch.Tensor) or a.device.type != "cuda":
                raise ValueError(f"make_graphed_callables: sample_args[{i}] must be a CUDA tensor, got "
                                 f"{type(a).__name__ if not isinstance(a, torch.Tensor) else a.device}")
        self.module = module
        self._inference = torch.is_inference_mode_enabled()
        with torch.no_grad():
            # Static input buffers with the samples' exact strides, so any input matching them copies in.
            self._static_inputs = tuple(torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                                        .copy_(a) for a in sample_args)
            # Warm-up on a side stream compiles every kernel (Triton JIT, cuBLAS handles) before capture.
            stream = torch.cuda.Stream(device=sample_args[0].device)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup_iters):
                    module(*self._static_inputs)
            torch.cuda.current_stream().wait_stream(stream)
            self._params = _Snapshot(module)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._static_output = module(*self._static_inputs)

        self._signature = tuple(_signature(a) for a in self._static_inputs)

    @property
    def graph(self) -> torch.cuda.CUDAGraph:
        """The captured graph (`graph.replay()` is what each call adds its checks and input copies to)."""
        return self._graph

    def __call__(self, *args: torch.Tensor):
        statics = self._static_inputs
        if len(args) != len(statics):
            raise ValueError(f"graphed callable: expected {len(statics)} inputs, got {len(args)}")
        if tuple(map(_signature, args)) != self._signature:
            for i, (a, s) in enumerate(zip(args, statics)):
                _check_input(i, a, s)
        if not self._params.unchanged():
            raise RuntimeError(
                "graphed callable: a parameter or buffer of the module changed (in place or reassigned) after "
                "capture; the graph would keep using the captured values. Call make_graphed_callables again.")
        # Context managers cost microseconds a call: entered only where needed. Buffers made under inference mode
        # can be written only inside it; an input that requires grad would give the buffer autograd history.
        if (self._inference and not torch.is_inference_mode_enabled()) or True in map(_requires_grad, args):
            with torch.inference_mode(self._inference), torch.no_grad():
                for a, s in zip(args, statics):
                    s.copy_(a)
        else:
            for a, s in zip(args, statics):
                s.copy_(a)
        self._graph.replay()
        return self._static_output


def make_graphed_callables(module: torch.nn.Module, sample_args: Sequence[torch.Tensor],
                           warmup_iters: int = 3) -> GraphedCallable:
    """Capture `module(*sample_args)` in a CUDA graph (after `warmup_iters` eager runs) for inference.

    Returns a callable taking inputs like `sample_args`; see the module docstring for its contract.
    """
    return GraphedCallable(module, sample_args, warmup_iters)


def _check_input(i: int, a, s: torch.Tensor) -> None:
    if not isinstance(a, torch.Tensor):
        raise ValueError(f"graphed callable: input {i} must be a tensor, got {type(a).__name__}")
    for what, got, want in (("shape", tuple(a.shape), tuple(s.shape)), ("dtype", a.dtype, s.dtype),
                            ("device", a.device, s.device), ("layout", a.layout, s.layout),
                            ("strides", a.stride(), s.stride())):
        if got != want:
            raise ValueError(f"graphed callable: input {i} has {what} {got}, but the graph was captured for "
                             f"{want}; every input must match its sample (capture another graph for it)")


def _signature(t) -> tuple | None:
    if type(t) is not torch.Tensor:
        return None
    return (t.shape, t.dtype, t.device, t.layout, t.stride())


_requires_grad = operator.attrgetter("requires_grad")
_version = operator.attrgetter("_version")
_data_ptr = torch.Tensor.data_ptr
# Bumped by torch's global hooks whenever any module anywhere registers or reassigns a parameter, buffer or
# sub-module: while it is unchanged, no slot of a snapshot can hold another tensor (see _Snapshot.unchanged).
_registrations = 0


def _registered(*_) -> None:
    global _registrations
    _registrations += 1


def _watch_registrations() -> None:
    from torch.nn.modules import module as nn_module

    if getattr(_watch_registrations, "done", False):
        return
    nn_module.register_module_parameter_registration_hook(_registered)
    nn_module.register_module_buffer_registration_hook(_registered)
    nn_module.register_module_module_registration_hook(_registered)
    _watch_registrations.done = True


class _Snapshot:
    """Each parameter's and buffer's owner slot, object, storage and version at capture, checked per call.

    Per call: the version counters (in-place updates), the storages (`.data =`) and the sizes of every owner's
    tables (deletions) are compared as tuples; each slot's object is compared only after some module of the
    process registered or reassigned a tensor or module (torch's global registration hooks count those)."""

    def __init__(self, module: torch.nn.Module):
        _watch_registrations()
        self._slots = []  # (owner's _parameters or _buffers dict, name, tensor)
        self._tables = []  # every owner's _parameters, _buffers and _modules: a size changes on any deletion
        for sub in module.modules():
            self._tables += [sub._parameters, sub._buffers, sub._modules]
            for table in (sub._parameters, sub._buffers):
                self._slots += [(table, name, t) for name, t in table.items() if t is not None]
        tensors = [t for _, _, t in self._slots]
        self._tensors = tuple(tensors)
        self._versioned = tuple(t for t in tensors if not t.is_inference())  # inference tensors have no counter
        self._sizes = tuple(map(len, self._tables))
        self._ptrs = tuple(map(_data_ptr, tensors))
        self._versions = tuple(map(_version, self._versioned))
        self._registrations = _registrations

    def unchanged(self) -> bool:
        if (tuple(map(_version, self._versioned)) != self._versions or tuple(map(_data_ptr, self._tensors)) != self._ptrs
                or tuple(map(len, self._tables)) != self._sizes):
            return False
        if self._registrations != _registrations:
            if any(table.get(name) is not t for table, name, t in self._slots):
                return False
            self._registrations = _registrations
        return True
