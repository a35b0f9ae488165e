"""The Kernel Coverage table, per-call dispatch between kernel and reference, strict mode and coverage reports.

Every op call asks `decide(...)` whether its Triton kernel covers the inputs. Outside coverage the op runs its
PyTorch reference and the miss is recorded with the reason; under `strict()` the miss raises `CoverageError`
instead, and the first such miss of the process is kept (`report()["strict_violation"]`). `write_report(path)`
writes what was recorded, for attaching to a request for a new kernel variant; `on_change` / `on_strict_violation`
let a per-process report writer (sk.reports) keep its file current.

Decisions and records happen inside the custom ops' eager implementations, so they run on every call, also
under `torch.compile`; under CUDA-graph replay no Python runs, so a captured call is counted once, at capture.
(An op replaying its own training-step graphs, `sk_core/ops/_step_graphs.py`, counts each replay instead.)
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import functools
import json
import os
import threading
import time
from collections import Counter
from importlib import resources
from typing import Callable, Iterable, Iterator, Sequence

import torch
import yaml

from sk import settings

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


class CoverageError(RuntimeError):
    """A call fell outside the published kernel coverage while strict mode was on."""


@dataclasses.dataclass(frozen=True)
class CoverageEntry:
    op: str
    precisions: tuple[str, ...]
    hardware: tuple[str, ...]
    limits: dict
    shape: str
    provenance: str
    training: bool
    inference: bool
    # Where the Training column's ✓ holds as measured, when not everywhere the shape column covers (shown beside it).
    training_note: str = ""
    # Precisions the kernels also run in under Triton's interpreter on CPU (how CI runs them inside the engines),
    # beyond the published ones; not published, no GPU runs them.
    interpreted_precisions: tuple[str, ...] = ()
    # Precisions the kernels do NOT run in under Triton's interpreter: its bf16 tl.dot is wrong (the GEMM ops'
    # CPU tests run fp16/fp32); such calls take the reference, recorded.
    not_interpreted: tuple[str, ...] = ()


@functools.cache
def table() -> dict[str, CoverageEntry]:
    """The Kernel Coverage table, keyed by op name."""
    text = resources.files("sk").joinpath("kernel_coverage.yaml").read_text()
    entries = {}
    for raw in yaml.safe_load(text):
        raw["precisions"], raw["hardware"] = tuple(raw["precisions"]), tuple(raw["hardware"])
        raw["interpreted_precisions"] = tuple(raw.get("interpreted_precisions", ()))
        raw["not_interpreted"] = tuple(raw.get("not_interpreted", ()))
        entries[raw["op"]] = CoverageEntry(**raw)
    return entries


def markdown_table() -> str:
    """The table in the seed page's columns, as the README shows it."""
    tick = {True: "✓", False: "✗"}
    lines = [
        "| Op | Precision | Hardware | Shape | Provenance | Training | Inference |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in table().values():
        lines.append(
            f"| `{e.op}` | {', '.join(e.precisions)} | {', '.join(h.upper() for h in e.hardware)} | {e.shape} "
            f"| {e.provenance} | {tick[e.training]}{' ' + e.training_note if e.training_note else ''} "
            f"| {tick[e.inference]} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- strict mode

_strict = contextvars.ContextVar("sk_strict", default=settings.get("strict"))


@contextlib.contextmanager
def strict(enabled: bool = True) -> Iterator[None]:
    """Within this context (this thread / async task only), a fallback raises `CoverageError`."""
    token = _strict.set(enabled)
    try:
        yield
    finally:
        _strict.reset(token)


def is_strict() -> bool:
    return _strict.get()


def note_forward(ctx) -> None:
    """Keep on an autograd ctx whether its forward ran under strict mode (see `backward_of`)."""
    ctx.sk_strict = _strict.get()


@contextlib.contextmanager
def backward_of(ctx) -> Iterator[None]:
    """Strict mode in a backward whose forward ran under it: autograd runs the backward of CUDA tensors in threads
    of its own, where the caller's `strict()` block (thread- and task-local) is not in force."""
    if getattr(ctx, "sk_strict", False) and not _strict.get():
        with strict(True):
            yield
    else:
        yield


# ----------------------------------------------------------------------------------------------- recording

_lock = threading.Lock()
_kernel_calls: Counter = Counter()
# op -> weight copies (casts, folds) sk.ops.weight_cache made for it: a few per weight version, not one per call.
_weights_prepared: Counter = Counter()
_fallbacks: Counter = Counter()
_counting = contextvars.ContextVar("sk_counting", default=True)
_changes = 0  # bumped by every record: a report writer compares it to skip unchanged reports
_first_violation: dict | None = None
# Called once, outside the lock, at the first record after being added (sk.reports starts its writer there).
_change_listeners: list[Callable[[], None]] = []
# Called with the violation, in the raising thread, before CoverageError is raised.
_violation_listeners: list[Callable[[dict], None]] = []


def _reinit_lock_in_child() -> None:
    # A fork while another thread held the lock would leave the child's copy locked forever.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reinit_lock_in_child)


def on_change(listener: Callable[[], None]) -> None:
    """Call `listener()` once, at the next record of a kernel call or fallback in this process."""
    _change_listeners.append(listener)


def on_strict_violation(listener: Callable[[dict], None]) -> None:
    """Call `listener(violation)` at the first strict-mode miss of this process, just before it raises."""
    _violation_listeners.append(listener)


def changes() -> int:
    """How many records this process has made so far (unchanged: nothing new to report)."""
    return _changes


def _notify_change() -> None:
    with _lock:  # two threads may record at once: each listener runs once
        listeners, _change_listeners[:] = list(_change_listeners), []
    for listener in listeners:
        listener()


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Kernel calls made within are not counted: runs that are not a caller's call (a warm-up, a capture)."""
    token = _counting.set(False)
    try:
        yield
    finally:
        _counting.reset(token)


def count_weights_prepared(op: str) -> None:
    """Count one derived weight copy made for `op` (sk.ops.weight_cache): the report's `weights_prepared`."""
    global _changes
    with _lock:
        _weights_prepared[op] += 1
        _changes += 1


def count_kernel_call(op: str) -> None:
    """Count one kernel call of `op` that ran without `decide` (a replay of a graph the op captured itself)."""
    global _changes
    if _counting.get():
        with _lock:
            _kernel_calls[op] += 1
            _changes += 1
        if _change_listeners:
            _notify_change()


@functools.cache
def _cuda_arch(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


_cuda_index: int | None = None  # the GPU this process's ops ran on, for reports written from another thread


def _arch_of(device: torch.device) -> str | None:
    global _cuda_index
    if device.type == "cuda":
        _cuda_index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_arch(_cuda_index)
    return None


def _describe(tensors: Sequence[torch.Tensor]) -> tuple[tuple, tuple]:
    shapes = tuple(tuple(t.shape) for t in tensors)
    dtypes = tuple(DTYPE_NAMES.get(t.dtype, str(t.dtype).removeprefix("torch.")) for t in tensors)
    return shapes, dtypes


def miss_reason(op: str, x: torch.Tensor, *, shape_miss: str | None = None, backward: bool = False) -> str | None:
    """Why `op` on input `x` is outside the table, or None when its kernel covers it.

    `x` is the activation whose dtype and device decide the variant; `shape_miss` is the op's own verdict
    on its shape limits (see each op's `shape_miss`). A backward miss's reason starts with "backward: ".
    """
    reason = _miss_reason(op, x, shape_miss=shape_miss, backward=backward)
    if backward and reason is not None and not reason.startswith("backward: "):
        return f"backward: {reason}"
    return reason


def _miss_reason(op: str, x: torch.Tensor, *, shape_miss: str | None, backward: bool) -> str | None:
    entry = table()[op]
    if backward and not entry.training:
        return "backward: no kernel published for training; autograd of the PyTorch reference ran"
    if not backward and not entry.inference:
        return "no inference kernel published"
    if not settings.get("kernels"):
        return "SK_KERNELS=0: the kernels are switched off"
    if x.device.type == "cpu":
        if not settings.get("triton_interpret"):
            return "CPU tensor: the kernels need a CUDA GPU (TRITON_INTERPRET=1 runs them interpreted, for testing)"
    elif x.device.type == "cuda":
        arch = _arch_of(x.device)
        if arch not in entry.hardware:
            return f"GPU architecture {arch} is not in the published coverage ({', '.join(entry.hardware)})"
    else:
        return f"device type {x.device.type!r} has no kernels"
    precision = DTYPE_NAMES.get(x.dtype, str(x.dtype))
    interpreted = entry.interpreted_precisions if x.device.type == "cpu" else ()
    if precision not in entry.precisions and precision not in interpreted:
        return f"dtype {precision} is not covered ({', '.join(entry.precisions)})"
    if x.device.type == "cpu" and precision in entry.not_interpreted:
        return f"dtype {precision} under Triton's interpreter, which computes {precision} dot products wrongly"
    return shape_miss


def decide(op: str, tensors: Sequence[torch.Tensor], *, shape_miss: str | None = None, backward: bool = False) -> bool:
    """True to run the kernel; otherwise records the miss (or raises under strict mode) and returns False.

    `tensors[0]` is the activation that selects the variant; all of them are named in the record.
    """
    reason = miss_reason(op, tensors[0], shape_miss=shape_miss, backward=backward)
    if reason is None:
        count_kernel_call(op)
        return True
    record_fallback(op, tensors, reason)
    return False


def record_fallback(op: str, tensors: Sequence[torch.Tensor], reason: str) -> None:
    global _changes
    shapes, dtypes = _describe(tensors)
    device = tensors[0].device
    if is_strict():
        call = (f"sk.ops.{op}: no kernel covers this call ({reason}); inputs: shapes {list(shapes)}, "
                f"dtypes {list(dtypes)}, device {device}.")
        _record_violation({"op": op, "shapes": [list(s) for s in shapes], "dtypes": list(dtypes),
                           "device": str(device), "reason": reason, "message": call, "time": time.time(),
                           "pid": os.getpid()})
        raise CoverageError(f"{call} Strict mode forbids the PyTorch fallback; see `sk list` for the Kernel "
                            f"Coverage table.")
    key = (op, shapes, dtypes, str(device), _arch_of(device), reason)
    with _lock:
        _fallbacks[key] += 1
        _changes += 1
    if _change_listeners:
        _notify_change()


def _record_violation(violation: dict) -> None:
    global _first_violation, _changes
    with _lock:
        if _first_violation is not None:
            return
        _first_violation = violation
        _changes += 1
    for listener in list(_violation_listeners):
        with contextlib.suppress(Exception):  # a listener's failure must not replace the CoverageError
            listener(violation)


def reset() -> None:
    """Forget every recorded call and strict violation (e.g. between benchmark phases)."""
    global _first_violation, _changes
    with _lock:
        _kernel_calls.clear()
        _weights_prepared.clear()
        _fallbacks.clear()
        _first_violation = None
        _changes += 1


def report() -> dict:
    """What this process recorded: kernel calls per op, every fallback with its reason and count, the weight
    copies made per op (`weights_prepared`: about one per weight and dtype; one per call is a bug), and the first
    strict-mode miss (None when there was none)."""
    with _lock:
        calls, misses, violation = dict(_kernel_calls), list(_fallbacks.items()), _first_violation
        prepared = dict(_weights_prepared)
    gpu = None
    if torch.cuda.is_initialized():  # never initialise CUDA just to write a report
        index = _cuda_index if _cuda_index is not None else torch.cuda.current_device()
        gpu = {"name": torch.cuda.get_device_name(index), "arch": _cuda_arch(index)}
    import triton

    from sk import __version__

    return {
        "schema": "standardkernels.coverage/1",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"standardkernels": __version__, "torch": torch.__version__, "triton": triton.__version__},
        "processes": [{"pid": os.getpid(), "rank": os.environ.get("RANK"), "gpu": gpu}],
        "kernel_calls": calls,
        "weights_prepared": prepared,
        "fallbacks": [
            {"op": op, "shapes": [list(s) for s in shapes], "dtypes": list(dtypes), "device": dev, "arch": arch,
             "reason": reason, "count": n}
            for (op, shapes, dtypes, dev, arch, reason), n in misses
        ],
        "strict_violation": violation,
    }


def merge_reports(reports: Iterable[dict]) -> dict:
    """One report from several processes' (e.g. every tensor-parallel rank): counts are summed, the earliest
    strict violation kept."""
    reports = list(reports)
    calls: Counter = Counter()
    prepared: Counter = Counter()
    misses: Counter = Counter()
    for r in reports:
        calls.update(r["kernel_calls"])
        prepared.update(r.get("weights_prepared", {}))  # reports written before the field have none
        for f in r["fallbacks"]:
            key = (f["op"], json.dumps(f["shapes"]), tuple(f["dtypes"]), f["device"], f["arch"], f["reason"])
            misses[key] += f["count"]
    merged = dict(reports[0]) if reports else report()
    merged["processes"] = [p for r in reports for p in r["processes"]]
    merged["kernel_calls"] = dict(calls)
    merged["weights_prepared"] = dict(prepared)
    merged["fallbacks"] = [
        {"op": op, "shapes": json.loads(shapes), "dtypes": list(dtypes), "device": dev, "arch": arch,
         "reason": reason, "count": n}
        for (op, shapes, dtypes, dev, arch, reason), n in misses.items()
    ]
    violations = [r["strict_violation"] for r in reports if r.get("strict_violation")]
    merged["strict_violation"] = min(violations, key=lambda v: v["time"]) if violations else None
    return merged


def fallback_summary(report: dict) -> list[dict]:
    """A report's fallbacks per op and reason, most frequent first: calls, distinct shapes, dtypes."""
    groups: dict[tuple[str, str], dict] = {}
    for f in report["fallbacks"]:
        group = groups.setdefault((f["op"], f["reason"]), {"op": f["op"], "reason": f["reason"], "count": 0,
                                                            "shapes": set(), "dtypes": set()})
        group["count"] += f["count"]
        group["shapes"].add(json.dumps(f["shapes"]))
        group["dtypes"].add("/".join(f["dtypes"]))
    return [{**g, "shapes": len(g["shapes"]), "dtypes": sorted(g["dtypes"])}
            for g in sorted(groups.values(), key=lambda g: (-g["count"], g["op"], g["reason"]))]


def write_report(path: str | os.PathLike) -> dict:
    """Write this process's coverage report as JSON to `path` and return it."""
    data = report()
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    return data


def limit_miss(name: str, value: int, limit: int | None) -> str | None:
    """A shape-limit verdict in the words the report uses: None when `value` is within `limit`."""
    if limit is not None and value > limit:
        return f"{name} {value} exceeds the covered maximum {limit}"
    return None
