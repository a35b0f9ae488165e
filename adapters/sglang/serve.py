"""The SGLang part of `sk-serve --engine sglang MODEL [sglang server arguments...]` (sk.adapters.serve drives it).

sk-serve starts the server in its own process group with SK_ADAPTERS/SK_REPORT_DIR/SK_STRICT set (sk.adapters.serve's
engine_env); this module says what to start, what to print first, and what to do before stopping:
  - `engine_command`: SGLang's HTTP server, `python -m sglang.launch_server --model-path MODEL ...`, with this
    interpreter (so it sees the same installation and our entry point);
  - `activation_summary`: checks the installed SGLang before anything starts (an unknown one is refused here);
  - `before_stop`: SGLang SIGKILLs its schedulers when the server stops, so their reports cannot be written at
    exit: GET /server_info first, which makes every scheduler write its report into the report directory.
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

# SGLang's ServerArgs defaults for the HTTP server.
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 30000
REPORT_REQUEST_TIMEOUT_S = 30.0


def engine_command(model: str, engine_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", model, *engine_args]


def activation_summary(strict: bool, report_dir: str) -> str:
    from sk.adapters.sglang.hooks import LAYER_HOOKS
    from sk.adapters.sglang.support import check_installed_sglang

    build = check_installed_sglang()  # refuse here, before starting anything, when SGLang is unknown
    return (f"standardkernels: ON for {build}; in every scheduler process: {', '.join(LAYER_HOOKS)} "
            f"(forward_cuda and forward_native) via sk.ops; strict={'on' if strict else 'off'}; "
            f"per-process reports in {report_dir} (schedulers write theirs when /server_info is asked)")


def server_url(engine_args: list[str]) -> str:
    """Where the server listens, from the arguments passed on to SGLang."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    known, _ = parser.parse_known_args(engine_args)
    host = "127.0.0.1" if known.host in ("0.0.0.0", "::") else known.host
    return f"http://{host}:{known.port}"


def before_stop(engine_args: list[str]) -> None:
    """Have every scheduler write its report (the server may already be gone: then there is nothing to ask)."""
    try:
        with urllib.request.urlopen(f"{server_url(engine_args)}/server_info",
                                    timeout=REPORT_REQUEST_TIMEOUT_S) as response:
            json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as e:
        print(f"sk-serve: could not ask SGLang's schedulers for their reports: {e}", file=sys.stderr)
