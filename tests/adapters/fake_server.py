"""A stand-in for an engine's server: sk-serve's lifecycle without an engine (tests/adapters/test_serve_lifecycle.py).

    python fake_server.py MODEL --port P --state DIR --mode serve|exit|hang [other server arguments...]

Like vLLM and SGLang it starts a process of its own (the "worker", which starts one more), in its process group:
the worker activates a report as the adapters do (sk.reports.keep_report_written), runs sk.ops.rms_norm on
--shapes (falling back on CPU; under SK_STRICT=1 the first call raises CoverageError, which it survives),
then sleeps until killed. The server answers GET /v1/models, GET /server_info, POST /abort_request, and records
each request and its own argv in DIR. Modes: serve: exits 0 on SIGINT/SIGTERM; exit: exits 0 by itself 2 s after
serving; hang: ignores SIGINT/SIGTERM and exits 0 once asked to abort every request (as SGLang's drain then ends).
"""
import argparse
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

WORKER = """
import subprocess, sys, time, torch, sk
sk.reports.keep_report_written("vllm", lambda: sk.reports.process_report("vllm", {"RMSNorm": "fake"}, 0))
for shape in [tuple(map(int, s.split("x"))) for s in sys.argv[1].split(",") if s]:
    try:
        sk.ops.rms_norm(torch.ones(shape), torch.ones(shape[-1]))
    except sk.CoverageError:
        pass  # an engine that survives its first strict violation: sk-serve must stop it anyway
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("fake worker ready", flush=True)
time.sleep(600)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--mode", choices=["serve", "exit", "hang"], default="serve")
    parser.add_argument("--shapes", default="")
    args, _ = parser.parse_known_args()
    state = Path(args.state)
    state.mkdir(parents=True, exist_ok=True)
    (state / "argv.json").write_text(json.dumps(sys.argv[1:]))
    requests = state / "requests.txt"
    subprocess.Popen([sys.executable, "-c", WORKER, args.shapes])
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            with open(requests, "a") as f:
                f.write(f"GET {self.path}\n")
            self._answer({"data": [{"id": args.model}]} if self.path == "/v1/models" else {})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            with open(requests, "a") as f:
                f.write(f"POST {self.path} {body}\n")
            self._answer({})
            if self.path == "/abort_request" and json.loads(body).get("abort_all"):
                stop.set()

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, (lambda *_: None) if args.mode == "hang" else (lambda *_: stop.set()))
    if args.mode == "exit":
        threading.Timer(2.0, stop.set).start()
    while not stop.wait(0.1):
        pass
    server.shutdown()
    os._exit(0)  # the worker stays: sk-serve ends what the server leaves in its group


if __name__ == "__main__":
    main()
