"""Dispatch decisions and their reasons, strict mode, and the coverage report."""
import asyncio
import json
import threading

import pytest
import torch

import sk
from sk import coverage
from numerics import KERNEL_DEVICE
from sk.ops.rms_norm import rms_norm_reference


@pytest.fixture
def no_interpreter(settings_override):
    """CPU tensors as on a user's machine: no Triton interpreter, so every CPU call falls back."""
    settings_override(triton_interpret=False)


def last_fallback():
    return sk.coverage.report()["fallbacks"][-1]


def test_cpu_tensor_falls_back_with_reason_and_correct_result(no_interpreter):
    x, w = torch.randn(3, 8), torch.randn(8)
    y = sk.ops.rms_norm(x, w)
    assert torch.equal(y, rms_norm_reference(x, w, 1e-6))
    miss = last_fallback()
    assert miss["op"] == "rms_norm" and miss["reason"].startswith("CPU tensor")
    assert miss["shapes"] == [[3, 8], [8]] and miss["dtypes"] == ["fp32", "fp32"] and miss["device"] == "cpu"
    assert miss["count"] == 1 and sk.coverage.report()["kernel_calls"] == {}


def test_uncovered_dtype_falls_back():
    x = torch.randn(2, 16, dtype=torch.float64, device=KERNEL_DEVICE)
    sk.ops.silu_and_mul(x)
    assert last_fallback()["reason"] == "dtype fp64 is not covered (bf16, fp16, fp32)"


def test_shape_outside_limits_falls_back():
    limit = sk.coverage.table()["rms_norm"].limits["max_hidden"]
    x, w = torch.randn(1, limit + 1, device=KERNEL_DEVICE), torch.ones(limit + 1, device=KERNEL_DEVICE)
    y = sk.ops.rms_norm(x, w)
    assert torch.isfinite(y).all()
    assert last_fallback()["reason"] == f"hidden size {limit + 1} exceeds the covered maximum {limit}"


def test_repeated_misses_are_counted_once_per_kind(no_interpreter):
    for _ in range(3):
        sk.ops.gelu_and_mul(torch.randn(2, 8))
    sk.ops.gelu_and_mul(torch.randn(4, 8))
    counts = sorted((f["shapes"][0][0], f["count"]) for f in sk.coverage.report()["fallbacks"])
    assert counts == [(2, 3), (4, 1)]


def test_kernel_calls_are_counted():
    x = torch.randn(2, 8, device=KERNEL_DEVICE)
    sk.ops.silu_and_mul(x)
    sk.ops.gelu_and_mul(x)
    assert sk.coverage.report()["kernel_calls"] == {"silu_and_mul": 1, "gelu_and_mul": 1}


def test_kernels_switched_off_run_every_op_s_reference_and_say_so(settings_override):
    # SK_KERNELS=0: the A/B switch between our kernels and the rest of an integration.
    settings_override(kernels=False)
    d, ff = 16, 24
    x, r = torch.randn(3, d, device=KERNEL_DEVICE), torch.randn(3, d, device=KERNEL_DEVICE)
    w = torch.randn(d, device=KERNEL_DEVICE)
    gu = torch.randn(2 * ff, d, device=KERNEL_DEVICE) / 4
    down = torch.randn(d, ff, device=KERNEL_DEVICE) / 4
    assert torch.equal(sk.ops.rms_norm(x, w), rms_norm_reference(x, w, 1e-6))
    sk.ops.silu_and_mul(gu)
    sk.ops.fused_gated_mlp(x, w, gu, down, residual=r)
    report = sk.coverage.report()
    assert report["kernel_calls"] == {}
    assert {f["op"] for f in report["fallbacks"]} == {"rms_norm", "silu_and_mul", "fused_gated_mlp/rms"}
    assert {f["reason"] for f in report["fallbacks"]} == {"SK_KERNELS=0: the kernels are switched off"}
    assert sk.ops.gated_mlp.kernel_miss(x, "rms", d, ff) == "SK_KERNELS=0: the kernels are switched off"
    with sk.coverage.strict(), pytest.raises(sk.CoverageError, match="SK_KERNELS=0"):
        sk.ops.rms_norm(x, w)


def test_strict_raises_naming_op_shapes_dtypes_and_reason(no_interpreter):
    x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    with sk.coverage.strict(), pytest.raises(sk.CoverageError) as err:
        sk.ops.fused_add_rms_norm(x, r, w)
    text = str(err.value)
    for part in ("sk.ops.fused_add_rms_norm", "CPU tensor", "[(3, 8), (3, 8), (8,)]", "['fp32', 'fp32', 'fp32']"):
        assert part in text
    assert sk.coverage.report()["fallbacks"] == []  # an error, not a silent fallback
    sk.ops.fused_add_rms_norm(x, r, w)  # strict ends with its block


