"""sk-serve --engine vllm: serves /v1/completions on 127.0.0.1 with our layers active, reports activation and
per-process counts, and on SIGINT stops with every process it started."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from sk.reports import model_process_reports, read_reports

START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_with_marker(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (every process sk-serve started inherits it)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass  # gone, or not ours to read
    return found


def wait_until_serving(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert server.poll() is None, "sk-serve exited before serving"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"no answer from {url} within {START_TIMEOUT_S} s")


@pytest.mark.vllm
def test_sk_serve_vllm(vllm_python, engine_env, tmp_path):
    model = subprocess.run([vllm_python, "-c", "import sk.models; print(sk.models.tiny_model())"],
                           env=engine_env, capture_output=True, text=True, check=True).stdout.strip()
    port, marker = free_port(), f"sk-serve-test-{uuid.uuid4().hex}"
    env = {**engine_env, "SK_SERVE_TEST_MARKER": marker, "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = tmp_path / "sk-serve.log"
    command = [str(Path(vllm_python).parent / "sk-serve"), "--engine", "vllm", model,
               "--report-dir", str(tmp_path / "reports"),
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
               "--max-model-len", "512"]
    with open(log, "w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/v1/models", server)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps({"model": model, "prompt": "Hello", "max_tokens": 8, "temperature": 0,
                             "ignore_eos": True}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            answer = json.load(r)
        assert answer["usage"]["completion_tokens"] == 8 and isinstance(answer["choices"][0]["text"], str)
    finally:
        server.send_signal(signal.SIGINT)
        code = server.wait(timeout=120)
    output = log.read_text()
    assert code == 0, output[-4000:]
    assert "standardkernels: ON for vllm-cpu 0.32.0 on CPU" in output
    assert "sk-serve: standardkernels reports" in output
    (worker,) = model_process_reports(read_reports(tmp_path / "reports"))
    assert sum(f["count"] for f in worker["coverage"]["fallbacks"]) > 0  # our ops ran (references, on CPU)
    time.sleep(1)
    assert processes_with_marker(marker) == []
