"""The SGLang part of `sk-serve --engine sglang MODEL [sglang server arguments...]` (sk.adapters.serve drives it).

sk-serve starts the server in its watchdog's process group with SK_ADAPTERS/SK_REPORT_DIR/SK_STRICT set
(sk.adapters.serve's engine_env); this module says what to start, what to print first, what to do before
stopping, and how in-flight requests end:
  - `engine_command`: SGLang's HTTP server, `python -m sglang.launch_server --model-path MODEL ...`, with this
    interpreter (so it sees the same installation and our entry point);
  - `activation_summary`: checks the installed SGLang before anything starts (an unknown one is refused here);
  - `before_stop`: SGLang SIGKILLs its schedulers when the server stops, so their reports are not written at
    exit: GET /server_info first, which makes every scheduler write its report now (they also keep it written
    while counts change, sk.reports);
  - `drain_s`, `at_drain_deadline`: on SIGTERM SGLang drains in-flight requests with no time limit (its
    tokenizer manager checks every 5 s); sk-serve's --drain seconds after the signal, sk-serve has it abort the
    rest (POST /abort_request {"abort_all": true}), which SGLang answers as a finished response with
    finish_reason "abort" (HTTP 200, the text so far); its drain then ends and the server stops.
The admin endpoints take --admin-api-key (else --api-key) when the server was given one.
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
ABORT_REQUEST_TIMEOUT_S = 10.0


def engine_command(model: str, engine_args: list[str], drain_s: int) -> list[str]:
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", model, *engine_args]


def activation_summary(strict: bool, report_dir: str) -> str:
    from sk.adapters.sglang.hooks import LAYER_HOOKS
    from sk.adapters.sglang.support import check_installed_sglang

    from sk import settings
    from sk.adapters.sglang.fused_blocks import DECODER_LAYERS

    build = check_installed_sglang()  # refuse here, before starting anything, when SGLang is unknown
    fused = (f"decoder-layer norm + MLP via sk.ops.fused_gated_mlp in "
             f"{', '.join(c for cs in DECODER_LAYERS.values() for c in cs)} where SGLang has them"
             if settings.get("fused_mlp") else f"decoder-layer fused blocks off ({settings.env_name('fused_mlp')}=0)")
    if settings.get("attention_linear"):
        fused += "; attention QKV and output projections via sk.ops.linear"
    layers = (f"{', '.join(LAYER_HOOKS)} (forward_cuda and forward_native) via sk.ops"
              if settings.get("norm_act_layers")
              else f"norm and activation layers SGLang's own ({settings.env_name('norm_act_layers')}=0)")
    return (f"standardkernels: ON for {build}; in every scheduler process: {layers}; {fused}; "
            f"strict={'on' if strict else 'off'}; "
            f"per-process reports in {report_dir} (schedulers write theirs when /server_info is asked)")


def _server_args(engine_args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--api-key")
    parser.add_argument("--admin-api-key")
    return parser.parse_known_args(engine_args)[0]


def server_url(engine_args: list[str]) -> str:
    """Where the server listens, from the arguments passed on to SGLang."""
    known = _server_args(engine_args)
    host = "127.0.0.1" if known.host in ("0.0.0.0", "::") else known.host
    return f"http://{host}:{known.port}"


def _admin_request(engine_args: list[str], path: str, body: dict | None = None) -> urllib.request.Request:
    known = _server_args(engine_args)
    headers = {"Content-Type": "application/json"}
    if known.admin_api_key or known.api_key:
        headers["Authorization"] = f"Bearer {known.admin_api_key or known.api_key}"
    data = None if body is None else json.dumps(body).encode()
    return urllib.request.Request(f"{server_url(engine_args)}{path}", data=data, headers=headers)


def before_stop(engine_args: list[str]) -> None:
    """Have every scheduler write its report (the server may already be gone: then there is nothing to ask)."""
    try:
        with urllib.request.urlopen(_admin_request(engine_args, "/server_info"),
                                    timeout=REPORT_REQUEST_TIMEOUT_S) as response:
            json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as e:
        print(f"sk-serve: could not ask SGLang's schedulers for their reports: {e}", file=sys.stderr)


def drain_s(engine_args: list[str], default: int) -> float:
    return default


def at_drain_deadline(engine_args: list[str], drain_s: float) -> None:
    """Abort every request still running, so that SGLang's drain ends and its clients get their answer."""
    print(f"sk-serve: requests still running {drain_s:g} s after the stop signal: aborting them",
          file=sys.stderr, flush=True)
    try:
        with urllib.request.urlopen(_admin_request(engine_args, "/abort_request", {"abort_all": True}),
                                    timeout=ABORT_REQUEST_TIMEOUT_S):
            pass
    except (urllib.error.URLError, OSError) as e:
        print(f"sk-serve: could not abort SGLang's in-flight requests: {e}", file=sys.stderr)
