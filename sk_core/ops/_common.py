"""Plumbing shared by the op files: argument checks with clear errors, 2-D views, the reference backward (for ops
without a backward kernel), and the autograd rules of the ops that write into their arguments."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from sk import coverage
from sk.ops.weight_cache import cacheable

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


# Host-side integer helpers in plain Python: triton.cdiv / next_power_of_2 are constexpr functions that cost
# microseconds a call from the host (results/h100/engines/2026-12-07/op_host_path-h100-cprofile/), and a launch
# makes several such calls.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def plain_eager(*tensors: torch.Tensor | None) -> bool:
    """Whether a call can run an op's implementation directly rather than through its custom op: not traced by
    torch.compile, no TorchDispatchMode active (FakeTensorMode, profiling modes: they see the custom op), and only
    tensors with real memory (`weight_cache.cacheable`: fake, functional and other `__torch_dispatch__` tensors
    keep torch.library's dispatch, whose fake and functional forms they need; None skipped)."""
    return (not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() == 0
            and all(cacheable(t) for t in tensors if t is not None))


def eager_autograd(*tensors: torch.Tensor | None) -> bool:
    """Whether a training call (grad mode on, an input that requires grad) can run as the op's `eager_function`:
    `plain_eager`, outside torch.func's transforms (which need torch.library's autograd)."""
    return (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
            and plain_eager(*tensors) and not torch._C._are_functorch_transforms_active())


def eager_function(impl: Callable, setup_context: Callable, backward: Callable) -> type[torch.autograd.Function]:
    """A torch.autograd.Function of a custom op's implementation, setup_context and backward formula, for
    `eager_autograd` calls: they skip torch.library's dispatch, about 20 µs of host time a call each way (twice the
    implementation's own; results/h200/ops/README.md, 2026-12-03), paid 50-100 times by a small model's training
    step. Its forward takes ctx (autograd.Function's other style binds its arguments with inspect each call)."""
    def forward(ctx, *inputs):
        output = impl(*inputs)
        setup_context(ctx, inputs, output)
        return output

    return type(f"{impl.__name__.strip('_')}_function", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward), "__doc__": impl.__doc__})


def _tensors(args) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


def direct(*tensors: torch.Tensor | None) -> bool:
    """Whether a call that wants no gradient can run an op's implementation itself: `plain_eager`, outside
    torch.func's transforms (vmap and the others need the op's dispatch)."""
    return plain_eager(*tensors) and not torch._C._are_functorch_transforms_active()


def bump_versions(*written: torch.Tensor) -> None:
    """Advance the version counters of tensors written in place outside torch's dispatch, as a mutating op's
    dispatch does (autograd's saved-tensor checks and `sk.ops.weight_cache` read them); inference tensors have
    none."""
    for t in written:
        if not t.is_inference():
            torch.autograd.graph.increment_version(t)


def eager_or_op(op: "LibraryOp", impl: Callable, setup_context: Callable, backward: Callable) -> Callable:
    """A call of op `op` (made from `impl`, with `setup_context` and `backward` registered as its autograd) that
    runs as its `eager_function` where `eager_autograd` allows, as `impl` itself where no gradient is wanted and
    `direct` allows (`LibraryOp.run`; torch.library's dispatch alone costs 5 µs of host time a call on inference tensors, 20
    µs in grad mode: results/h100/engines/2026-12-07/op_dispatch_overhead-cpu.txt), and as `op` elsewhere."""
    function = eager_function(impl, setup_context, backward)

    def call(*args):
        tensors = _tensors(args)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return function.apply(*args) if eager_autograd(*tensors) else op(*args)
        return op.run(*args)
    return call


def direct_or_op(op: Callable, impl: Callable) -> Callable:
    """A call of custom op `op` that runs its implementation `impl` directly where `plain_eager` allows (backward
    formulas: the op only where torch.compile traces them)."""
    def call(*args):
        return impl(*args) if plain_eager(*_tensors(args)) else op(*args)
    return call


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"sk.ops.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"sk.ops.{op}: {name} has dtype {t.dtype} (shape {tuple(t.shape)}); supported: bfloat16, float16, "
            f"float32 (kernel) and float64 (reference only)"
        )


