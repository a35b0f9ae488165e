"""The vLLM part of `sk-serve --engine vllm MODEL [vllm serve arguments...]` (sk.adapters.serve drives it).

Same interface as sk.adapters.sglang.serve: what to start, what to print first, what to do before stopping.
"""
from __future__ import annotations

import sys

# vLLM's default shutdown (--shutdown-timeout 0) SIGKILLs its engine core and workers at once, so the workers
# could not write their reports; unless told otherwise, give them this long to stop.
ENGINE_SHUTDOWN_S = 10


def engine_command(model: str, engine_args: list[str]) -> list[str]:
    if not any(a.split("=")[0] == "--shutdown-timeout" for a in engine_args):
        engine_args = [*engine_args, "--shutdown-timeout", str(ENGINE_SHUTDOWN_S)]
    # Same interpreter, so the engine sees the same installation (and our entry points) as sk-serve.
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, *engine_args]


def activation_summary(strict: bool, report_dir: str) -> str:
    from sk.adapters.vllm.support import check_installed_vllm

    build = check_installed_vllm()  # refuse here, before starting anything, when the engine is unknown
    return (
        f"standardkernels: ON for {build}; in every engine process: RMSNorm (plain and fused-residual) via the "
        f"vllm.ir provider 'sk', GemmaRMSNorm, SiluAndMul, GeluAndMul via sk.ops; "
        f"strict={'on' if strict else 'off'}; per-process reports in {report_dir}"
    )


def before_stop(engine_args: list[str]) -> None:
    """Nothing to do: vLLM's workers write their reports as they exit."""
