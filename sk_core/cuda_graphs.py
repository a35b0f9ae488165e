"""CUDA-graph inference for a module: warm up and capture once, then replay with new inputs.

    graphed = make_graphed_callables(block, (sample_x,))     # under torch.inference_mode() or no_grad
    y = graphed(next_x)                                      # copies next_x in, replays, returns static output

Contract of the returned callable:
- every input must match its sample's shape, dtype, device, layout and strides; anything else is a
  `ValueError` naming the argument and the difference (a graph replays fixed addresses and sizes);
- the output is a static tensor that the next call overwrites: `.clone()` it to keep it;
- parameters and buffers are fixed for its lifetime. The graph reads the memory they (and any weight
  copies the ops made, e.g. BF16 copies of FP32 masters) had at capture, so an in-place update or a
  reassignment would be silently ignored; instead the callable checks their identity, storage and
  version counters on every call and raises `RuntimeError` if any changed: capture again after updating.
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
            self._params = _snapshot(module)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._static_output = module(*self._static_inputs)

    def __call__(self, *args: torch.Tensor):
        if len(args) != len(self._static_inputs):
            raise ValueError(f"graphed callable: expected {len(self._static_inputs)} inputs, got {len(args)}")
        for i, (a, s) in enumerate(zip(args, self._static_inputs)):
            _check_input(i, a, s)
        if _snapshot(self.module) != self._params:
            raise RuntimeError(
                "graphed callable: a parameter or buffer of the module changed (in place or reassigned) after "
                "capture; the graph would keep using the captured values. Call make_graphed_callables again.")
        with torch.inference_mode(self._inference), torch.no_grad():
            for a, s in zip(args, self._static_inputs):
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


def _snapshot(module: torch.nn.Module) -> list:
    """What identifies each parameter's and buffer's current values: object, storage and version."""
    state = []
    for t in (*module.parameters(), *module.buffers()):
        state.append((id(t), t.data_ptr(), None if t.is_inference() else t._version))
    return state