def check_same_device(op: str, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        seen = ", ".join(f"{n} on {t.device}" for n, t in zip(names, tensors))
        raise ValueError(f"sk.ops.{op}: all tensors must be on one device; got {seen}")


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """`t` as (rows, last dim) with unit stride along the last dim: a view when possible, a copy otherwise."""
    if t.dim() == 2 and t.stride(-1) == 1:  # already rows: the common case, without reshape's dispatch
        return t
    n = t.shape[-1]
    # reshape(-1, 0) is ambiguous (any row count fits 0 elements): width 0 names its row count.
    t2 = t.reshape(-1, n) if n else t.reshape(math.prod(t.shape[:-1]), 0)
    return t2 if t2.stride(-1) == 1 or t2.shape[-1] <= 1 else t2.contiguous()


# ----------------------------------------------------------------------------------------------- writes into arguments

def attach_reference_backward(
    op: LibraryOp, coverage_name: Callable[[Sequence], str], reference: Callable
) -> None:
    """Give `op` an autograd formula: the gradient of `reference` at the same inputs, recomputed in the backward.

    The table's `training` column says whether a backward kernel exists; until it does, each backward is a
    recorded fallback (an error under strict mode), so training is correct everywhere and never silently slow.
    """

    def setup_context(ctx, inputs, output):
        ctx.inputs = inputs
        ctx.save_for_backward(*[t for t in inputs if isinstance(t, torch.Tensor)])
        coverage.note_forward(ctx)

    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        inputs = [next(saved) if isinstance(t, torch.Tensor) else t for t in ctx.inputs]
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        with coverage.backward_of(ctx):
            coverage.decide(coverage_name(inputs), tensors, backward=True)
        leaves = [t.detach().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
                  for t in inputs]
        with torch.enable_grad():
            outputs = reference(*leaves)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None]
        wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        found = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
        found = iter(found)
        return tuple(next(found) if isinstance(t, torch.Tensor) and t.requires_grad else None for t in leaves)

    op.register_autograd(backward, setup_context=setup_context)


# ----------------------------------------------------------------------------------------------- writes into arguments

def check_writable(op: str, names: Sequence[str], tensors: Sequence[torch.Tensor], functional: str) -> None:
    """Refuse, before writing anything, what torch refuses for its own in-place ops under grad mode: writing into
    a leaf tensor that requires grad, or into a view of one."""
    for name, t in zip(names, tensors):
        if not t.requires_grad:
            continue
        if t.is_leaf:
            what = "is a leaf tensor that requires grad"
        # Dynamo cannot trace _is_view(); there, tracing the copy_ below raises torch's own refusal instead.
        elif not torch.compiler.is_compiling() and t._is_view() and t._base.is_leaf:
            what = "is a view of a leaf tensor that requires grad"
        else:
            continue
        raise RuntimeError(
            f"sk.ops.{op}: {name} {what} (shape {tuple(t.shape)}); an in-place op may not write into it while grad "
            f"mode is on (torch refuses the same: 'a leaf Variable that requires grad is being used in an in-place "
            f"operation'). Use sk.ops.{functional}, which returns new tensors, or write into {name}.clone()."
        )


