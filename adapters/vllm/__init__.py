"""Standard Kernels inside vLLM: a `vllm.general_plugins` entry point that swaps vLLM's layers for our ops.

vLLM calls `register()` in every process it starts (front end, engine core, each worker) before building any
model. It does nothing unless the adapter was switched on with SK_ADAPTERS=vllm (see `activate()`, sk-serve),
so installing standardkernels alone leaves vLLM stock. Importing this module imports neither vLLM nor CUDA.

Once on, in each process:
  - RMSNorm (plain and fused-residual, in place): our "sk" provider for vllm.ir rms_norm/fused_add_rms_norm;
  - GemmaRMSNorm, SiluAndMul, GeluAndMul (erf and tanh): subclasses whose every forward path calls sk.ops
    (SK_NORM_ACT_LAYERS=0 leaves these and RMSNorm to vLLM);
  - decoder layers of the Llama and Gemma families (after weight loading): norm + MLP as one
    sk.ops.fused_gated_mlp call (`fused_blocks.py`; SK_FUSED_MLP=0 leaves them to the layers above);
  - vLLM's compile-cache key covers the settings that change the compiled model (`compile_key.py`);
  - with SK_REPORT_DIR set, a JSON report (replaced layers, kernel calls, fallbacks) is written at exit.
SK_STRICT=1 (sk-serve --strict) turns any fallback inside the engine into sk.CoverageError.
"""
from __future__ import annotations

import logging
import multiprocessing
import re
import sys

from sk import reports, settings

ENGINE = "vllm"
# Under vLLM's logger namespace so that its handler prints our line with the process prefix in every process.
logger = logging.getLogger("vllm.standardkernels")

# The report's `replaced` entry of the fused decoder blocks.
FUSED_BLOCKS_KEY = "decoder layers (norm + MLP)"
# Set by the first effective register() in this process.
_registration: dict | None = None


def activate() -> None:
    """Switch the adapter on for engines created from now on in this process and its children."""
    reports.activate(ENGINE)


def register() -> None:
    """vLLM's plugin entry point: replace the layers in this process when the adapter is switched on."""
    global _registration
    if _registration is not None or not reports.is_active(ENGINE):
        return
    from sk.adapters.vllm import compile_key, fused_blocks
    from sk.adapters.vllm.ir_providers import PROVIDER, register_providers
    from sk.adapters.vllm.layers import register_layers
    from sk.adapters.vllm.support import check_installed_vllm

    build = check_installed_vllm()
    replaced = {}
    if settings.get("norm_act_layers"):
        replaced.update(register_layers())
        for op in register_providers():
            replaced[f"vllm.ir.ops.{op}"] = f"provider {PROVIDER!r} (first in IR op priority)"
        _forget_cached_gemma_activation()
    replaced[FUSED_BLOCKS_KEY] = fused_blocks.install()
    compile_key.install()
    _registration = {"vllm": build, "replaced": replaced}
    reports.set_report_builder(report)
    reports.keep_report_written(ENGINE, report)
    logger.info("standardkernels active in %s: %s", build, ", ".join(replaced))


def report(_worker=None) -> dict:
    """This process's adapter report (replaced layers, kernel calls, fallbacks); see sk.reports.

    On request from a running engine: `llm.collective_rpc(sk.reports.current_report)` returns one per worker
    (vLLM passes the worker as the first argument, which the report does not need; shipping a function to
    the workers needs VLLM_ALLOW_INSECURE_SERIALIZATION=1).
    """
    if _registration is None:
        return reports.process_report(ENGINE, {}, _tensor_parallel_rank(), {"active": False})
    from sk.adapters.vllm import fused_blocks

    return reports.process_report(ENGINE, _registration["replaced"], _tensor_parallel_rank(),
                                  {"active": True, "vllm": _registration["vllm"]},
                                  fused_blocks=fused_blocks.report())


def _tensor_parallel_rank() -> int | None:
    """The tensor-parallel rank of a process that runs the model; None for the others (front end, engine core)."""
    import sk
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return parallel_state.get_tensor_model_parallel_rank()
    # At exit vLLM has torn its process groups down; it names each worker process VllmWorker-<rank>.
    match = re.fullmatch(r"VllmWorker-(\d+)", multiprocessing.current_process().name)
    if match:
        return int(match.group(1))
    # Without worker processes (one GPU: the engine core runs the model itself) the process that ran our ops
    # is the only rank.
    coverage = sk.coverage.report()
    return 0 if coverage["kernel_calls"] or coverage["fallbacks"] else None


def _forget_cached_gemma_activation() -> None:
    # Gemma builds its activation once per process (functools.cache): one built before we registered is stock.
    gemma = sys.modules.get("vllm.model_executor.models.gemma")
    if gemma is not None:
        gemma._get_gemma_act_fn.cache_clear()
