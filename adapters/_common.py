"""Engine-agnostic adapter plumbing: explicit activation through the environment, and per-process reports.

Engines start their model-running processes themselves (spawned workers, schedulers, ranks), so the switch
that turns an adapter on must be inherited by child processes: an environment variable, read by the adapter's
entry point in each process. Installing the package alone changes nothing.

Each activated process writes one JSON report at exit into $SK_REPORT_DIR (when set): which engine layers
were replaced, and the `sk.coverage` report (kernel calls per op, fallbacks with reasons) of that process.
"""
from __future__ import annotations

import atexit
import json
import multiprocessing
import multiprocessing.util
import os
from pathlib import Path
from typing import Callable, Iterable

# Comma-separated engine names, e.g. SK_ADAPTERS=vllm or SK_ADAPTERS=vllm,sglang.
ACTIVATION_ENV = "SK_ADAPTERS"
# Directory that receives one report per activated process.
REPORT_DIR_ENV = "SK_REPORT_DIR"
REPORT_SCHEMA = "standardkernels.adapter-report/1"


def is_active(engine: str) -> bool:
    names = os.environ.get(ACTIVATION_ENV, "")
    return engine in {n.strip() for n in names.split(",")}


def activate(engine: str) -> None:
    """Turn the adapter for `engine` on in this process's environment, hence in every child started later."""
    if not is_active(engine):
        names = [n for n in os.environ.get(ACTIVATION_ENV, "").split(",") if n.strip()]
        os.environ[ACTIVATION_ENV] = ",".join([*names, engine])


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
    directory = os.environ.get(REPORT_DIR_ENV)
    if not directory:
        return None
    path = Path(directory) / f"{engine}-{os.getpid()}.json"
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
    if not os.environ.get(REPORT_DIR_ENV):
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
