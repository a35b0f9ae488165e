"""sk-serve's lifecycle on a CUDA host, for either engine (SGLang's server cannot run on the CPU machines).

    python ci/gpu/serve_check.py vllm|sglang OUTDIR [--tp N]

On the trained Llama-style model, named as scenario files name it (sk-trained/llama), bf16, engine defaults:
  1. `sk-serve --engine ENGINE sk-trained/llama --strict --drain 1`: /v1/models lists the name, one completion;
     then LONG_REQUESTS requests of LONG_TOKENS tokens and SIGTERM 2 s later. Each client must get, within
     --drain + ANSWER_MARGIN_S, a complete answer or one that says it was stopped (vLLM: HTTP 500 "The server is
     shutting down"; SGLang: finish_reason "abort"); sk-serve must exit 0 (no strict violation on sm90 in bf16);
     every model process (vLLM worker, SGLang scheduler) must have a report with kernel calls written after
     the SIGTERM; nothing of sk-serve's process tree may be left.
  2. The same start, then SIGKILL of sk-serve: within 10 s nothing of its tree is alive and the port is closed.
  3. `--strict` with every op call forced outside coverage (ci/gpu/forced_fallback on PYTHONPATH): sk-serve must
     exit 3 by itself, its last line naming the strict violation (op and reason), nothing of its tree left.
Writes OUTDIR/serve_check.json and prints it; exit status 1 when an expectation fails.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "adapters"))
from processes import free_port, leftovers, port_open, tree  # noqa: E402  (the CPU tests' helpers)

MODEL = "sk-trained/llama"
START_TIMEOUT_S = 400
STOP_TIMEOUT_S = 90
DRAIN_S = 1
LONG_REQUESTS, LONG_TOKENS = 8, 4000
# SGLang's drain loop looks every 5 s; the rest is slack.
ANSWER_MARGIN_S = 15
ENGINE_ARGS = {"vllm": ["--dtype", "bfloat16"], "sglang": ["--dtype", "bfloat16", "--sampling-backend", "pytorch"]}
TP_FLAG = {"vllm": "--tensor-parallel-size", "sglang": "--tp-size"}


class Server:
    def __init__(self, engine: str, tp: int, work: Path, *args: str, env: dict | None = None,
                 wait_for_models: bool = True):
        self.port, self.marker = free_port(), f"sk-serve-check-{uuid.uuid4().hex}"
        self.log, self.reports = work / "sk-serve.log", work / "reports"
        work.mkdir(parents=True, exist_ok=True)
        self.command = [sys.executable, "-m", "sk.adapters.serve", "--engine", engine, MODEL,
                        "--report-dir", str(self.reports), "--host", "127.0.0.1", "--port", str(self.port),
                        *ENGINE_ARGS[engine], TP_FLAG[engine], str(tp), *args]
        env_extra = env
        env = {k: v for k, v in os.environ.items() if k not in ("SK_ADAPTERS", "SK_STRICT", "SK_REPORT_DIR")}
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.command, env={**env, **(env_extra or {}),
                                                            "SK_SERVE_CHECK_MARKER": self.marker},
                                         stdout=log, stderr=subprocess.STDOUT)
        self.started = started = time.monotonic()
        self.seen = tree(self.proc.pid)
        if not wait_for_models:
            return
        while time.monotonic() - started < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sk-serve exited with {self.proc.returncode} before serving")
            try:
                self.models = [m["id"] for m in self.get("/v1/models")["data"]]
                break
            except OSError:
                time.sleep(2)
        else:
            raise RuntimeError(f"no answer within {START_TIMEOUT_S} s")
        self.startup_s = time.monotonic() - started
        self.seen = tree(self.proc.pid)

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return json.load(r)

    def complete(self, max_tokens: int, timeout: float) -> dict:
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions",
                                         data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.load(r)

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def check_sigterm(engine: str, tp: int, work: Path) -> dict:
    from sk.reports import model_process_reports, read_reports

    server = Server(engine, tp, work, "--strict", "--drain", str(DRAIN_S))
    result: dict = {"command": " ".join(server.command[1:]), "startup_s": round(server.startup_s),
                    "served_models": server.models, "problems": []}
    try:
        result["completion_tokens"] = server.complete(8, timeout=60)["usage"]["completion_tokens"]
        outcomes: list[dict] = []

        def long_request() -> None:
            try:
                answer = server.complete(LONG_TOKENS, timeout=300)
                outcomes.append({"kind": "answer", "tokens": answer["usage"]["completion_tokens"],
                                 "finish_reason": answer["choices"][0]["finish_reason"], "at": time.monotonic()})
            except urllib.error.HTTPError as e:
                outcomes.append({"kind": "http", "status": e.code, "body": e.read().decode()[:300],
                                 "at": time.monotonic()})
            except OSError as e:
                outcomes.append({"kind": "lost", "error": repr(e), "at": time.monotonic()})

        clients = [threading.Thread(target=long_request) for _ in range(LONG_REQUESTS)]
        for c in clients:
            c.start()
        time.sleep(2)
        stopped, stopped_wall = time.monotonic(), time.time()
        server.proc.send_signal(signal.SIGTERM)
        for c in clients:
            c.join(timeout=DRAIN_S + ANSWER_MARGIN_S + 120)
        result["exit_status"] = server.proc.wait(timeout=STOP_TIMEOUT_S)
        result["stop_s"] = round(time.monotonic() - stopped, 1)
        for o in outcomes:
            o["after_sigterm_s"] = round(o.pop("at") - stopped, 1)
        result["outcomes"] = outcomes
        models = model_process_reports(read_reports(server.reports, engine=engine))
        result["model_processes"] = [
            {"pid": r["pid"], "process": r["process"], "rank": r["rank"], "kernel_calls": r["coverage"]["kernel_calls"],
             "fallbacks": sum(f["count"] for f in r["coverage"]["fallbacks"]),
             "written_after_sigterm": (server.reports / f"{engine}-{r['pid']}.json").stat().st_mtime >= stopped_wall}
            for r in models]
        result["leftovers"] = leftovers(server.marker, server.seen)
        stopped_ok = [o for o in outcomes if (o["kind"] == "answer" and (o["tokens"] == LONG_TOKENS
                                                                          or o["finish_reason"] == "abort"))
                      or (o["kind"] == "http" and o["status"] >= 500)]
        result["problems"] = [p for p, bad in (
            (f"/v1/models lists {server.models}, not {MODEL}", server.models != [MODEL]),
            (f"exit status {result['exit_status']}", result["exit_status"] != 0),
            (f"{len(outcomes)} of {LONG_REQUESTS} clients answered", len(outcomes) != LONG_REQUESTS),
            ("a client got no proper answer", len(stopped_ok) != len(outcomes)),
            ("a client was answered late", any(o["after_sigterm_s"] > DRAIN_S + ANSWER_MARGIN_S for o in outcomes)),
            ("no model process report", not models),
            ("a model process without kernel calls", any(not m["kernel_calls"] for m in result["model_processes"])),
            ("a model process report not written after SIGTERM",
             any(not m["written_after_sigterm"] for m in result["model_processes"])),
            (f"processes left: {result['leftovers']}", bool(result["leftovers"])),
        ) if bad]
    except Exception as e:  # noqa: BLE001  (recorded with the log's end)
        result["problems"].append(repr(e))
    finally:
        server.stop()
    if result["problems"]:
        result["log_tail"] = server.tail()
    return result


def check_sigkill(engine: str, tp: int, work: Path) -> dict:
    server = Server(engine, tp, work)
    result: dict = {"startup_s": round(server.startup_s), "processes": len(server.seen)}
    try:
        server.proc.kill()
        killed = time.monotonic()
        while (leftovers(server.marker, server.seen) or port_open(server.port)) and time.monotonic() - killed < 10:
            time.sleep(0.5)
        result["gone_after_s"] = round(time.monotonic() - killed, 1)
        result["leftovers"], result["port_open"] = leftovers(server.marker, server.seen), port_open(server.port)
        result["problems"] = [p for p, bad in ((f"processes left: {result['leftovers']}", bool(result["leftovers"])),
                                               ("port still open", result["port_open"])) if bad]
    finally:
        server.stop()
        for pid in leftovers(server.marker, server.seen):
            os.kill(pid, signal.SIGKILL)
    return result


def check_strict(engine: str, tp: int, work: Path) -> dict:
    forced = str(REPO / "ci" / "gpu" / "forced_fallback")
    path = os.pathsep.join(p for p in (forced, os.environ.get("PYTHONPATH")) if p)
    server = Server(engine, tp, work, "--strict", env={"PYTHONPATH": path}, wait_for_models=False)
    result: dict = {"command": " ".join(server.command[1:]) + f"  (PYTHONPATH starts with {forced})"}
    try:
        while server.proc.poll() is None and time.monotonic() - server.started < START_TIMEOUT_S:
            server.seen |= tree(server.proc.pid)
            try:  # once it serves, a request reaches the model
                server.complete(4, timeout=30)
            except OSError:
                time.sleep(1)
        result["exit_status"] = server.proc.poll()
        result["after_s"] = round(time.monotonic() - server.started)
        lines = [line for line in server.log.read_text().splitlines() if line.strip()]
        result["last_line"] = lines[-1] if lines else ""
        time.sleep(5)
        result["leftovers"] = leftovers(server.marker, server.seen)
        result["problems"] = [p for p, bad in (
            (f"exit status {result['exit_status']}, not 3", result["exit_status"] != 3),
            ("the last line does not name the strict violation",
             "strict mode" not in result["last_line"] or "forced outside coverage" not in result["last_line"]),
            (f"processes left: {result['leftovers']}", bool(result["leftovers"])),
        ) if bad]
    finally:
        server.stop()
    if result["problems"]:
        result["log_tail"] = server.tail()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=sorted(ENGINE_ARGS))
    parser.add_argument("outdir")
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    out = Path(args.outdir)
    summary: dict = {"engine": args.engine, "tp": args.tp}
    for name, check in (("sigterm", check_sigterm), ("sigkill", check_sigkill), ("strict", check_strict)):
        try:
            summary[name] = check(args.engine, args.tp, out / name)
        except Exception as e:  # noqa: BLE001  (a server that did not start: recorded, the next check runs)
            summary[name] = {"problems": [repr(e)]}
    (out / "serve_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 1 if any(summary[name]["problems"] for name in ("sigterm", "sigkill", "strict")) else 0


if __name__ == "__main__":
    sys.exit(main())
