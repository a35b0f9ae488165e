"""Copies derived from weights (a cast to the compute dtype, a norm scale folded in, rows interleaved), made once
and reused until a source changes: the ops' FP32 masters cost one cast per change, not one per call.

    value = weight_cache.derived(op, sources, tag, make)     # make() -> value, run only when needed

An entry is valid while every source is the same object, on the same storage (`data_ptr`) and, for ordinary
tensors, at the same version counter, which every in-place update advances (an optimizer step, `copy_`,
`load_state_dict`; writes through `.data` do not: assign or `copy_`). What it costs: one value per entry (a
BF16 copy is half its FP32 master), held until a source is freed.

- **Inference tensors** (made under `torch.inference_mode()`, e.g. a model built inside it) have no version
  counter: their entries are keyed on identity and storage alone. Such a tensor cannot be changed outside
  inference mode; after changing one in place *inside* it, call `forget(tensor)` (or `clear()`), or the copy
  made before stays in use.
- **CUDA-graph capture** (a caller's `torch.cuda.graph`, `sk.cuda_graphs.make_graphed_callables`): a valid
  entry is returned and never re-made inside the capture, and it is kept alive as long as its sources even
  once replaced, since the graph reads its memory. A graph therefore computes with the weights as they were at
  capture (as `sk.cuda_graphs` documents): capture again after updating them. With no valid entry, `make()`
  runs inside the capture, so every replay repeats it: correct but slow, so it is recorded as a coverage miss of
  `op` ("call once before capturing") and raises under `strict()`.
- **Captures of training steps** (`sk_core/ops/_step_graphs.py`) run `make()` inside the graph on purpose
  (`within_step_graph()`): the masters change between replays and each replay must cast what it reads.
- **Writes the version counter does not see** (through `.data`, as the engines' weight loaders write; or an
  update while a captured graph replays the copy): `derived(..., remake=True)` makes the value again and copies
  it into the entry's own tensors, so that a graph captured reading them computes with the new weights too.
- **Counted**: each copy made is counted under `op` in `sk.coverage.report()["weights_prepared"]` (engine reports
  carry it), so that copies made per call show up as a count that grows with the calls.
- **Traced tensors** (torch.compile's fake tensors, functional and other `__torch_dispatch__` subclasses):
  `make()` every call, nothing kept; outside tracing such a source (e.g. a DTensor) is recorded as a coverage
  miss of `op` (`UNCACHED`), so that the per-call copy is not a silent slow path. Parameter subclasses that
  only add Python behaviour (vLLM's `ModelWeightParameter`, with its weight loader and `__torch_function__`)
  own real storage and a version counter: they are cached like any tensor (`cacheable`).
"""
from __future__ import annotations

import contextlib
import contextvars
import weakref
from typing import Callable, Hashable, Iterator, Sequence, TypeVar

import torch

from sk import coverage

T = TypeVar("T")

# key -> (the present sources' states, value); each source's finalizer drops its keys
_entries: dict = {}
# key -> values read by a CUDA-graph capture: alive while the sources are
_pinned: dict = {}
# Tensor classes seen so far -> whether their instances own real memory (see `cacheable`).
_CACHEABLE: dict[type, bool] = {torch.Tensor: True, torch.nn.Parameter: True}
_step_graph = contextvars.ContextVar("sk_weight_cache_step_graph", default=False)

CAPTURE_MISS = ("weights prepared inside a CUDA-graph capture: every replay repeats the cast/fold; call the op "
                "once before capturing (make_graphed_callables does) so that the graph reads a prepared copy")


UNCACHED = ("weights of class {cls} (a __torch_dispatch__ subclass) are prepared afresh at every call: pass "
            "plain tensors or Parameters")


