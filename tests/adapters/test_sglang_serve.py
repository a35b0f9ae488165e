"""The SGLang adapter's parts that need no SGLang: the import switch, the inert entry point, and the sk-serve
pieces (command line, server address and key, asking the schedulers for their reports before stopping; the
stop itself, its drain deadline included, runs against a stand-in server in test_serve_lifecycle.py).

SGLang's server cannot start on a CPU machine; `sk-serve --engine sglang` end to end is an H200 check.
"""
import http.server
import json
import subprocess
import sys
import threading

import pytest


def run_python(code: str, env: dict) -> None:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_import_switches_on_without_importing_sglang(engine_env):
    run_python("import os, sys, torch, sk.adapters.sglang\n"
               "assert os.environ['SK_ADAPTERS'] == 'sglang', os.environ['SK_ADAPTERS']\n"
               "assert 'sglang' not in sys.modules and not torch.cuda.is_initialized()\n"
               "import sk.adapters.sglang.serve\n"
               "assert 'sglang' not in sys.modules\n", engine_env)


def test_inactive_entry_point_imports_nothing(engine_env):
    run_python("import sys, sk.adapters.sglang_plugin as plugin\n"
               "plugin.register()\n"
               "assert 'sk.adapters.sglang' not in sys.modules and 'sglang' not in sys.modules\n", engine_env)


@pytest.fixture
def serve(monkeypatch):
    # Importing the package switches the adapter on in this process: keep that inside the test.
    monkeypatch.setenv("SK_ADAPTERS", "")
    import sk.adapters.sglang.serve as serve

    return serve


def test_engine_command(serve):
    assert serve.engine_command("/m", ["--port", "31000", "--tp-size", "2"], 10) == [
        sys.executable, "-m", "sglang.launch_server", "--model-path", "/m", "--port", "31000", "--tp-size", "2"]


@pytest.mark.parametrize("args, key", [([], None), (["--api-key", "k1"], "Bearer k1"),
                                       (["--api-key=k1", "--admin-api-key", "k2"], "Bearer k2")])
def test_admin_requests_carry_the_servers_key(serve, args, key):
    assert serve._admin_request(args, "/abort_request", {}).get_header("Authorization") == key


@pytest.mark.parametrize("args, url", [
    ([], "http://127.0.0.1:30000"),
    (["--host", "0.0.0.0", "--port", "31234", "--tp-size", "2"], "http://127.0.0.1:31234"),
    (["--port=31235", "--host=localhost"], "http://localhost:31235"),
])
def test_server_url(serve, args, url):
    assert serve.server_url(args) == url


def test_before_stop_asks_for_server_info(serve, capsys):
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            body = json.dumps({"internal_states": [{}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        serve.before_stop(["--port", str(server.server_port)])
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["/server_info"]
    port = server.server_port
    serve.before_stop(["--port", str(port)])  # nobody listens any more: a message, not an exception
    assert "could not ask SGLang's schedulers" in capsys.readouterr().err


def test_sk_serve_without_sglang_says_so(capsys):
    import importlib.util

    from sk.adapters.serve import main

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed in this Python")
    assert main(["--engine", "sglang", "sk-trained/llama"]) == 2
    assert "sglang is not importable in this Python" in capsys.readouterr().err