def refuse_out_autograd(op: str, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    """`out=` forms have no autograd, as torch's own out= functions: refuse them when a gradient is wanted."""
    if not torch.is_grad_enabled():
        return
    wanting = [n for n, t in zip(names, tensors) if t.requires_grad]
    if wanting:
        raise RuntimeError(
            f"sk.ops.{op}(): out=... does not support automatic differentiation (as torch's out= functions), but "
            f"{' and '.join(wanting)} require{'s' if len(wanting) == 1 else ''} grad with grad mode on; call "
            f"sk.ops.{op} without out= to train, or run under torch.no_grad()/torch.inference_mode()."
        )


# ----------------------------------------------------------------------------------------------- registration

class LibraryOp:
    """An operator `ns::name` defined with `torch.library.Library` from `impl` (its schema inferred from the
    annotations, as `torch.library.custom_op` infers it), `impl` registered for every backend
    (CompositeExplicitAutograd); with the part of `torch.library.CustomOpDef`'s interface the op files use:
    calling it, `register_fake`, `register_autograd`, and `opoverload` (`torch.ops.ns.name.default`).

    Why not `custom_op`: each call of a custom op runs Python of torch's around the implementation (the output
    aliasing check, a Dynamo-disabled frame): twice the dispatch's host time, 5.1 against 2.5 µs on inference
    tensors (results/h100/engines/2026-12-07/op_dispatch_overhead-cpu.txt), paid at each call compiled code makes
    (vLLM's eagerly run prefill calls ours from Inductor's wrapper). What custom_op registers besides, for the
    ops here: the fake (`register_fake`; one that does nothing for an op that returns nothing) and, for an op
    that writes into its arguments, an ADInplaceOrView kernel that advances the written tensors' version
    counters (autograd's checks of saved tensors and `sk.ops.weight_cache` read them).
    """

    def __init__(self, qualname: str, impl: Callable, *, mutates_args: Sequence[str] = ()):
        self.qualname = qualname
        namespace, self.name = qualname.split("::")
        self._lib = torch.library.Library(namespace, "FRAGMENT")  # registrations last as long as the object
        schema = torch.library.infer_schema(impl, mutates_args=tuple(mutates_args))
        self._lib.define(self.name + schema, tags=(torch.Tag.pt2_compliant_tag,))
        self._lib.impl(self.name, impl, "CompositeExplicitAutograd")
        self._impl = impl
        self.opoverload = getattr(getattr(torch.ops, namespace), self.name).default
        self.__doc__ = impl.__doc__
        self._written = [i for i, a in enumerate(self.opoverload._schema.arguments)
                         if a.alias_info is not None and a.alias_info.is_write]
        if self._written:
            self._register_version_bump()
        if not self.opoverload._schema.returns:  # writes into its arguments only: its fake does nothing
            self.register_fake(lambda *args: None)

    def __call__(self, *args):
        return self.opoverload(*args)

    def run(self, *args):
        """A call from eager code that wants no gradient: the implementation itself where `direct` allows (the
        dispatch skipped, the written arguments' version counters advanced as its dispatch would; eager_or_op says
        what that saves), else the op through its dispatch."""
        if direct(*_tensors(args)):
            out = self._impl(*args)
            bump_versions(*(args[i] for i in self._written))
            return out
        return self.opoverload(*args)

    def register_fake(self, fake: Callable) -> Callable:
        torch.library.register_fake(self.qualname, fake, lib=self._lib)
        return fake

    def register_autograd(self, backward: Callable, *, setup_context: Callable) -> None:
        torch.library.register_autograd(self.qualname, backward, setup_context=setup_context, lib=self._lib)

    def _register_version_bump(self) -> None:
        written, op, below = self._written, self.opoverload, torch._C._after_ADInplaceOrView_keyset

        def bump_then_redispatch(keyset, *args):
            bump_versions(*(args[i] for i in written))
            return op.redispatch(keyset & below, *args)
        self._lib.impl(self.name, bump_then_redispatch, "ADInplaceOrView", with_keyset=True)


_guard_libraries: list[torch.library.Library] = []


def refuse_autograd_of_mutating_op(op: LibraryOp, instead: str) -> None:
    """Make an op that writes into its arguments raise when called with grad mode on and an input that requires
    grad.

    torch attaches no autograd formula to mutating ops (register_autograd refuses them), and what runs at their
    Autograd key without one leaves the written tensors' history as it was: silently wrong gradients. This
    Autograd kernel is registered there instead. The public functions send training calls to the functional op or refuse them first, so only a
    direct call of the raw op (`torch.ops.sk.*`) with a gradient wanted reaches the error here.
    """
    overload = op.opoverload
    arg_names = [a.name for a in overload._schema.arguments]

    def autograd_kernel(keyset, *args):
        if torch.is_grad_enabled():
            wanting = [n for n, a in zip(arg_names, args) if isinstance(a, torch.Tensor) and a.requires_grad]
            if wanting:
                raise RuntimeError(
                    f"{overload._schema.name}: {', '.join(wanting)} require{'s' if len(wanting) == 1 else ''} grad "
                    f"with grad mode on, but this op writes in place without recording autograd history; for "
                    f"training call {instead}."
                )
        # As an Autograd kernel does without a gradient: continue below the Autograd keys.
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    namespace, name = overload._schema.name.split("::")
    lib = torch.library.Library(namespace, "FRAGMENT")
    # Replacing one already there (torch.library.custom_op's ops have one) needs allow_override in torch 2.11.
    lib.impl(name, autograd_kernel, "Autograd", with_keyset=True, allow_override=True)
    _guard_libraries.append(lib)  # a Library's registrations last as long as the object
