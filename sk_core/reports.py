"""Per-process adapter reports and the switch that turns an engine adapter on, engine-agnostic.

Engines start their model-running processes themselves (spawned workers, schedulers, ranks), so the switch
that turns an adapter on must be inherited by child processes: an environment variable (SK_ADAPTERS, see
`sk.settings`), read by the adapter's entry point in each process. Installing the package alone changes nothing.

Each activated process keeps one JSON report in $SK_REPORT_DIR (when set): which engine layers were replaced,
and the `sk.coverage` report (kernel calls per op, fallbacks with reasons, the first strict violation) of that
process. It is written when the adapter registers, rewritten while counts change (a daemon thread started at
the first record, at most every REPORT_INTERVAL_S), at once at the first strict violation, and at exit; so a
process that engines SIGKILL (vLLM after its drain timeout, SGLang's schedulers) leaves a report at most
REPORT_INTERVAL_S behind. The adapters (`sk.adapters.*`) build and write them; the workflow, the gate and
`sk-serve` read and merge them. While an engine runs, `current_report` returns the report of the process it
runs in (for the engines' RPCs).
"""
from __future__ import annotations

import atexit
import collections
import json
import multiprocessing
import multiprocessing.util
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from sk import coverage, settings

# The environment variables that carry activation and the report folder to engine processes.
ACTIVATION_ENV = settings.SETTINGS["adapters"].env
REPORT_DIR_ENV = settings.SETTINGS["report_dir"].env
REPORT_SCHEMA = "standardkernels.adapter-report/1"
# How stale a running process's report file may get while its counts change.
REPORT_INTERVAL_S = 1.0

_write_lock = threading.Lock()
# (time.perf_counter() at the start, seconds taken) of this process's latest report writes, build included:
# `sk profile` sets them beside the engine steps they may have delayed (the writer thread holds the GIL).
_writes: collections.deque = collections.deque(maxlen=1024)


def write_intervals() -> list[tuple[float, float]]:
    """(start, seconds) of this process's latest report writes (building the report included), oldest first."""
    return list(_writes)


def _reinit_write_lock_in_child() -> None:
    global _write_lock
    _write_lock = threading.Lock()


os.register_at_fork(after_in_child=_reinit_write_lock_in_child)

# Set by an adapter when it registers in this process: builds this process's report.
_report_builder: Callable[[], dict] | None = None


def is_active(engine: str) -> bool:
    return engine in settings.get("adapters")


def activate(engine: str) -> None:
    """Turn the adapter for `engine` on in this process's environment, hence in every child started later."""
    if not is_active(engine):
        os.environ[ACTIVATION_ENV] = ",".join([*settings.get("adapters"), engine])


def set_report_builder(build: Callable[[], dict]) -> None:
    """Called by the adapter active in this process: `current_report()` returns `build()` from now on."""
    global _report_builder
    _report_builder = build


def current_report(_worker=None) -> dict | None:
    """This process's adapter report, or None where no adapter registered here.

    Engines call it in their workers on request (vLLM: `llm.collective_rpc(sk.reports.current_report)`, which
    passes the worker as the first argument, unused here).
    """
    return _report_builder() if _report_builder is not None else None


def process_report(engine: str, replaced: dict[str, str], rank: int | None, extra: dict | None = None,
                   fused_blocks: dict | None = None) -> dict:
    """This process's adapter report: what was replaced, where, and the coverage counts so far.

    `fused_blocks` (adapters with fused decoder blocks): {"enabled", "layers_fused", "fused": {layer: what},
    "engine_path": {layer: why}, "kernel_calls", "fallback_calls", "fallback_reasons"} of this process."""
    import sk

    return {
        "schema": REPORT_SCHEMA,
        "engine": engine,
        "pid": os.getpid(),
        "rank": rank,
        "process": multiprocessing.current_process().name,
        "replaced": replaced,
        **(extra or {}),
        **({"fused_blocks": fused_blocks} if fused_blocks is not None else {}),
        "coverage": sk.coverage.report(),
    }


def write_report(engine: str, report: dict) -> Path | None:
    """Write `report` to $SK_REPORT_DIR/<engine>-<pid>.json; nothing when the variable is unset."""
    directory = settings.get("report_dir")
    if directory is None:
        return None
    path = directory / f"{engine}-{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with _write_lock:  # the writer thread, a strict violation and exit may write at once
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, path)  # readers never see half a report
    return path


