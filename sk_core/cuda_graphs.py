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
  capture again after updating. The check reads each tensor's slot in its owner's `_parameters`/`_buffers`
  (kept from capture) rather than walking the module tree: a few hundred nanoseconds per tensor. Inference
  tensors have no version counter: for them identity and storage are checked.

Per call from Python it costs the checks, one copy per input and the replay's launch: a few microseconds
over `graph.replay()` (results/h200/geglu/README.md measures it).
"""
from __future__ import annotations

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
        for i, (a, sig) in enumerate(zip(args, self._signature)):
            if type(a) is not torch.Tensor or _signature(a) != sig:
                _check_input(i, a, statics[i])
        if not self._params.unchanged():
            raise RuntimeError(
                "graphed callable: a parameter or buffer of the module changed (in place or reassigned) after "
                "capture; the graph would keep using the captured values. Call make_graphed_callables again.")
        # Context managers cost microseconds a call: entered only where needed. Buffers made under inference mode
        # can be written only inside it; an input that requires grad would give the buffer autograd history.
        if (self._inference and not torch.is_inference_mode_enabled()) or any(a.requires_grad for a in args):
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


def _signature(t: torch.Tensor) -> tuple:
    return (t.shape, t.dtype, t.device, t.layout, t.stride())


class _Snapshot:
    """Each parameter's and buffer's owner slot, object, storage and version at capture, checked per call."""

    def __init__(self, module: torch.nn.Module):
        self._slots = []  # (owner's _parameters or _buffers dict, name, tensor, data_ptr, version or None)
        self._sizes = []  # (dict, number of entries): a tensor registered after capture changes it
        for sub in module.modules():
            for table in (sub._parameters, sub._buffers):
                self._sizes.append((table, len(table)))
                for name, t in table.items():
                    if t is not None:
                        self._slots.append((table, name, t, t.data_ptr(), None if t.is_inference() else t._version))
        # Sub-modules added or removed after capture: their tensors would escape the slots above.
        self._modules = [(sub._modules, len(sub._modules)) for sub in module.modules()]

    def unchanged(self) -> bool:
        for table, name, t, ptr, version in self._slots:
            if table.get(name) is not t or t.data_ptr() != ptr or (version is not None and t._version != version):
                return False
        return (all(len(table) == n for table, n in self._sizes)
                and all(len(children) == n for children, n in self._modules))
