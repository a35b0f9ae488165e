"""An op's training step (forward and backward) replayed from CUDA graphs when the same call repeats.

A small op's eager training step is bound by host work: at the GEGLU block's seed shape the H200 host spent
~1.9 ms a step on launches and bookkeeping around ~0.2 ms of kernels. Once a call signature has been seen
`CAPTURE_AFTER` times (the same activation shape, dtype and strides; the same parameter tensors at the same
addresses; the same inputs needing grad; the same non-tensor arguments), its forward and its backward are
captured as two CUDA graphs over static buffers, and later calls copy the activation in and replay them: the
same kernels on the same values, so the same bits as the eager call.

What keeps it exact:
- Parameters are read where they are: an in-place update (an optimizer step, `copy_`, `load_state_dict`) is
  seen by the next replay, and casts of higher-precision masters to the compute dtype run inside the graphs.
  A parameter at another address is another signature.
- Callers get copies of the output and of the activation's gradient, so a later replay never overwrites what
  they hold. Parameter gradients go to autograd's accumulation, which copies or adds them; a hook registered
  on a parameter tensor sees the static buffer (clone it there to keep it).
- A slot (one captured forward/backward pair and its buffers) holds one call's saved activations from its
  forward until autograd frees that call's node. A forward finding every slot of its signature busy (a
  second call before the first one's graph is dropped) captures another, up to `SLOTS`, else runs eagerly.
- Eager calls only, and not while the caller captures a CUDA graph (its graph then holds the kernels).
  Captured with autocast off, as the backward runs eagerly (the op's inputs are already in their dtypes).
- A capture that fails (out of memory, say) is reported with a warning, and that signature runs eagerly from
  then on.
Costs: each slot keeps its buffers and its graphs' memory pool (the step's activations, gradients and weight
copies, in allocator segments: 138 MiB at the GEGLU seed shape on the H200, as `bench_geglu.py` reports), for
up to `MAX_SIGNATURES` signatures per op.
`SK_STEP_GRAPHS=0` turns replay off.
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Sequence

import torch

from sk import coverage

ENABLED = os.environ.get("SK_STEP_GRAPHS", "1") == "1"
CAPTURE_AFTER = 2  # eager calls of a signature before it is captured: shapes seen once never pay a capture
SLOTS = 2  # a training loop's next forward usually starts while the last step's graph is still referenced
MAX_SIGNATURES = 32
_MAX_TRACKED = 4096  # signatures counted towards CAPTURE_AFTER; forgotten all at once beyond it


class _SavedContext:
    """What `setup_context` and `backward` use of an autograd ctx, for the captured step."""

    def __init__(self, needs_input_grad: tuple[bool, ...]):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple = ()

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self.saved_tensors = tensors


class _Slot:
    def __init__(self, inputs: tuple, output: tuple, ctx: _SavedContext, grad_output: torch.Tensor,
                 grads: tuple, forward_graph: torch.cuda.CUDAGraph, backward_graph: torch.cuda.CUDAGraph):
        self.inputs, self.output, self.ctx, self.grad_output, self.grads = inputs, output, ctx, grad_output, grads
        self.forward_graph, self.backward_graph = forward_graph, backward_graph
        self.busy = False


class _Lease:
    """Kept on the autograd ctx of the call using a slot: the slot is free again when autograd drops that ctx."""

    __slots__ = ("slot",)

    def __init__(self, slot: _Slot):
        self.slot = slot
        slot.busy = True

    def __del__(self):
        self.slot.busy = False


class StepGraphs:
    """Captures and replays one op's step. `forward(*inputs)` returns a tuple whose first item is the op's
    result; `setup_context(ctx, inputs, output)` and `backward(ctx, grad)` are the op's autograd pair (as given
    to `register_autograd`); inputs at `activations` are copied into the graphs' buffers, every other tensor
    input is read in place. Replays are counted as kernel calls of `op` in the coverage report."""

    def __init__(self, op: str, forward: Callable, setup_context: Callable, backward: Callable,
                 activations: Sequence[int] = (0,)):
        self.op, self._forward, self._setup_context, self._backward = op, forward, setup_context, backward
        self.activations = tuple(activations)
        self._seen: dict = {}
        self._slots: dict[tuple, list[_Slot]] = {}
        self._eager_only: set = set()  # signatures whose capture failed

    def forward(self, ctx, inputs: tuple) -> torch.Tensor | None:
        """The op's result from a replay (and `ctx` ready for `backward`), or None: the caller runs it eagerly."""
        if not ENABLED or torch.cuda.is_current_stream_capturing():
            return None
        signature = self._signature(inputs, ctx.needs_input_grad)
        if signature in self._eager_only:
            return None
        slots = self._slots.get(signature)
        if slots is None:
            seen = self._seen.get(signature, 0) + 1
            if seen <= CAPTURE_AFTER or len(self._slots) >= MAX_SIGNATURES:
                if len(self._seen) >= _MAX_TRACKED:
                    self._seen.clear()
                self._seen[signature] = seen
                return None
            slots = self._slots[signature] = []
        slot = next((s for s in slots if not s.busy), None)
        if slot is None:
            if len(slots) == SLOTS:
                return None
            try:
                slot = self._capture(inputs, ctx.needs_input_grad)
            except RuntimeError as e:  # torch.cuda.OutOfMemoryError among them
                warnings.warn(f"sk.ops.{self.op}: capturing its training step in a CUDA graph failed "
                              f"({type(e).__name__}: {e}); this call signature runs eagerly from now on")
                self._eager_only.add(signature)
                return None
            slots.append(slot)
        for i in self.activations:
            slot.inputs[i].copy_(inputs[i])
        slot.forward_graph.replay()
        ctx.step_lease = _Lease(slot)
        coverage.count_kernel_call(self.op)
        return slot.output[0].clone()

    @staticmethod
    def replays(ctx) -> bool:
        """Whether `ctx` belongs to a replayed forward (then `backward` must take its gradient)."""
        return hasattr(ctx, "step_lease")

    def backward(self, ctx, grad: torch.Tensor) -> tuple:
        slot = ctx.step_lease.slot
        slot.grad_output.copy_(grad)
        slot.backward_graph.replay()
        coverage.count_kernel_call(self.op)
        # The activations' gradients reach the caller's code: copies. Parameters' go to autograd's accumulation.
        return tuple(g.clone() if i in self.activations and g is not None else g for i, g in enumerate(slot.grads))

    def _signature(self, inputs: tuple, needs_input_grad: tuple) -> tuple:
        parts = []
        for i, t in enumerate(inputs):
            if not isinstance(t, torch.Tensor):
                parts.append(t)
            elif i in self.activations:
                parts.append((t.shape, t.stride(), t.dtype, t.device))
            else:  # read in place by the graphs: its address is part of the signature
                parts.append((t.data_ptr(), t.shape, t.stride(), t.dtype, t.device))
        return tuple(parts), needs_input_grad

    def _capture(self, inputs: tuple, needs_input_grad: tuple) -> _Slot:
        static = tuple(t.clone() if i in self.activations else t for i, t in enumerate(inputs))
        stream = torch.cuda.Stream(device=inputs[self.activations[0]].device)
        forward_graph, backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with coverage.uncounted(), torch.autocast("cuda", enabled=False):
            # One eager step on the capture stream first: cuBLAS sets up its workspace for a stream on first use,
            # which must not happen during capture (Triton's kernels are compiled by then: CAPTURE_AFTER calls ran).
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                ctx = _SavedContext(needs_input_grad)
                output = self._forward(*static)
                self._setup_context(ctx, static, output)
                grad_output = torch.zeros_like(output[0])
                self._backward(ctx, grad_output)
            torch.cuda.current_stream().wait_stream(stream)
            # thread_local: another thread's CUDA calls (a data loader's, say) must not break this capture.
            with torch.cuda.graph(forward_graph, stream=stream, capture_error_mode="thread_local"):
                output = self._forward(*static)
            ctx = _SavedContext(needs_input_grad)
            self._setup_context(ctx, static, output)
            # One pool for both: the backward reuses what the forward freed, never what it saved (held by ctx).
            with torch.cuda.graph(backward_graph, pool=forward_graph.pool(), stream=stream,
                                  capture_error_mode="thread_local"):
                grads = self._backward(ctx, grad_output)
        return _Slot(static, output, ctx, grad_output, tuple(grads), forward_graph, backward_graph)
