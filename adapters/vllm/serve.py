"""The vLLM part of `sk-serve --engine vllm MODEL [vllm serve arguments...]` (sk.adapters.serve drives it).

Same interface as sk.adapters.sglang.serve: what to start, what to print first, what to do before stopping,
how long in-flight requests drain and what happens to those still running then.
"""
from __future__ import annotations

import argparse
import sys


def engine_command(model: str, engine_args: list[str], drain_s: int) -> list[str]:
    # vLLM's default (--shutdown-timeout 0) SIGKILLs its engine core and workers at once; sk-serve's drain
    # instead ("drain" mode), unless the user gave one.
    if not any(a.split("=")[0] == "--shutdown-timeout" for a in engine_args):
        engine_args = [*engine_args, "--shutdown-timeout", str(drain_s)]
    # `vllm serve` through sk.adapters.vllm.server (requests left at shutdown get an HTTP error), with this
    # interpreter, so that the engine sees the same installation (and our entry points) as sk-serve.
    return [sys.executable, "-m", "sk.adapters.vllm.server", "serve", model, *engine_args]


def activation_summary(strict: bool, report_dir: str) -> str:
    from sk.adapters.vllm.support import check_installed_vllm

    from sk import settings
    from sk.adapters.vllm.support import FUSED_DECODER_LAYERS

    build = check_installed_vllm()  # refuse here, before starting anything, when the engine is unknown
    classes = ", ".join(c for cs in FUSED_DECODER_LAYERS.values() for c in cs)
    fused = (f"decoder-layer norm + MLP via sk.ops.fused_gated_mlp in {classes}" if settings.get("fused_mlp")
             else f"decoder-layer fused blocks off ({settings.env_name('fused_mlp')}=0)")
    if settings.get("attention_linear"):
        fused += "; attention QKV and output projections via sk.ops.linear"
    layers = ("RMSNorm (plain and fused-residual) via the vllm.ir provider 'sk', GemmaRMSNorm, SiluAndMul, "
              "GeluAndMul via sk.ops" if settings.get("norm_act_layers")
              else f"norm and activation layers vLLM's own ({settings.env_name('norm_act_layers')}=0)")
    return (
        f"standardkernels: ON for {build}; in every engine process: {layers}; {fused}; "
        f"strict={'on' if strict else 'off'}; per-process reports in {report_dir}"
    )


def before_stop(engine_args: list[str]) -> None:
    """Nothing to do: vLLM's processes keep their reports written (sk.reports)."""


def drain_s(engine_args: list[str], default: int) -> float:
    """vLLM's own drain time after the stop signal: --shutdown-timeout when given, else sk-serve's."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--shutdown-timeout", type=float, default=default)
    return parser.parse_known_args(engine_args)[0].shutdown_timeout


def at_drain_deadline(engine_args: list[str], drain_s: float) -> None:
    """Nothing to do: at its drain deadline vLLM stops its engine and our API server fails what is left."""
