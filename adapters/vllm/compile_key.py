"""Our graph-shaping settings in vLLM's compile-cache key.

vLLM keys its compiled graphs (`torch_compile_cache/`, its AOT artifacts) by `VllmConfig.compute_hash()`, its
own environment factors and the traced files' contents. Our settings that change what the model calls
(`sk.settings.ENGINE_GRAPH_SETTINGS`: SK_FUSED_MLP, SK_ATTENTION_LINEAR, SK_NORM_ACT_LAYERS) are none of those,
so an engine started with other values than the last one loaded that one's graph: on an H100, an engine without
the routed projections ran `sk.ops.linear` from the graph of one with them (results/h100/engines/README.md,
2026-12-06). Each process of an engine with the adapter folds their values into the config's hash.
"""
from __future__ import annotations

import hashlib

from sk import settings


def graph_factors() -> str:
    """This process's values of the settings that change the compiled model."""
    return ",".join(f"{name}={settings.get(name)!r}" for name in settings.ENGINE_GRAPH_SETTINGS)


def _around_compute_hash(wrapped, instance, args, kwargs):
    base = wrapped(*args, **kwargs)
    return hashlib.sha256(f"{base}|standardkernels:{graph_factors()}".encode()).hexdigest()[:len(base)]


def install() -> None:
    """Wrap `VllmConfig.compute_hash` (once per process) so that the hash covers `graph_factors()`."""
    import wrapt
    from vllm.config import VllmConfig

    if not isinstance(VllmConfig.__dict__["compute_hash"], wrapt.FunctionWrapper):
        wrapt.wrap_function_wrapper(VllmConfig, "compute_hash", _around_compute_hash)
