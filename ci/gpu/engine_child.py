"""One engine run of a GPU check in its own process tree: a log file, a time limit, and stacks when it stalls.

An engine's start-up can stop without a word (a deadlock in a forked process, say), and a bare time limit then
leaves nothing to debug. Every Python process of the run registers faulthandler on SIGUSR1 (diagnostics/
sitecustomize.py, put first on PYTHONPATH), and when the log has been silent for `silence_s` or the run passes
`timeout_s`, each of them prints its threads' stacks into the log before the whole tree is killed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

DIAGNOSTICS = Path(__file__).resolve().parent / "diagnostics"


def run_child(command: list[str], env: dict[str, str], log: Path, timeout_s: float, silence_s: float) -> int | str:
    """The exit status, or why the run was stopped ("stalled: ...", "timeout: ...") after dumping its stacks."""
    env = {**env, "PYTHONFAULTHANDLER": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(DIAGNOSTICS), env.get("PYTHONPATH", "")) if p)}
    started = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(command, env=env, stdout=f, stderr=subprocess.STDOUT)
    while True:
        try:
            return proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        silent_s = time.time() - log.stat().st_mtime
        if silent_s > silence_s:
            reason = f"stalled: no output for {silent_s:.0f} s, {time.monotonic() - started:.0f} s in"
        elif time.monotonic() - started > timeout_s:
            reason = f"timeout: still running after {timeout_s:.0f} s"
        else:
            continue
        _stop_tree(proc.pid)
        proc.wait()
        with open(log, "a") as f:
            f.write(f"\n[engine_child] {reason}; stacks above, process tree killed\n")
        return reason


def _stop_tree(root: int) -> None:
    """Stacks of every Python process under `root` into the log, then SIGKILL to the whole tree."""
    import psutil

    try:
        tree = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in tree:
        try:
            # Only Python processes registered the handler (by executable: engines retitle their processes).
            if "python" in os.path.basename(proc.exe()):
                proc.send_signal(signal.SIGUSR1)
        except psutil.Error:
            pass
    time.sleep(3)
    for proc in tree:
        try:
            proc.kill()
        except psutil.Error:
            pass