def keep_report_written(engine: str, build: Callable[[], dict]) -> None:
    """Keep `build()` written for this process (module docstring: when), and likewise in forked children.

    atexit covers the main process and spawned children. Forked multiprocessing children leave through
    os._exit, which skips atexit, and start with multiprocessing's finalizers cleared; so an after-fork hook
    re-arms a finalizer in each such child. Each process writes its own file.
    """
    if settings.get("report_dir") is None:
        return
    exited: set[int] = set()
    writers: set[int] = set()
    written = [None]  # coverage.changes() when the file was last written

    def write_now(_violation: dict | None = None) -> None:
        start = time.perf_counter()
        written[0] = coverage.changes()  # read first: a record made while building is written next time
        try:
            write_report(engine, build())
        finally:
            _writes.append((start, time.perf_counter() - start))

    def write_at_exit() -> None:
        if os.getpid() not in exited:
            exited.add(os.getpid())
            write_now()

    def keep_writing() -> None:
        while True:
            time.sleep(REPORT_INTERVAL_S)
            if coverage.changes() != written[0]:
                try:
                    write_now()
                except Exception:  # a report built mid-teardown; the exit report follows
                    pass

    def start_writer() -> None:
        if os.getpid() not in writers:
            writers.add(os.getpid())
            threading.Thread(target=keep_writing, name="sk-report-writer", daemon=True).start()

    def arm(_=None) -> None:
        multiprocessing.util.Finalize(None, write_at_exit, exitpriority=100)

    atexit.register(write_at_exit)
    arm()
    multiprocessing.util.register_after_fork(write_at_exit, arm)
    # Threads do not survive a fork: a forked child starts its own writer at its first record.
    os.register_at_fork(after_in_child=lambda: coverage.on_change(start_writer))
    coverage.on_change(start_writer)
    coverage.on_strict_violation(write_now)
    try:
        write_now()  # so that a process killed before its first record still leaves its report
    except Exception:  # never fail the engine's plugin loading over a report; later writes retry
        pass


def read_reports(directory: str | os.PathLike, engine: str | None = None) -> list[dict]:
    """Every per-process report in `directory` (optionally of one engine), ordered by rank then pid."""
    reports = [json.loads(p.read_text()) for p in Path(directory).glob("*.json")]
    reports = [r for r in reports if r.get("schema") == REPORT_SCHEMA and engine in (None, r["engine"])]
    return sorted(reports, key=lambda r: (r["rank"] is None, r["rank"] or 0, r["pid"]))


def first_strict_violation(reports: Iterable[dict]) -> tuple[dict, dict] | None:
    """(report, violation) of the process whose strict-mode miss came first, or None."""
    found = [(r, r["coverage"]["strict_violation"]) for r in reports if r["coverage"].get("strict_violation")]
    return min(found, key=lambda rv: rv[1]["time"]) if found else None


def model_process_reports(reports: Iterable[dict]) -> list[dict]:
    """The reports of the processes that run the model (those with a tensor-parallel rank)."""
    return [r for r in reports if r["rank"] is not None]


def fused_blocks_summary(report: dict) -> str | None:
    """One line on a process's fused decoder blocks: layers fused, calls (kernel / fallback), layers left and why."""
    fb = report.get("fused_blocks")
    if not fb:
        return None
    if not fb["enabled"]:
        line = f"fused blocks off ({fb['disabled']})"
    elif not fb["layers_fused"] and not fb["engine_path"]:
        line = "fused blocks: no decoder layer loaded here"
    else:
        kernel = sum(fb["kernel_calls"].values())
        line = (f"fused blocks: {fb['layers_fused']} decoder layers fused, {kernel + fb['fallback_calls']} calls "
                f"({kernel} kernel, {fb['fallback_calls']} fallback)")
        if fb["fallback_reasons"]:
            line += f" [fallback: {'; '.join(fb['fallback_reasons'])}]"
        if fb["engine_path"]:
            reasons = sorted(set(fb["engine_path"].values()))
            line += f"; {len(fb['engine_path'])} on the engine's path ({'; '.join(reasons)})"
    projections = fb.get("projections") or {}
    if projections.get("routed") or projections.get("engine_path"):
        calls = projections["kernel_calls"] + projections["fallback_calls"]
        line += (f"; attention projections: {projections['routed']} through sk.ops.linear, {calls} calls "
                 f"({projections['kernel_calls']} kernel, {projections['fallback_calls']} fallback)")
        if projections["engine_path"]:
            reasons = sorted(set(projections["engine_path"].values()))
            line += f", {len(projections['engine_path'])} on the engine's GEMM ({'; '.join(reasons)})"
    return line


def merge_reports(reports: Iterable[dict]) -> dict:
    """One summary over processes: coverage counts summed (see sk.coverage.merge_reports), per-rank calls kept."""
    import sk

    reports = list(reports)
    return {
        "schema": REPORT_SCHEMA,
        "processes": [{"pid": r["pid"], "rank": r["rank"], "process": r["process"],
                       "kernel_calls": r["coverage"]["kernel_calls"],
                       **({"fused_blocks": fused_blocks_summary(r)} if r.get("fused_blocks") else {})}
                      for r in reports],
        "replaced": {k: v for r in reports for k, v in r["replaced"].items()},
        "coverage": sk.coverage.merge_reports(r["coverage"] for r in reports),
    }
