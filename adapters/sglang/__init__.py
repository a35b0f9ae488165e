"""Standard Kernels inside SGLang: `import sk.adapters.sglang`, then build an `sglang.Engine` as usual.

Importing this package switches the adapter on: it sets SK_ADAPTERS=sglang in this process's environment, which
SGLang's spawned scheduler/TP processes inherit. In each SGLang process, `load_plugins()` calls our
`sglang.srt.plugins` entry point (`sk.adapters.sglang_plugin:register`), which, when switched on, calls
`register()` below before any model is built:
  - the installed SGLang is checked (version, and the structure the hooks rely on) and anything else refused;
  - AROUND hooks in SGLang's HookRegistry route forward_cuda and forward_native of RMSNorm, GemmaRMSNorm,
    SiluAndMul and GeluAndMul to sk.ops (see `hooks.py`; SK_NORM_ACT_LAYERS=0 leaves them SGLang's);
  - AFTER hooks on the Llama/Qwen/Gemma decoder layers' __init__ make each layer's norm + MLP one
    sk.ops.fused_gated_mlp call (`fused_blocks.py`; SK_FUSED_MLP=0 leaves them to the hooked layers above);
  - an AFTER hook on Scheduler.get_internal_state makes `Engine.get_server_info()` (HTTP: GET /server_info)
    write each scheduler's report into $SK_REPORT_DIR and return it under "standardkernels". SGLang kills its
    schedulers at shutdown, so a report written at exit never comes from them; other processes also write one
    at exit.
Importing imports neither SGLang nor CUDA. SK_STRICT=1 turns any fallback into sk.CoverageError, and a refused
SGLang into an exit of the process instead of a stock engine (SGLang logs and skips plugins that raise).
"""
from __future__ import annotations

import logging

from sk import reports

ENGINE = "sglang"
REPORT_KEY = "standardkernels"  # the key of our report in each scheduler's internal state
logger = logging.getLogger(__name__)

# Set by the first register() in this process: what was replaced, or why SGLang was refused.
_registration: dict | None = None


def activate() -> None:
    """Switch the adapter on in this process and every process started from it later (done at import)."""
    reports.activate(ENGINE)


activate()


def register() -> None:
    """Check the installed SGLang and hook its layers in this process (once); called through the entry point."""
    global _registration
    if _registration is not None:
        return
    import sk
    from sk.adapters.sglang.hooks import install_hooks
    from sk.adapters.sglang.support import UnsupportedSglangError, check_installed_sglang

    try:
        build = check_installed_sglang()
    except UnsupportedSglangError as e:
        _registration = {"refused": str(e)}
        reports.keep_report_written(ENGINE, report)
        logger.error("%s", e)
        if sk.coverage.is_strict():
            raise SystemExit(f"standardkernels (SK_STRICT=1): {e}") from e
        raise
    _registration = {"sglang": build, "replaced": install_hooks(report_to_caller)}
    reports.set_report_builder(report)
    reports.keep_report_written(ENGINE, report)
    logger.info("standardkernels active in %s: %s", build, ", ".join(_registration["replaced"]))


def report() -> dict:
    """This process's adapter report (replaced layers, kernel calls, fallbacks); see sk.reports."""
    registration = _registration or {}
    extra = {"active": "replaced" in registration, "process_title": _process_title()}
    extra.update({k: v for k, v in registration.items() if k in ("sglang", "refused")})
    fused = None
    if "replaced" in registration:
        from sk.adapters.sglang import fused_blocks

        fused = fused_blocks.report()
    return reports.process_report(ENGINE, registration.get("replaced", {}), _tensor_parallel_rank(), extra,
                                  fused_blocks=fused)


def report_to_caller(internal_state: dict) -> None:
    """Write this process's report to $SK_REPORT_DIR and add it to the scheduler's answer to get_internal_state."""
    data = report()
    reports.write_report(ENGINE, data)
    internal_state[REPORT_KEY] = data


def _tensor_parallel_rank() -> int | None:
    from sglang.srt.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return parallel_state.get_tensor_model_parallel_rank()
    return None


def _process_title() -> str:
    # SGLang titles its processes ("sglang::scheduler", "sglang::scheduler_TP1", ...): that is how reports
    # from schedulers are told apart from the launcher's.
    import setproctitle

    return setproctitle.getproctitle()
