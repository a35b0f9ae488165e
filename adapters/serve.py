"""sk-serve: start an engine's OpenAI-compatible server with Standard Kernels active in all its processes.

    sk-serve --engine vllm|sglang MODEL [--strict] [--no-sk] [--report-dir DIR] [--drain SECONDS]
             [engine server arguments...]

MODEL is a directory, a hub id, or a project model named as scenario files name them (`sk-trained/<style>`,
`sk-tiny/<style>`, resolved by sk.workflow.scenarios.resolve_model), which is then served under that name.
Both engines run through the code below; each engine's part (`sk.adapters.<engine>.serve`) says what to start
and how its server drains.

Processes: a watchdog (adapters/watchdog.py) leads a new process group and the server runs in it, so the
engine's own processes (vLLM's EngineCore and workers, SGLang's schedulers) are in it too. If sk-serve dies,
SIGKILL included, the watchdog ends the whole group within watchdog.TERM_S + 1 s. The group is not the
terminal's foreground group (Ctrl-C reaches sk-serve only), and SK_ADAPTERS makes the engines' plugin entry
points activate our layers in every process.

Stopping (SIGINT, SIGTERM, SIGHUP): the part's before_stop (SGLang: the schedulers write their reports), then the
signal to the server, whose in-flight requests get --drain seconds (default DRAIN_S) to finish. Those still
running then get an answer: vLLM's API server (its --shutdown-timeout, which --drain sets unless given) answers
them with HTTP 500 (sk.adapters.vllm.server); SGLang, which would drain forever, is asked to abort them and
answers each with finish_reason "abort". Whatever still runs GRACE_S after the signal (drain + AFTER_DRAIN_S if
longer) gets SIGTERM, then SIGKILL after TERM_S, so nothing outlives sk-serve.

Strict mode: with --strict (or SK_STRICT=1) the first fallback in any engine process is written to that
process's report as it raises (sk.coverage, sk.reports). sk-serve checks the reports every POLL_S and stops
the server at the first violation, so that `--strict` in CI fails at once and loudly instead of serving on
with an engine that may be dead or half-working.

Exit status, with a last line saying why when it is not 0:
  0  stopped by a signal, as asked;
  1  the server stopped by itself (the engine died or could not start);
  2  nothing started (unknown model name, engine not importable, engine build refused by the adapter);
  3  a strict-mode violation (the line names the process, op, input shapes and reason).
At exit the per-process reports are summed: calls per process, fallbacks per op and reason (calls, distinct
shapes); every shape stays in the JSON reports.
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
from pathlib import Path
from types import ModuleType

from sk import reports, settings

# After the stop signal: in-flight requests' time to finish (--drain), how long the server gets to stop by
# itself (at least the drain + AFTER_DRAIN_S), then how long its process group gets after SIGTERM before SIGKILL.
DRAIN_S = 10
GRACE_S = 30.0
AFTER_DRAIN_S = 20.0
TERM_S = 10.0
# How often sk-serve looks at the server process and, in strict mode, at the reports.
POLL_S = 0.5
EXIT_OK, EXIT_SERVER_DIED, EXIT_NOT_STARTED, EXIT_STRICT = 0, 1, 2, 3
WATCHDOG = Path(__file__).with_name("watchdog.py")
# Each engine's part: engine_command(model, args, drain_s), activation_summary(strict, report_dir),
# before_stop(args), drain_s(args, default), at_drain_deadline(args, drain_s).
ENGINES = {"vllm": "sk.adapters.vllm.serve", "sglang": "sk.adapters.sglang.serve"}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def engine_part(engine: str) -> ModuleType:
    return importlib.import_module(ENGINES[engine])


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="sk-serve",
        description="Serve a model with an inference engine, Standard Kernels active in every engine process. "
                    "Arguments not listed here go to the engine's server unchanged. Exit status: 0 stopped by a "
                    "signal, 1 the server stopped by itself, 2 nothing started, 3 a strict-mode violation.",
    )
    parser.add_argument("--engine", choices=ENGINES, required=True)
    parser.add_argument("model", help="model directory, hub id, or sk-trained/<style> / sk-tiny/<style>")
    parser.add_argument("--strict", action="store_true",
                        help="any fallback to PyTorch inside the engine is an error: the server is stopped at the "
                             "first one and sk-serve exits with status 3")
    parser.add_argument("--no-sk", action="store_true", help="run the stock engine, for comparison")
    parser.add_argument("--report-dir", help="where each engine process writes its report (default: a new temp dir)")
    parser.add_argument("--drain", type=int, default=DRAIN_S, metavar="SECONDS",
                        help=f"after a stop signal, how long in-flight requests get to finish before they are "
                             f"answered with an error (vLLM) or aborted (SGLang); default {DRAIN_S}; vLLM's own "
                             f"--shutdown-timeout wins when given")
    return parser.parse_known_args(argv)


def served_model(model: str, engine_args: list[str]) -> tuple[str, list[str]]:
    """What the engine loads for `model` and the arguments that serve it under the name given (ValueError for an
    unknown project model)."""
    from sk.workflow.scenarios import resolve_model

    path = resolve_model(model)
    if path != model and not any(a.split("=")[0] == "--served-model-name" for a in engine_args):
        engine_args = [*engine_args, "--served-model-name", model]
    return path, engine_args


def engine_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    names = [n for n in settings.get("adapters") if n != args.engine]
    if not args.no_sk:
        names.append(args.engine)
        env[reports.REPORT_DIR_ENV] = args.report_dir
    env[reports.ACTIVATION_ENV] = ",".join(names)
    if args.strict:
        env[settings.env_name("strict")] = "1"
    return env


def activation_summary(args: argparse.Namespace) -> str:
    if args.no_sk:
        return f"standardkernels: OFF (--no-sk): stock {args.engine}"
    return engine_part(args.engine).activation_summary(args.strict, args.report_dir)


def start_server(command: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, subprocess.Popen]:
    """(watchdog, server): the watchdog leads a new process group, the server starts in it."""
    watchdog = subprocess.Popen([sys.executable, "-I", "-S", str(WATCHDOG), str(os.getpid())],
                                preexec_fn=os.setpgrp, stdin=subprocess.DEVNULL)
    group = watchdog.pid
    try:
        server = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                  preexec_fn=lambda: os.setpgid(0, group))
    except BaseException:
        _kill_group(group)
        watchdog.wait()
        raise
    return watchdog, server


def stop_server(server: subprocess.Popen, group: int, first_signal: int, part: ModuleType,
                engine_args: list[str], drain: float) -> None:
    """Signal the server, let its requests drain, then terminate and kill whatever is left of its group."""
    started = time.monotonic()
    try:
        server.send_signal(first_signal)
    except ProcessLookupError:
        pass
    if not _wait(server, drain):
        part.at_drain_deadline(engine_args, drain)
        _wait(server, max(GRACE_S, drain + AFTER_DRAIN_S) - (time.monotonic() - started))
    if server.poll() is None:
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass
        _wait(server, TERM_S)
    _kill_group(group)
    server.wait()


def _wait(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(timeout=max(seconds, 0))
        return True
    except subprocess.TimeoutExpired:
        return False


def _kill_group(group: int) -> None:
    # The server may exit before its workers: anything left in the group goes with it (the watchdog too).
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def first_violation(report_dir: str | None) -> tuple[dict, dict] | None:
    if report_dir is None or not os.path.isdir(report_dir):
        return None
    try:
        return reports.first_strict_violation(reports.read_reports(report_dir))
    except (OSError, ValueError):  # a report replaced while read: look again at the next poll
        return None


def violation_sentence(report: dict, violation: dict) -> str:
    return (f"strict mode: the first fallback was in {report['process']} (pid {report['pid']}): "
            f"{violation['message']}")


def print_reports(found: list[dict], directory: str) -> None:
    import sk

    if not found:
        print(f"sk-serve: no engine process wrote a report to {directory}", file=sys.stderr)
        return
    print(f"sk-serve: standardkernels reports ({len(found)} processes, {directory}):", file=sys.stderr)
    for r in found:
        cov = r["coverage"]
        fallbacks = sum(f["count"] for f in cov["fallbacks"])
        violation = f", strict violation in {cov['strict_violation']['op']}" if cov.get("strict_violation") else ""
        print(f"  pid {r['pid']} {r['process']} rank={r['rank']}: kernel calls {cov['kernel_calls'] or '{}'}, "
              f"fallbacks {fallbacks}{violation}", file=sys.stderr)
        fused = reports.fused_blocks_summary(r)
        if fused and r["rank"] is not None:
            print(f"    {fused}", file=sys.stderr)
    summary = sk.coverage.fallback_summary(reports.merge_reports(found)["coverage"])
    if summary:
        print("  fallbacks by op and reason (each shape: the JSON reports):", file=sys.stderr)
    for f in summary:
        print(f"    {f['op']} x{f['count']}, {f['shapes']} shape{'s' if f['shapes'] != 1 else ''} "
              f"({', '.join(f['dtypes'])}): {f['reason']}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args, engine_args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        model, engine_args = served_model(args.model, engine_args)
    except ValueError as e:
        print(f"sk-serve: {e}", file=sys.stderr)
        return EXIT_NOT_STARTED
    if not args.no_sk:
        args.report_dir = args.report_dir or tempfile.mkdtemp(prefix="sk-serve-reports-")
    part = engine_part(args.engine)
    try:
        print(activation_summary(args), file=sys.stderr, flush=True)
    except ImportError as e:
        print(f"sk-serve: {args.engine} is not importable in this Python ({sys.executable}): {e}", file=sys.stderr)
        return EXIT_NOT_STARTED
    except RuntimeError as e:  # the adapter refuses this engine build (Unsupported*Error): say why, start nothing
        print(f"sk-serve: {e}", file=sys.stderr)
        return EXIT_NOT_STARTED

    received: list[int] = []

    def on_signal(signum, _frame):
        received.append(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    watchdog, server = start_server(part.engine_command(model, engine_args, args.drain), engine_env(args))
    watch_reports = not args.no_sk and (args.strict or settings.get("strict"))
    violation = None
    while server.poll() is None and not received and violation is None:
        time.sleep(POLL_S)
        violation = first_violation(args.report_dir) if watch_reports else None
    died = server.poll() is not None
    if died:
        _kill_group(watchdog.pid)
    else:
        if violation is not None:
            print(f"sk-serve: {violation_sentence(*violation)} Stopping the server.", file=sys.stderr, flush=True)
        if not args.no_sk:
            part.before_stop(engine_args)
        stop_server(server, watchdog.pid, received[0] if received else signal.SIGTERM, part, engine_args,
                    part.drain_s(engine_args, args.drain))
    watchdog.wait()

    found = [] if args.no_sk else reports.read_reports(args.report_dir)
    if not args.no_sk:
        print_reports(found, args.report_dir)
    violation = reports.first_strict_violation(found)
    if violation is not None:
        print(f"sk-serve: FAILED (exit {EXIT_STRICT}): {violation_sentence(*violation)}", file=sys.stderr)
        return EXIT_STRICT
    if died and not received:
        print(f"sk-serve: FAILED (exit {EXIT_SERVER_DIED}): the {args.engine} server stopped by itself "
              f"(exit status {server.returncode}) before it was asked to; its log above says why", file=sys.stderr)
        return EXIT_SERVER_DIED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