def test_first_strict_violation_is_kept_and_announced_before_the_raise(no_interpreter, monkeypatch):
    monkeypatch.setattr(sk.coverage, "_violation_listeners", [])
    seen = []
    sk.coverage.on_strict_violation(lambda v: seen.append((v, sk.coverage.report()["strict_violation"])))
    with sk.coverage.strict():
        with pytest.raises(sk.CoverageError) as first:
            sk.ops.rms_norm(torch.randn(3, 8), torch.ones(8))
        with pytest.raises(sk.CoverageError):
            sk.ops.silu_and_mul(torch.randn(2, 8))
    ((violation, in_report),) = seen  # once per process, with the report already showing it
    assert violation is in_report and sk.coverage.report()["strict_violation"] == violation
    assert (violation["op"], violation["shapes"], violation["dtypes"]) == ("rms_norm", [[3, 8], [8]], ["fp32", "fp32"])
    assert violation["reason"].startswith("CPU tensor") and str(first.value).startswith(violation["message"])
    sk.coverage.reset()
    assert sk.coverage.report()["strict_violation"] is None


def test_merge_keeps_the_earliest_violation_and_summary_groups_by_op_and_reason():
    def fallback(op, rows, reason, count):
        return {"op": op, "shapes": [[rows, 8], [8]], "dtypes": ["fp32", "fp32"], "device": "cpu", "arch": None,
                "reason": reason, "count": count}

    first, later = {"op": "rms_norm", "time": 1.0}, {"op": "silu_and_mul", "time": 2.0}
    reports = [
        {**sk.coverage.report(), "strict_violation": later,
         "fallbacks": [fallback("rms_norm", 1, "a", 3), fallback("rms_norm", 2, "a", 1)]},
        {**sk.coverage.report(), "strict_violation": first,
         "fallbacks": [fallback("rms_norm", 1, "a", 2), fallback("rms_norm", 1, "b", 5)]},
    ]
    merged = sk.coverage.merge_reports(reports)
    assert merged["strict_violation"] is first
    assert sk.coverage.fallback_summary(merged) == [
        {"op": "rms_norm", "reason": "a", "count": 6, "shapes": 2, "dtypes": ["fp32/fp32"]},
        {"op": "rms_norm", "reason": "b", "count": 5, "shapes": 1, "dtypes": ["fp32/fp32"]},
    ]
    assert sk.coverage.merge_reports([sk.coverage.report()])["strict_violation"] is None


def test_strict_is_per_thread_and_per_task(no_interpreter):
    seen = {}

    def other_thread():
        sk.ops.rms_norm(torch.randn(1, 4), torch.ones(4))  # must not raise: strict is not inherited
        seen["thread"] = True

    with sk.coverage.strict():
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()

        async def in_task(enabled):
            with sk.coverage.strict(enabled):
                await asyncio.sleep(0)
                return sk.coverage.is_strict()

        async def both():
            return await asyncio.gather(in_task(False), in_task(True))

        assert asyncio.run(both()) == [False, True]
        assert sk.coverage.is_strict()
    assert seen == {"thread": True} and not sk.coverage.is_strict()


def test_write_report_and_merge(tmp_path, no_interpreter):
    sk.ops.rms_norm(torch.randn(2, 4), torch.ones(4))
    path = tmp_path / "standardkernels-coverage.json"
    written = sk.coverage.write_report(path)
    loaded = json.loads(path.read_text())
    assert loaded == written
    assert loaded["schema"] == "standardkernels.coverage/1"
    assert loaded["versions"]["torch"] == torch.__version__
    assert loaded["fallbacks"][0]["op"] == "rms_norm"
    merged = sk.coverage.merge_reports([loaded, loaded])
    assert merged["fallbacks"][0]["count"] == 2 and len(merged["processes"]) == 2


def test_every_table_entry_has_an_op():
    for name in sk.coverage.table():
        base = name.split("/")[0].removeprefix("gemma_")  # "op/variant": one row per variant of an op
        assert hasattr(sk.ops, base) or hasattr(sk.ops, name), name


def test_a_backward_run_in_another_thread_is_strict_when_its_forward_was(monkeypatch):
    """Autograd runs the backward of CUDA tensors in threads of its own, where the caller's `strict()` block is not
    in force: a forward under strict mode carries it to its backward (here a backward from a second thread, as
    autograd's device threads run it, with the op's backward kernel taken out of the table)."""
    import dataclasses
    import threading
    from numerics import KERNEL_DEVICE

    table = sk.coverage.table()
    monkeypatch.setitem(table, "rms_norm", dataclasses.replace(table["rms_norm"], training=False))
    x = torch.randn(3, 16, device=KERNEL_DEVICE, requires_grad=True)
    w = torch.ones(16, device=KERNEL_DEVICE)
    with sk.coverage.strict():
        y = sk.ops.rms_norm(x, w)  # the forward has its kernel
    errors = []

    def backward():
        try:
            y.sum().backward()
        except sk.CoverageError as e:
            errors.append(e)
    thread = threading.Thread(target=backward)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "backward: no kernel published for training" in str(errors[0])
    # Without strict at the forward, the same backward is a recorded fallback.
    y = sk.ops.rms_norm(x, w)
    y.sum().backward()
    assert any(f["reason"].startswith("backward: no kernel") for f in sk.coverage.report()["fallbacks"])