def derived(op: str, sources: Sequence[torch.Tensor | None], tag: Hashable, make: Callable[[], T], *,
            remake: bool = False) -> T:
    """`make()`'s value for `sources` (None entries allowed) and `tag`, cached as the module docstring says.
    `remake`: make it even where the entry looks valid, into the entry's own memory where there is one (not
    inside a CUDA-graph capture)."""
    present = [t for t in sources if t is not None]
    if not all(map(cacheable, present)):
        if not _tracing():
            cls = next(type(t) for t in present if not cacheable(t))
            coverage.record_fallback(op, present, UNCACHED.format(cls=f"{cls.__module__}.{cls.__qualname__}"))
            coverage.count_weights_prepared(op)
        return make()
    key = (tuple(map(id, sources)), tag)
    entry = _entries.get(key)
    # An entry's sources are alive (each one's finalizer drops it), so equal ids are the same objects.
    hit = entry is not None and _unchanged(present, entry[0])
    capturing = present[0].is_cuda and torch.cuda.is_current_stream_capturing()
    if remake and entry is not None and not capturing:
        value = make()
        coverage.count_weights_prepared(op)
        if _copy_into(entry[1], value):
            value = entry[1]
        _entries[key] = (tuple(map(_state, present)), value)
        return value
    if not capturing:
        if hit:
            return entry[1]
        if entry is None:
            for t in present:
                weakref.finalize(t, _forget_key, key)
        value = make()
        coverage.count_weights_prepared(op)
        _entries[key] = (tuple(map(_state, present)), value)
        return value
    if _step_graph.get():
        return make()
    if not hit:
        coverage.record_fallback(op, present, CAPTURE_MISS)
        coverage.count_weights_prepared(op)  # once here, and again in every replay
        return make()
    value = entry[1]
    pinned = _pinned.setdefault(key, [])
    if all(v is not value for v in pinned):
        pinned.append(value)
    return value


def cacheable(t: torch.Tensor) -> bool:
    """Whether `t` owns real memory whose storage and version the cache can key on: a plain tensor, or a
    subclass that does not intercept dispatch (engines' parameter classes); not a fake, functional or other
    `__torch_dispatch__` tensor (what tracing passes), whose copies must be made afresh each call."""
    cls = type(t)
    known = _CACHEABLE.get(cls)
    if known is None:
        known = _CACHEABLE[cls] = (issubclass(cls, torch.Tensor)
                                   and cls.__torch_dispatch__ is torch.Tensor.__torch_dispatch__)
    return known


def cast(op: str, weight: torch.Tensor, dtype: torch.dtype, *, remake: bool = False) -> torch.Tensor:
    """`weight` as a contiguous `dtype` tensor: itself when it already is one, else a cached copy (`remake`: as
    `derived`'s)."""
    if weight.dtype == dtype and weight.is_contiguous():
        return weight
    return derived(op, (weight,), ("cast", dtype),
                   lambda: torch.empty(weight.shape, dtype=dtype, device=weight.device).copy_(weight.detach()),
                   remake=remake)


def is_cached(sources: Sequence[torch.Tensor | None], tag: Hashable) -> bool:
    """Whether a valid entry exists (what a capture would read without re-making it)."""
    entry = _entries.get((tuple(map(id, sources)), tag))
    return entry is not None and _unchanged([t for t in sources if t is not None], entry[0])


def forget(tensor: torch.Tensor) -> None:
    """Drop every entry derived from `tensor` (after changing an inference tensor in place)."""
    for key in [k for k in _entries if id(tensor) in k[0]]:
        _entries.pop(key, None)


def clear() -> None:
    """Drop every entry (copies pinned by captured graphs stay alive with their sources)."""
    _entries.clear()


def size_bytes() -> int:
    """Bytes held by the cached values (tensors, and tensors inside tuples)."""
    def nbytes(v) -> int:
        if isinstance(v, torch.Tensor):
            return v.numel() * v.element_size()
        return sum(nbytes(x) for x in v) if isinstance(v, (tuple, list)) else 0
    return sum(nbytes(e[1]) for e in _entries.values())


@contextlib.contextmanager
def within_step_graph() -> Iterator[None]:
    """Inside: `derived` runs `make()` in a capture (a training step's graph must recast changed masters)."""
    token = _step_graph.set(True)
    try:
        yield
    finally:
        _step_graph.reset(token)


def _tracing() -> bool:
    """torch.compile's or make_fx's tracing (fake/functional tensors: a copy per trace is what they need)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None


def _unchanged(present: list, states: tuple) -> bool:
    """Whether each tensor still has the storage and version recorded (inference tensors, recorded with version
    None, are not asked for one: they have none)."""
    for t, (ptr, version) in zip(present, states):
        if t.data_ptr() != ptr or (version is not None and t._version != version):
            return False
    return True


def _copy_into(old, new) -> bool:
    """Copy `new` into `old` (a tensor, or tuples of tensors and Nones) where both have the same structure,
    shapes and dtypes; False (nothing copied) where they do not."""
    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
        if isinstance(a, tuple) and isinstance(b, tuple):
            return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
        return a is None and b is None

    def copy(a, b) -> None:
        if isinstance(a, torch.Tensor):
            with torch.no_grad():
                a.copy_(b)
        elif isinstance(a, tuple):
            for x, y in zip(a, b):
                copy(x, y)

    if not same(old, new):
        return False
    copy(old, new)
    return True


def _state(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), None if t.is_inference() else t._version)


def _forget_key(key) -> None:
    _entries.pop(key, None)
    _pinned.pop(key, None)
