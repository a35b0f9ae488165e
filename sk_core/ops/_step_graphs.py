"""An op's training step (forward and backward) replayed from CUDA graphs when the same call repeats.

A small op's eager training step is bound by host work: at the GEGLU block's seed shape its launches and
bookkeeping take several times its kernels' GPU time (results/h200/geglu/README.md, "Where it stands"). Once a
call signature has been seen `CAPTURE_AFTER` times (the same activation shape, dtype and strides; the same
parameter tensors at the same addresses; the same inputs needing grad; the same non-tensor arguments and op
settings), its forward and its backward are captured as two CUDA graphs over static buffers, and later calls
copy the activation in and replay them: the same kernels on the same values, so the same bits as the eager call.

What keeps it exact:
- Parameters are read where they are: an in-place update between steps (an optimizer step, `copy_`,
  `load_state_dict`) is seen by the next replay, and casts of higher-precision masters to the compute dtype
  run inside the graphs. A parameter at another address is another signature. Between a forward and its
  backward, parameters are checked as autograd checks an eager call's: modified in place raises as eager
  does; moved to other memory (resized, re-allocated) runs that backward eagerly.
- Nothing a caller receives is a graph's buffer: the output and all gradients are copies (the gradients
  packed per dtype, one copy each), so a later replay never overwrites what they hold.
- A slot (one captured forward/backward pair and its buffers) holds one call's saved activations from its
  forward until autograd frees that call's node. A forward finding every slot of its signature busy (a
  second call before the first one's graph is dropped) captures another, up to `SLOTS`, else runs eagerly.
  A slot used from another stream than its last replay's waits for that stream first.
- Eager calls only: not while the caller captures a CUDA graph (its graph then holds the kernels), not under
  saved-tensor hooks (activation checkpointing, `save_on_cpu`: they decide what autograd keeps, and a replay
  keeps its activations itself), not with the inputs on another device than the current one. Captured with
  autocast off, as the eager backward runs (the op's inputs are already in their dtypes).
- A capture that fails (out of memory, say) is reported with a warning, and that signature runs eagerly from
  then on.
Costs: each slot keeps its buffers and its graphs' memory pool (the step's activations, gradients and weight
copies, in allocator segments: 160 MiB at the GEGLU seed shape on the H200, as `bench_geglu.py` reports), for
up to `MAX_SIGNATURES` signatures per op; a signature's slots are freed when one of its parameters is.
`SK_STEP_GRAPHS=0` turns replay off.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Callable, Sequence

import torch

from sk import coverage, settings
from sk.ops import weight_cache

CAPTURE_AFTER = 2  # eager calls of a signature before it is captured: shapes seen once never pay a capture
SLOTS = 2  # a training loop's next forward usually starts while the last step's graph is still referenced
MAX_SIGNATURES = 32
_MAX_TRACKED = 4096  # signatures counted towards CAPTURE_AFTER; forgotten all at once beyond it


class _SavedContext:
    """What `setup_context` and `backward` use of an autograd ctx, for a captured or re-run step."""

    def __init__(self, needs_input_grad: tuple[bool, ...]):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple = ()

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self.saved_tensors = tensors


class _Slot:
    """A captured forward/backward pair and the buffers its graphs read and write. `inputs` holds the static
    activations and the non-tensor arguments (parameters, at `param_indices`: None; the graphs read them at
    `param_ptrs`). `layout` says where each gradient lies in `packs`: (pack, offset, shape, strides) or None."""

    def __init__(self, inputs: tuple, param_indices: list[int], param_ptrs: tuple, output: tuple,
                 grad_output: torch.Tensor, grads: tuple, packs: list[torch.Tensor], layout: list,
                 forward_graph: torch.cuda.CUDAGraph, backward_graph: torch.cuda.CUDAGraph):
        self.inputs, self.param_indices, self.param_ptrs = inputs, param_indices, param_ptrs
        self.output, self.grad_output = output, grad_output
        self.grads, self.packs, self.layout = grads, packs, layout  # grads: kept for their buffers in the pool
        self.forward_graph, self.backward_graph = forward_graph, backward_graph
        self.stream = None  # of the last replay
        self.busy = False

    def enter(self) -> None:
        """Order this replay after the slot's last one, when that ran on another stream."""
        stream = torch.cuda.current_stream()
        if stream != self.stream:
            if self.stream is not None:
                stream.wait_stream(self.stream)
            self.stream = stream


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
    input (a parameter) is read in place. `settings()` returns the op's switches read at launch, which a
    capture fixes. Replays are counted as kernel calls of `op` in the coverage report."""

    def __init__(self, op: str, forward: Callable, setup_context: Callable, backward: Callable,
                 activations: Sequence[int] = (0,), settings: Callable[[], tuple] = tuple):
        self.op, self._forward, self._setup_context, self._backward = op, forward, setup_context, backward
        self.activations, self._settings = tuple(activations), settings
        self._seen: dict = {}
        self._slots: dict[tuple, list[_Slot]] = {}
        self._eager_only: set = set()  # signatures whose capture failed

    def forward(self, ctx, inputs: tuple) -> torch.Tensor | None:
        """The op's result from a replay (and `ctx` ready for `backward`), or None: the caller runs it eagerly."""
        device = inputs[self.activations[0]].device
        if (not settings.get("step_graphs") or device.index != torch.cuda.current_device() or torch.cuda.is_current_stream_capturing()
                or torch._C._autograd._top_saved_tensors_default_hooks(False) is not None):
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
            for p in self._params(inputs):  # a parameter freed: nothing can call with it again
                if p is not None:
                    weakref.finalize(p, self._slots.pop, signature, None)
        slot = next((s for s in slots if not s.busy), None)
        if slot is None:
            if len(slots) == SLOTS:
                return None
            try:
                slot = self._capture(inputs, ctx.needs_input_grad)
            except Exception as e:  # out of memory, a compiler's or driver's refusal: run it eagerly, say so once
                warnings.warn(f"sk.ops.{self.op}: capturing its training step in a CUDA graph failed "
                              f"({type(e).__name__}: {e}); this call signature runs eagerly from now on")
                self._eager_only.add(signature)
                if not slots:
                    del self._slots[signature]
                return None
            slots.append(slot)
        slot.enter()
        for i in self.activations:
            slot.inputs[i].copy_(inputs[i])
        slot.forward_graph.replay()
        ctx.save_for_backward(*[inputs[i] for i in slot.param_indices])  # autograd checks them at backward
        ctx.step_lease = _Lease(slot)
        coverage.count_kernel_call(self.op)
        return slot.output[0].clone()

    @staticmethod
    def replays(ctx) -> bool:
        """Whether `ctx` belongs to a replayed forward (then `backward` must take its gradient)."""
        return hasattr(ctx, "step_lease")

    def backward(self, ctx, grad: torch.Tensor) -> tuple:
        slot = ctx.step_lease.slot
        params = ctx.saved_tensors  # raises if one was modified in place since the forward, as eagerly
        if any(p is not None and p.data_ptr() != ptr for p, ptr in zip(params, slot.param_ptrs)):
            # A parameter moved to other memory since the forward: the graph would read the old one.
            inputs = list(slot.inputs)
            for i, p in zip(slot.param_indices, params):
                inputs[i] = p
            eager_ctx = _SavedContext(ctx.needs_input_grad)
            self._setup_context(eager_ctx, tuple(inputs), slot.output)
            return self._backward(eager_ctx, grad)
        slot.enter()
        slot.grad_output.copy_(grad)
        slot.backward_graph.replay()
        packs = [p.clone() for p in slot.packs]
        coverage.count_kernel_call(self.op)
        return tuple(None if where is None else packs[where[0]].as_strided(where[2], where[3], where[1])
                     for where in slot.layout)

    def _param_indices(self, inputs: tuple) -> list[int]:
        return [i for i, t in enumerate(inputs)
                if i not in self.activations and (t is None or isinstance(t, torch.Tensor))]

    def _params(self, inputs: tuple) -> tuple:
        return tuple(inputs[i] for i in self._param_indices(inputs))

    def _signature(self, inputs: tuple, needs_input_grad: tuple) -> tuple:
        parts = []
        for i, t in enumerate(inputs):
            if not isinstance(t, torch.Tensor):
                parts.append(t)
            elif i in self.activations:
                parts.append((t.shape, t.stride(), t.dtype, t.device))
            else:  # read in place by the graphs: its address is part of the signature
                parts.append((t.data_ptr(), t.shape, t.stride(), t.dtype, t.device))
        return tuple(parts), needs_input_grad, self._settings()

    def _capture(self, inputs: tuple, needs_input_grad: tuple) -> _Slot:
        static = tuple(t.clone() if i in self.activations else t for i, t in enumerate(inputs))
        stream = torch.cuda.Stream()
        forward_graph, backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with coverage.uncounted(), torch.autocast("cuda", enabled=False), weight_cache.within_step_graph():
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
            # One pool for both: the backward reuses what the forward freed, never what it saved (held by slot).
            with torch.cuda.graph(backward_graph, pool=forward_graph.pool(), stream=stream,
                                  capture_error_mode="thread_local"):
                grads = tuple(self._backward(ctx, grad_output))
                packs, layout = _pack(grads)
        params = self._param_indices(inputs)
        return _Slot(tuple(None if i in params else t for i, t in enumerate(static)), params,
                     tuple(None if inputs[i] is None else inputs[i].data_ptr() for i in params),
                     output, grad_output, grads, packs, layout, forward_graph, backward_graph)


def _pack(grads: tuple) -> tuple[list[torch.Tensor], list]:
    """The gradients concatenated per dtype (one copy per dtype hands them all out), and where each lies:
    (pack, offset, shape, contiguous strides), or None for an input without one."""
    members: dict[torch.dtype, list[torch.Tensor]] = {}
    layout = []
    for g in grads:
        if g is None:
            layout.append(None)
            continue
        group = members.setdefault(g.dtype, [])
        strides = torch.empty(g.shape, device="meta").stride()  # contiguous, as the parameters' grads are laid out
        layout.append((list(members).index(g.dtype), sum(t.numel() for t in group), g.shape, strides))
        group.append(g)
    return [torch.cat([t.reshape(-1) for t in group]) for group in members.values()], layout
