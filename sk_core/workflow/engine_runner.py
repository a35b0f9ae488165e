"""Engine jobs (sk.workflow.engine_job) in child processes that serve commands, with progress bars and log files.

Each run gets a fresh process: our adapter is switched on per process through the environment, and the
baseline and the candidate must not share any engine state. Variables that would switch the adapter on, make
it strict, write reports or load candidates are removed from the child's environment unless the run sets them.
"""
from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Callable

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sk import settings
from sk.workflow.candidates import CANDIDATE_DIR_ENV
from sk.workflow.engine_job import EVENT_PREFIX, truncated_model_args
from sk.workflow.errors import WorkflowError
from sk.workflow.scenarios import Scenario

_ERROR_LINE = re.compile(r"\b\w*(Error|Exception): ")
CLOSE_TIMEOUT_S = 60


def progress_bars() -> Progress:
    return Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


class EngineProcess:
    """One engine job (sk.workflow.engine_job) in a child process that serves commands until closed.

    `mode`: "eval", "capture" or "profile"; `slot` of `engines`: its place among the engines that share the
    device (memory split, sk.workflow.engine_job.memory_args). Use as a context manager: the child is ended on
    exit, whatever happened.
    """

    def __init__(self, scenario: Scenario, *, label: str, env: dict[str, str], log_path: Path, progress: Progress,
                 mode: str = "eval", candidates: Path | None = None, enforce_eager: bool = False,
                 max_layers: int | None = None, max_requests: int | None = None, slot: int = 0, engines: int = 1):
        self.label, self.log_path, self.progress = label, log_path, progress
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Resolved (and a project model written) here, not in the child: writing a model runs torch's OpenMP CPU
        # kernels, and vLLM forks its engine core by default; a process forked after OpenMP work can hang in its
        # first parallel region.
        model_args = truncated_model_args(scenario, max_layers)
        self._work = tempfile.TemporaryDirectory(prefix="sk-engine-job-")
        job_path = Path(self._work.name) / "job.json"
        job_path.write_text(json.dumps({
            "scenario": scenario.model_dump(), "mode": mode, "candidates": candidates is not None,
            "enforce_eager": enforce_eager, "model_args": model_args, "max_requests": max_requests,
            "slot": slot, "engines": engines,
        }))
        child_env = settings.stock_environment(also=("candidate_dir", "capture")) | env
        if candidates is not None:
            child_env[CANDIDATE_DIR_ENV] = str(candidates.resolve())
        self.task = progress.add_task(f"{label}: starting engine", total=None)
        self._tail: deque[str] = deque(maxlen=8)
        self._first_error: str | None = None
        self._log = open(log_path, "w")
        self._child = subprocess.Popen(
            [sys.executable, "-m", "sk.workflow.engine_job", str(job_path)], env=child_env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _until(self, wanted: str) -> dict:
        for line in self._child.stdout:
            if not line.startswith(EVENT_PREFIX):
                self._log.write(line)
                self._tail.append(line)
                # Engine failures surface wrapped several times; the first "XError: ..." is the cause.
                if self._first_error is None and _ERROR_LINE.search(line):
                    self._first_error = line
                continue
            event = json.loads(line[len(EVENT_PREFIX):])
            if event["event"] == wanted:
                return event
            if event["event"] == "requests_done":
                self.progress.advance(self.task, event["n"])
        returncode = self._child.wait()
        cause = self._first_error.strip() if self._first_error else "the log ends with:\n" + "".join(self._tail)
        raise WorkflowError(f"the engine run '{self.label}' failed (exit code {returncode}): {cause}\n"
                            f"(full engine log: {self.log_path})")

    def wait_ready(self) -> EngineProcess:
        self._until("engine_ready")
        self.progress.update(self.task, description=f"{self.label}: engine ready")
        return self

    def call(self, command: str, description: str | None = None, total: int | None = None, **arguments):
        """Send one command, wait for its result (progress bars advance meanwhile)."""
        if description:
            self.progress.update(self.task, description=f"{self.label}: {description}", total=total, completed=0)
        self._child.stdin.write(json.dumps({"command": command, **arguments}) + "\n")
        self._child.stdin.flush()
        return self._until("result")["value"]

    def close(self) -> None:
        if self._child.poll() is None:
            # An engine that hangs in its shutdown is killed: the kill ends the wait for its last lines too.
            deadline = threading.Timer(CLOSE_TIMEOUT_S, self._child.kill)
            deadline.start()
            try:
                self._child.stdin.write(json.dumps({"command": "exit"}) + "\n")
                self._child.stdin.flush()
                self._until("closed")
                self._child.wait()
            except (OSError, WorkflowError):
                self._child.kill()
                self._child.wait()
            finally:
                deadline.cancel()
        self._log.close()
        self._work.cleanup()
        self.progress.update(self.task, visible=False)


def run_engine_job(scenario: Scenario, *, label: str, env: dict[str, str], log_path: Path, progress: Progress,
                   capture: bool = False, max_layers: int | None = None, max_requests: int | None = None) -> dict:
    """`sk capture`'s run: each workload once in one engine, its operators recorded. Returns
    {"environment", "workloads": {token: {"operators"}}}; if the engine fails, a WorkflowError with its first
    error and the log's path."""
    with EngineProcess(scenario, label=label, env=env, log_path=log_path, progress=progress,
                       mode="capture" if capture else "eval", max_layers=max_layers,
                       max_requests=max_requests) as engine:
        engine.wait_ready()
        workloads = {}
        for token in scenario.workloads:
            engine.call("capture_reset")  # drop the engine's start-up profiling runs
            engine.call("match", description=token, workload=token)
            workloads[token] = {"operators": engine.call("capture")}
        return {"environment": engine.call("info")["environment"], "workloads": workloads}


def start_sharing(stack: contextlib.ExitStack, scenario: Scenario,
                  starts: list[Callable[[int], EngineProcess]]) -> list[EngineProcess]:
    """Engines that share one device, started in order (`starts[k](k)`: the k-th gets slot k) and entered into
    `stack`, so that whatever started ends with it; returned ready. One after the other where each sizes its
    memory from what is free once the previous one is up; together where the KV cache size is explicit (vLLM's
    CPU engine)."""
    together = scenario.kv_cache_memory_bytes is not None
    engines = []
    for slot, start in enumerate(starts):
        engines.append(stack.enter_context(start(slot)))
        if not together:
            engines[-1].wait_ready()
    if together:
        for engine in engines:
            engine.wait_ready()
    return engines
