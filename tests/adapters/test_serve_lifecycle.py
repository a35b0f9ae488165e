"""sk-serve's lifecycle with either engine's part, around a stand-in server (fake_server.py): exit status and its
last line, the stop on the first strict violation, the watchdog after a SIGKILL, SGLang's drain deadline, the
summed summary and project model names. No engine runs here: this is the code path that serves both engines
(the real vLLM server: test_vllm_serve.py; SGLang's: the H200 check).
"""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from processes import free_port, leftovers, port_open, tree

from sk.reports import REPORT_INTERVAL_S, read_reports

FAKE = Path(__file__).with_name("fake_server.py")
REPO = Path(__file__).resolve().parents[2]
# sk-serve with the engine part's command replaced by the stand-in.
DRIVER = """
import sys
import sk.adapters.serve as serve
engine, fake = sys.argv[1], sys.argv[2]
part = serve.engine_part(engine)
part.engine_command = lambda model, args, drain_s: [sys.executable, fake, model, *args]
part.activation_summary = lambda strict, report_dir: f"fake {engine} server, strict={strict}"
sys.exit(serve.main(["--engine", engine, *sys.argv[3:]]))
"""
START_TIMEOUT_S = 120  # the stand-in's worker imports torch: seconds on a busy CPU


class Served:
    def __init__(self, engine: str, tmp_path: Path, env: dict, *args: str, model: str = "sk-trained/llama"):
        self.port, self.marker = free_port(), f"sk-serve-test-{uuid.uuid4().hex}"
        self.state, self.reports, self.log = tmp_path / "state", tmp_path / "reports", tmp_path / "sk-serve.log"
        self.seen: set[int] = set()
        command = [sys.executable, "-c", DRIVER, engine, str(FAKE), model, "--report-dir", str(self.reports),
                   "--port", str(self.port), "--state", str(self.state), *args]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(command, env={**env, "SK_SERVE_TEST_MARKER": self.marker},
                                         stdout=out, stderr=subprocess.STDOUT)

    def wait_for_worker(self) -> None:
        """Until the stand-in answers and its worker has run its ops; then notes sk-serve's process tree."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            if port_open(self.port) and "fake worker ready" in self.output():
                self.seen = tree(self.proc.pid)
                return
            time.sleep(0.2)
        raise TimeoutError(self.output())

    def leftovers(self) -> list[int]:
        return leftovers(self.marker, self.seen)

    def output(self) -> str:
        return self.log.read_text()

    def last_line(self) -> str:
        return self.output().strip().splitlines()[-1]

    def requests(self) -> list[str]:
        path = self.state / "requests.txt"
        return path.read_text().splitlines() if path.exists() else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def served(engine_env, tmp_path):
    started = []

    def start(engine: str, *args: str, **kwargs) -> Served:
        started.append(Served(engine, tmp_path, engine_env, *args, **kwargs))
        return started[-1]

    yield start
    for s in started:
        s.stop()
        for pid in s.leftovers():  # only what this test started
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_strict_violation_stops_the_server_with_status_3(served, engine):
    s = served(engine, "--strict", "--shapes", "2x8,3x8")
    assert s.proc.wait(timeout=START_TIMEOUT_S) == 3, s.output()  # stopped as soon as the worker's first op ran
    assert "device cpu. Stopping the server." in s.output()
    assert "rank=0: kernel calls {}, fallbacks 0, strict violation in rms_norm" in s.output()
    assert s.last_line().startswith("sk-serve: FAILED (exit 3): strict mode: the first fallback was in MainProcess "
                                    "(pid "), s.output()
    assert "sk.ops.rms_norm: no kernel covers this call (CPU tensor: the kernels need a CUDA GPU" in s.last_line()
    assert s.last_line().endswith("inputs: shapes [(2, 8), (8,)], dtypes ['fp32', 'fp32'], device cpu.")
    assert s.leftovers() == []


def test_server_that_stops_by_itself_gives_status_1(served):
    s = served("vllm", "--mode", "exit")
    assert s.proc.wait(timeout=START_TIMEOUT_S) == 1, s.output()
    assert s.last_line() == ("sk-serve: FAILED (exit 1): the vllm server stopped by itself (exit status 0) "
                             "before it was asked to; its log above says why")
    assert s.leftovers() == []  # the worker it left behind went with it


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_sigkill_of_sk_serve_ends_every_engine_process(served, engine):
    s = served(engine)
    s.wait_for_worker()
    assert len(s.seen) == 5  # sk-serve, watchdog, server, worker and its child
    s.proc.kill()
    killed = time.monotonic()
    while s.leftovers() and time.monotonic() - killed < 10:
        time.sleep(0.2)
    assert s.leftovers() == [] and not port_open(s.port)
    assert time.monotonic() - killed < 5  # watchdog.POLL_S + watchdog.TERM_S, with a margin


def test_sglang_stop_asks_for_reports_then_aborts_requests_at_the_drain_deadline(served):
    s = served("sglang", "--mode", "hang", "--drain", "1")
    s.wait_for_worker()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=60) == 0, s.output()
    assert [r for r in s.requests() if "/v1/models" not in r] == [
        "GET /server_info", 'POST /abort_request {"abort_all": true}']
    assert "sk-serve: requests still running 1 s after the stop signal: aborting them" in s.output()
    assert s.leftovers() == []


def test_project_model_name_and_summary_per_op_and_reason(served):
    s = served("vllm", "--shapes", "2x8,3x8,3x8,4x8")
    s.wait_for_worker()
    time.sleep(REPORT_INTERVAL_S + 0.5)  # the worker's writer thread has written its counts
    s.proc.send_signal(signal.SIGINT)
    assert s.proc.wait(timeout=60) == 0, s.output()
    argv = json.loads((s.state / "argv.json").read_text())
    assert argv[0] == str(REPO / "models" / "trained" / "llama")
    assert argv[-2:] == ["--served-model-name", "sk-trained/llama"]
    # The worker was SIGKILLed with the group: its report is the one its writer thread kept current.
    (worker,) = [r for r in read_reports(s.reports) if r["rank"] == 0]
    assert sum(f["count"] for f in worker["coverage"]["fallbacks"]) == 4
    lines = s.output().splitlines()
    at = lines.index("  fallbacks by op and reason (each shape: the JSON reports):")
    assert lines[at + 1] == ("    rms_norm x4, 3 shapes (fp32/fp32): CPU tensor: the kernels need a CUDA GPU "
                             "(TRITON_INTERPRET=1 runs them interpreted, for testing)")
    assert len(lines) == at + 2  # one line per op and reason, the last line of a clean run


def test_unknown_project_model_starts_nothing(capsys):
    from sk.adapters.serve import main

    assert main(["--engine", "vllm", "sk-trained/mistral"]) == 2
    assert capsys.readouterr().err == ("sk-serve: unknown project model 'sk-trained/mistral'; known: "
                                       "sk-trained/llama, sk-trained/gemma, sk-trained/qwen3, sk-tiny/llama, "
                                       "sk-tiny/gemma, sk-tiny/qwen3\n")
