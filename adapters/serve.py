"""sk-serve: start an engine's OpenAI-compatible server with Standard Kernels active in all its processes.

    sk-serve --engine vllm|sglang MODEL [--strict] [--no-sk] [--report-dir DIR] [engine server arguments...]

The server runs as a child in its own process group, with SK_ADAPTERS set so that the engine's plugin entry
point activates our layers in every process it starts. SIGINT/SIGTERM are passed on for the engine's own
graceful shutdown (vLLM gets --shutdown-timeout 10 unless given one, so its workers exit, not get killed, and
write their reports); whatever is still alive in the group after a grace period is terminated, then killed, so
no worker outlives sk-serve. At exit the per-process reports are summed and printed.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from types import ModuleType

from sk import reports, settings
from sk.adapters.vllm.serve import ENGINE_SHUTDOWN_S

# How long the engine gets to stop by itself after our signal, then after SIGTERM to its whole process group.
GRACE_S = 30.0
TERM_S = 10.0
# Each engine's part: engine_command(model, args), activation_summary(strict, report_dir), before_stop(args).
ENGINES = {"vllm": "sk.adapters.vllm.serve", "sglang": "sk.adapters.sglang.serve"}


def engine_part(engine: str) -> ModuleType:
    return importlib.import_module(ENGINES[engine])


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="sk-serve",
        description="Serve a model with an inference engine, Standard Kernels active in every engine process. "
                    "Arguments not listed here go to the engine's server unchanged; vLLM gets "
                    f"--shutdown-timeout {ENGINE_SHUTDOWN_S} unless given one, so its workers stop cleanly.",
    )
    parser.add_argument("--engine", choices=ENGINES, required=True)
    parser.add_argument("model", help="model path or name, as the engine takes it")
    parser.add_argument("--strict", action="store_true", help="any fallback to PyTorch inside the engine is an error")
    parser.add_argument("--no-sk", action="store_true", help="run the stock engine, for comparison")
    parser.add_argument("--report-dir", help="where each engine process writes its report (default: a new temp dir)")
    return parser.parse_known_args(argv)


def engine_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    names = [n for n in settings.get("adapters") if n != args.engine]
    if not args.no_sk:
        names.append(args.engine)
        env[reports.REPORT_DIR_ENV] = args.report_dir
    env[reports.ACTIVATION_ENV] = ",".join(names)
    if args.strict:
        env[settings.SETTINGS["strict"].env] = "1"
    return env


def activation_summary(args: argparse.Namespace) -> str:
    if args.no_sk:
        return f"standardkernels: OFF (--no-sk): stock {args.engine}"
    return engine_part(args.engine).activation_summary(args.strict, args.report_dir)


def stop_group(proc: subprocess.Popen, first_signal: int) -> int:
    """Signal the engine, give it time to stop its children, then terminate and kill what is left."""
    for sig, wait_s in ((first_signal, GRACE_S), (signal.SIGTERM, TERM_S), (signal.SIGKILL, None)):
        try:
            if sig == first_signal:
                proc.send_signal(sig)
            else:
                os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    _kill_leftovers(proc.pid)
    return proc.wait()


def _kill_leftovers(pgid: int) -> None:
    # The server may exit before its workers; anything left in its process group goes with it.
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def print_reports(directory: str) -> None:
    found = reports.read_reports(directory)
    if not found:
        print(f"sk-serve: no engine process wrote a report to {directory}", file=sys.stderr)
        return
    print(f"sk-serve: standardkernels reports ({len(found)} processes, {directory}):", file=sys.stderr)
    for r in found:
        cov = r["coverage"]
        fallbacks = sum(f["count"] for f in cov["fallbacks"])
        print(f"  pid {r['pid']} {r['process']} rank={r['rank']}: kernel calls {cov['kernel_calls'] or '{}'}, "
              f"fallbacks {fallbacks}", file=sys.stderr)
    for f in reports.merge_reports(found)["coverage"]["fallbacks"]:
        print(f"  fallback {f['op']} shapes {f['shapes']} {'/'.join(f['dtypes'])} x{f['count']}: {f['reason']}",
              file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args, engine_args = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.no_sk:
        args.report_dir = args.report_dir or tempfile.mkdtemp(prefix="sk-serve-reports-")
    part = engine_part(args.engine)
    try:
        print(activation_summary(args), file=sys.stderr, flush=True)
    except ImportError as e:
        print(f"sk-serve: {args.engine} is not importable in this Python ({sys.executable}): {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # the adapter refuses this engine build (Unsupported*Error): say why, start nothing
        print(f"sk-serve: {e}", file=sys.stderr)
        return 2

    proc = subprocess.Popen(part.engine_command(args.model, engine_args), env=engine_env(args),
                            start_new_session=True)
    received: list[int] = []

    def on_signal(signum, _frame):
        received.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    while proc.poll() is None and not received:
        time.sleep(0.2)
    if proc.poll() is None and not args.no_sk:
        part.before_stop(engine_args)
    code = stop_group(proc, received[0] if received else signal.SIGTERM)
    if not args.no_sk:
        print_reports(args.report_dir)
    # A stop we were asked for is a clean exit; otherwise report the engine's own status.
    return 0 if received else code


if __name__ == "__main__":
    sys.exit(main())
