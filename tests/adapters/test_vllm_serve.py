"""sk-serve --engine vllm with vLLM's CPU engine: serves a project model by its name with our layers active;
SIGTERM under long requests answers them within the drain bound and still collects every process's report;
SIGKILL of sk-serve takes the engine's whole process tree down; a strict violation in a request fails sk-serve.

Three engine starts (30-60 s each on CI, more on a busy machine); the first server serves two tests.
"""
import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from processes import free_port, leftovers, port_open, tree

from sk.reports import read_reports

START_TIMEOUT_S = 300
STOP_TIMEOUT_S = 60
# The drain this module's server gets (--shutdown-timeout), and how much later clients may be answered.
DRAIN_S = 2
ANSWER_MARGIN_S = 8
MODEL = "sk-trained/llama"


class Server:
    def __init__(self, vllm_python: str, env: dict, out: Path, *args: str, max_model_len: int = 512):
        self.port, self.marker, self.out = free_port(), f"sk-serve-test-{uuid.uuid4().hex}", out
        self.log, self.reports = out / "sk-serve.log", out / "reports"
        command = [str(Path(vllm_python).parent / "sk-serve"), "--engine", "vllm", MODEL,
                   "--report-dir", str(self.reports), "--host", "127.0.0.1", "--port", str(self.port),
                   "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len), *args]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(command, env={**env, "SK_SERVE_TEST_MARKER": self.marker,
                                                       "VLLM_CPU_KVCACHE_SPACE": "1"},
                                         stdout=log, stderr=subprocess.STDOUT)
        self.wait_until_serving()
        self.seen = tree(self.proc.pid)

    def leftovers(self) -> list[int]:
        return leftovers(self.marker, self.seen)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_until_serving(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"sk-serve exited before serving:\n{self.output()[-4000:]}"
            try:
                with urllib.request.urlopen(self.url("/v1/models"), timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"no answer from sk-serve within {START_TIMEOUT_S} s")

    def complete(self, max_tokens: int, timeout: float = 60) -> dict:
        request = urllib.request.Request(
            self.url("/v1/completions"),
            data=json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": max_tokens, "temperature": 0,
                             "ignore_eos": True}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.load(r)

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # the watchdog ends the rest
            self.proc.wait()


@pytest.fixture(scope="module")
def trained_server(vllm_python, engine_env, tmp_path_factory):
    server = Server(vllm_python, engine_env, tmp_path_factory.mktemp("sk-serve"),
                    "--shutdown-timeout", str(DRAIN_S), max_model_len=4096)
    yield server
    server.stop()


@pytest.mark.vllm
def test_serves_a_project_model_by_its_name(trained_server):
    with urllib.request.urlopen(trained_server.url("/v1/models"), timeout=10) as r:
        assert [m["id"] for m in json.load(r)["data"]] == [MODEL]
    answer = trained_server.complete(8)
    assert answer["usage"]["completion_tokens"] == 8 and isinstance(answer["choices"][0]["text"], str)
    assert "standardkernels: ON for vllm-cpu 0.32.0 on CPU" in trained_server.output()
    assert "decoder-layer norm + MLP via sk.ops.fused_gated_mlp in LlamaDecoderLayer" in trained_server.output()


@pytest.mark.vllm
def test_sigterm_answers_long_requests_and_collects_every_report(trained_server):
    outcomes: list[tuple] = []

    def long_request():
        try:
            answer = trained_server.complete(4000, timeout=120)
            outcomes.append(("answer", answer["usage"]["completion_tokens"], time.monotonic()))
        except urllib.error.HTTPError as e:
            outcomes.append(("http", e.code, time.monotonic(), e.read().decode()))
        except OSError as e:  # no HTTP answer at all: what this test is about
            outcomes.append(("lost", repr(e), time.monotonic()))

    clients = [threading.Thread(target=long_request) for _ in range(6)]
    generating_wall = time.time()
    for c in clients:
        c.start()
    time.sleep(2)  # all six are generating: 4000 tokens each take far longer than the drain on a CPU
    stopped = time.monotonic()
    trained_server.proc.send_signal(signal.SIGTERM)
    for c in clients:
        c.join(timeout=DRAIN_S + ANSWER_MARGIN_S + 60)
    code = trained_server.proc.wait(timeout=STOP_TIMEOUT_S)
    output = trained_server.output()
    assert code == 0, output[-4000:]
    assert len(outcomes) == 6 and all(o[0] != "lost" for o in outcomes), outcomes
    assert all(o[2] - stopped <= DRAIN_S + ANSWER_MARGIN_S for o in outcomes), [o[2] - stopped for o in outcomes]
    assert all(o[1] == 4000 for o in outcomes if o[0] == "answer")
    failed = [o for o in outcomes if o[0] == "http"]
    assert failed, "no request outlasted the drain: nothing tested"
    assert all(o[1] == 500 and "The server is shutting down" in o[3] for o in failed), failed

    found = read_reports(trained_server.reports)
    # MainProcess: the API server (and vLLM's model-registry subprocess on a cold cache)
    assert {r["process"] for r in found} == {"EngineCore", "MainProcess", "VllmWorker-0"}
    (worker,) = [r for r in found if r["rank"] == 0]
    # vLLM SIGKILLed the worker at the drain deadline: this is the report it kept written while generating (its
    # last periodic write may fall just before the SIGTERM on a loaded machine: CI, 2026-12-04, 40 ms before).
    assert (trained_server.reports / f"vllm-{worker['pid']}.json").stat().st_mtime >= generating_wall
    assert sum(f["count"] for f in worker["coverage"]["fallbacks"]) > 1000  # ops of the drained decode steps
    summary = output[output.index("  fallbacks by op and reason"):].splitlines()[1:]
    # The MLPs are fused blocks (their activation inside): the worker's line says so at exit.
    assert sorted(line.split()[0] for line in summary) == ["fused_add_rms_norm", "fused_gated_mlp/rms", "rms_norm"]
    assert "    fused blocks: 4 decoder layers fused, " in output and "fallback) [fallback: CPU tensor" in output
    assert trained_server.leftovers() == []


@pytest.mark.vllm
def test_sigkill_of_sk_serve_takes_the_engine_down(vllm_python, engine_env, tmp_path):
    server = Server(vllm_python, engine_env, tmp_path)
    try:
        assert len(server.seen) >= 5  # sk-serve, watchdog, API server, EngineCore, worker (+ resource tracker)
        server.proc.kill()
        killed = time.monotonic()
        while (server.leftovers() or port_open(server.port)) and time.monotonic() - killed < 10:
            time.sleep(0.5)
        assert server.leftovers() == [], server.output()[-3000:]
        assert not port_open(server.port)
    finally:
        server.stop()


@pytest.mark.vllm
def test_strict_violation_in_a_request_fails_sk_serve(vllm_python, engine_env, tmp_path):
    server = Server(vllm_python, engine_env, tmp_path, "--strict")
    try:
        with pytest.raises(urllib.error.HTTPError) as failed:
            server.complete(8)
        assert failed.value.code == 500
        code = server.proc.wait(timeout=STOP_TIMEOUT_S)
        output = server.output()
        assert code == 3, output[-4000:]
        last = output.strip().splitlines()[-1]
        assert last.startswith("sk-serve: FAILED (exit 3): strict mode: the first fallback was in VllmWorker-0 "
                               "(pid "), output[-4000:]
        assert ": no kernel covers this call (CPU tensor: the kernels need a CUDA GPU" in last
        assert "; inputs: shapes [(" in last and last.endswith("device cpu.")
        assert server.leftovers() == []
    finally:
        server.stop()
