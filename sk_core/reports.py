"""Per-process adapter reports and the switch that turns an engine adapter on, engine-agnostic.

Engines start their model-running processes themselves (spawned workers, schedulers, ranks), so the switch
that turns an adapter on must be inherited by child processes: an environment variable (SK_ADAPTERS, see
`sk.settings`), read by the adapter's entry point in each process. Installing the package alone changes nothing.

Each activated process writes one JSON report at exit into $SK_REPORT_DIR (when set): which engine layers
were replaced, and the `sk.coverage` report (kernel calls per op, fallbacks with reasons) of that process.
The adapters (`sk.adapters.*`) build and write them; the workflow, the gate and `sk-serve` read and merge them.
While an engine runs, `current_report` returns the report of the process it runs in (for the engines' RPCs).
"""
from __future__ import annotations

import atexit
import json
import multiprocessing
import multiprocessing.util
import os
from pathlib import Path
from typing import Callable, Iterable

from sk import settings

# The environment variables that carry activation and the report folder to engine processes.
ACTIVATION_ENV = settings.SETTINGS["adapters"].env
REPORT_DIR_ENV = settings.SETTINGS["report_dir"].env
REPORT_SCHEMA = "standardkernels.adapter-report/1"

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


def process_report(engine: str, replaced: dict[str, str], rank: int | None, extra: dict | None = None) -> dict:
    """This process's adapter report: what was replaced, where, and the coverage counts so far."""
    import sk

    return {
        "schema": REPORT_SCHEMA,
        "engine": engine,
        "pid": os.getpid(),
        "rank": rank,
        "process": multiprocessing.current_process().name,
        "replaced": replaced,
        **(extra or {}),
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
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, path)  # readers never see half a report
    return path


def write_report_at_exit(engine: str, build: Callable[[], dict]) -> None:
    """Write `build()` when this process ends, and likewise in each multiprocessing child forked from it.

    atexit covers the main process and spawned children. Forked multiprocessing children leave through
    os._exit, which skips atexit, and start with multiprocessing's finalizers cleared; so an after-fork hook
    re-arms a finalizer in each such child. Each process writes its own file, once.
    """
    if settings.get("report_dir") is None:
        return
    done: set[int] = set()

    def write_once() -> None:
        if os.getpid() not in done:
            done.add(os.getpid())
            write_report(engine, build())

    def arm(_=None) -> None:
        multiprocessing.util.Finalize(None, write_once, exitpriority=100)

    atexit.register(write_once)
    arm()
    multiprocessing.util.register_after_fork(write_once, arm)


def read_reports(directory: str | os.PathLike, engine: str | None = None) -> list[dict]:
    """Every per-process report in `directory` (optionally of one engine), ordered by rank then pid."""
    reports = [json.loads(p.read_text()) for p in Path(directory).glob("*.json")]
    reports = [r for r in reports if r.get("schema") == REPORT_SCHEMA and engine in (None, r["engine"])]
    return sorted(reports, key=lambda r: (r["rank"] is None, r["rank"] or 0, r["pid"]))


def model_process_reports(reports: Iterable[dict]) -> list[dict]:
    """The reports of the processes that run the model (those with a tensor-parallel rank)."""
    return [r for r in reports if r["rank"] is not None]


def merge_reports(reports: Iterable[dict]) -> dict:
    """One summary over processes: coverage counts summed (see sk.coverage.merge_reports), per-rank calls kept."""
    import sk

    reports = list(reports)
    return {
        "schema": REPORT_SCHEMA,
        "processes": [{"pid": r["pid"], "rank": r["rank"], "process": r["process"],
                       "kernel_calls": r["coverage"]["kernel_calls"]} for r in reports],
        "replaced": {k: v for r in reports for k, v in r["replaced"].items()},
        "coverage": sk.coverage.merge_reports(r["coverage"] for r in reports),
    }
