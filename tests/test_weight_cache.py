"""sk.ops.weight_cache: derived weight copies made once, re-made when a source changes (version counter, storage,
identity), inference tensors cached on identity and storage, traced tensors never cached. The CUDA-graph rules
(pinned copies, the recorded capture miss) are tested on the GPU in tests/test_cuda_graphs.py."""
import torch

import sk
from sk.ops import weight_cache


def test_a_cast_is_made_once_and_remade_after_an_in_place_update():
    w = torch.randn(8, 4, requires_grad=True)
    first = weight_cache.cast("op", w, torch.float16)
    assert weight_cache.cast("op", w, torch.float16) is first
    with torch.no_grad():
        w.mul_(3)  # an optimizer step advances the version counter
    second = weight_cache.cast("op", w, torch.float16)
    assert second is not first and torch.equal(second, w.detach().half())


def test_a_weight_already_in_the_compute_dtype_is_used_as_it_is():
    w = torch.randn(8, 4, dtype=torch.float16)
    assert weight_cache.cast("op", w, torch.float16) is w
    t = torch.randn(4, 8, dtype=torch.float16).t()  # not contiguous: a copy, cached
    assert weight_cache.cast("op", t, torch.float16).is_contiguous()


def test_new_storage_under_the_same_tensor_is_seen():
    w = torch.nn.Parameter(torch.randn(8, 4))
    first = weight_cache.cast("op", w, torch.float16)
    w.data = torch.randn(8, 4)  # same object, other memory (the version counter does not move)
    second = weight_cache.cast("op", w, torch.float16)
    assert second is not first and torch.equal(second, w.detach().half())


def test_inference_tensors_are_cached_on_identity_and_storage_until_forgotten():
    with torch.inference_mode():
        w = torch.randn(8, 4)
    calls = []

    def make():
        calls.append(1)
        return w.half()
    first = weight_cache.derived("op", (w,), "tag", make)
    assert weight_cache.derived("op", (w,), "tag", make) is first and len(calls) == 1
    assert weight_cache.is_cached((w,), "tag")
    with torch.inference_mode():
        w.add_(1)  # allowed inside inference mode, unseen by the cache (no version counter): documented
    assert weight_cache.derived("op", (w,), "tag", make) is first
    weight_cache.forget(w)
    assert not weight_cache.is_cached((w,), "tag")
    assert torch.equal(weight_cache.derived("op", (w,), "tag", make), w.half()) and len(calls) == 2


def test_several_sources_and_none_entries_key_one_value():
    a, b = torch.randn(4), torch.randn(4)
    v = weight_cache.derived("op", (a, None, b), "sum", lambda: a + b)
    assert weight_cache.derived("op", (a, None, b), "sum", lambda: a - b) is v
    assert weight_cache.derived("op", (b, None, a), "sum", lambda: a - b) is not v  # order is part of the key
    with torch.no_grad():
        b.add_(1)
    assert torch.equal(weight_cache.derived("op", (a, None, b), "sum", lambda: a + b), a + b)


def test_entries_go_with_their_sources_and_report_their_size():
    weight_cache.clear()
    w = torch.randn(16, 16)
    weight_cache.cast("op", w, torch.float16)
    assert weight_cache.size_bytes() == 16 * 16 * 2
    del w
    assert weight_cache.size_bytes() == 0


def test_traced_tensors_are_never_cached():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        w = mode.from_tensor(torch.randn(8, 4)) if hasattr(mode, "from_tensor") else torch.randn(8, 4)
        calls = []
        for _ in range(2):
            weight_cache.derived("op", (w,), "tag", lambda: calls.append(1) or w)
    assert len(calls) == 2


class _WithTorchFunction(torch.nn.Parameter):  # as vLLM's and SGLang's weight classes
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


class _Dispatching(torch.Tensor):  # as the fake and functional tensors tracing passes
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_parameter_subclasses_with_real_memory_are_cached_dispatching_tensors_are_not():
    w = torch.nn.Parameter._make_subclass(_WithTorchFunction, torch.randn(8, 4), False)
    assert weight_cache.cacheable(w)
    first = weight_cache.cast("op", w, torch.float16)
    assert weight_cache.cast("op", w, torch.float16) is first
    with torch.no_grad():
        w.mul_(2)
    assert weight_cache.cast("op", w, torch.float16) is not first
    dispatching = torch.Tensor._make_subclass(_Dispatching, torch.randn(4))
    assert not weight_cache.cacheable(dispatching)
    weight_cache.derived("op", (dispatching,), "tag", lambda: None)  # eager: made, and recorded
    (miss,) = sk.coverage.report()["fallbacks"]
    assert miss["op"] == "op" and "_Dispatching" in miss["reason"] and "every call" in miss["reason"]
    calls = []
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.empty(4)
        assert not weight_cache.cacheable(fake)
        weight_cache.derived("op", (fake,), "tag", lambda: calls.append(1))  # tracing: made, not recorded
        weight_cache.derived("op", (fake,), "tag", lambda: calls.append(1))
    assert len(calls) == 2 and len(sk.coverage.report()["fallbacks"]) == 1


def test_a_remake_refills_the_entrys_own_memory():
    # An engine's weight loader writes through .data: the version counter does not move, so the copy looks valid;
    # remake=True makes it again into the same tensors (a CUDA graph captured reading them sees the new weights).
    w = torch.nn.Parameter(torch.randn(8, 4))
    norm = torch.randn(4)

    def make():
        return (w.detach().half() * 2, None, (norm * 3).float())
    first = weight_cache.derived("op", (w, norm), "pair", make)
    w.data.copy_(torch.randn(8, 4))
    assert weight_cache.derived("op", (w, norm), "pair", make) is first  # unseen: the stale copy
    again = weight_cache.derived("op", (w, norm), "pair", make, remake=True)
    assert again is first and again[1] is None
    assert torch.equal(first[0], w.detach().half() * 2) and torch.equal(first[2], norm * 3)
    # Where the structure changes (here a shape), the new value replaces the entry instead.
    w.data = torch.randn(16, 4)
    other = weight_cache.derived("op", (w, norm), "pair", make, remake=True)
    assert other is not first and other[0].shape == (16, 4)
    assert weight_cache.derived("op", (w, norm), "pair", make) is other
    # Without an entry, remake makes one as a first call does.
    fresh = torch.nn.Parameter(torch.randn(2, 2))
    made = weight_cache.derived("op", (fresh,), "cast", lambda: fresh.detach().half(), remake=True)
    assert weight_cache.derived("op", (fresh,), "cast", lambda: None) is made
