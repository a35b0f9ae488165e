"""Run one engine job (sk.workflow.engine_job) in a child process, with progress bars and a log file.

Each run gets a fresh process: our adapter is switched on per process through the environment, and the
baseline and the candidate must not share any engine state. Variables that would switch the adapter on, make
it strict, write reports or load candidates are removed from the child's environment unless the run sets them.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sk import settings
from sk.workflow.candidates import CANDIDATE_DIR_ENV
from sk.workflow.engine_job import EVENT_PREFIX, truncated_model_args
from sk.workflow.errors import WorkflowError
from sk.workflow.scenarios import Scenario

_ERROR_LINE = re.compile(r"\b\w*(Error|Exception): ")


def progress_bars() -> Progress:
    return Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


def run_engine_job(scenario: Scenario, *, label: str, env: dict[str, str], log_path: Path, progress: Progress,
                   capture: bool = False, candidates: Path | None = None, enforce_eager: bool = False,
                   max_layers: int | None = None, max_requests: int | None = None) -> dict:
    """The job's results ({"environment", "workloads", "candidates_replaced"}); if the engine fails, a
    WorkflowError with its first error and the log's path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Resolved (and a project model written) here, not in the child: writing a model runs torch's OpenMP CPU
    # kernels, and vLLM forks its engine core by default; a process forked after OpenMP work can hang in its
    # first parallel region.
    model_args = truncated_model_args(scenario, max_layers)
    with tempfile.TemporaryDirectory(prefix="sk-engine-job-") as work:
        job_path, out_path = Path(work) / "job.json", Path(work) / "out.json"
        job_path.write_text(json.dumps({
            "scenario": scenario.model_dump(), "capture": capture, "candidates": candidates is not None,
            "enforce_eager": enforce_eager,
            "model_args": model_args, "max_requests": max_requests, "out": str(out_path),
        }))
        child_env = settings.stock_environment(also=("candidate_dir",)) | env
        if candidates is not None:
            child_env[CANDIDATE_DIR_ENV] = str(candidates.resolve())
        task = progress.add_task(f"{label}: starting engine", total=None)
        tail: deque[str] = deque(maxlen=8)
        first_error = None
        workloads = iter(scenario.workloads)
        with open(log_path, "w") as log, subprocess.Popen(
            [sys.executable, "-m", "sk.workflow.engine_job", str(job_path)], env=child_env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1,
        ) as child:
            for line in child.stdout:
                if not line.startswith(EVENT_PREFIX):
                    log.write(line)
                    tail.append(line)
                    # Engine failures surface wrapped several times; the first "XError: ..." is the cause.
                    if first_error is None and _ERROR_LINE.search(line):
                        first_error = line
                    continue
                event = json.loads(line[len(EVENT_PREFIX):])
                if event["event"] == "engine_ready":
                    progress.update(task, description=f"{label}: engine ready")
                elif event["event"] == "workload":
                    progress.update(task, description=f"{label}: {next(workloads)}", total=event["total"],
                                    completed=0)
                elif event["event"] == "requests_done":
                    progress.advance(task, event["n"])
            returncode = child.wait()
        progress.update(task, visible=False)
        if returncode != 0 or not out_path.exists():
            cause = first_error.strip() if first_error else "the log ends with:\n" + "".join(tail)
            raise WorkflowError(f"the engine run '{label}' failed (exit code {returncode}): {cause}\n"
                                f"(full engine log: {log_path})")
        return json.loads(out_path.read_text())
