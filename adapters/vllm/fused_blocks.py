"""vLLM decoder layers' norm + MLP as one `sk.ops.fused_gated_mlp` call (`sk.adapters.fused_blocks` does the swap).

When: once per model, while vLLM loads it, by wrapt wrappers (installed once per process, `install`):
`BaseModelLoader.load_model` (every loader that does not override it: default/safetensors, dummy, ...) notes
the engine config, and `process_weights_after_loading` as that method calls it, i.e. after the weights are loaded:
before vLLM's post-processing each supported layer is planned, and on CPU its gate_up/down projections get
vLLM's own `_cpu_skip_gemm_dispatch` flag (vLLM would otherwise pack their weights for oneDNN and drop the
plain ones, which the op reads); after it the layer is re-checked and swapped. A loader with a `load_model` of
its own (tensorizer, IPC weight cache, ...) may post-process the model itself or not at all: its `load_model` is
wrapped too (at install, or at its first instance for a class defined later), and a model the outermost such
call returns that did not pass through the wrapped post-processing is planned and fused there, as loaded (a
layer whose weights that loader repacked keeps vLLM's path, recorded). All of that is in the worker, eager,
before vLLM's profile run, Dynamo tracing and CUDA-graph capture: the swapped modules are what Dynamo traces. The
op reads the layers' own weights (no copy: vLLM's memory profile and KV cache are stock's, and weights vLLM writes
in place later, by a reload or a weight transfer, are read as they are).
Which layers: exact classes of `support.FUSED_DECODER_LAYERS`, whose forwards `support.py` checked at start-up;
each layer is planned on its own loaded modules (`plan_layer`): quantized linears, LoRA, options the op does not
compute, unknown MLP/norm classes keep vLLM's path, recorded with the reason (an error under SK_STRICT=1).
NOTES.md says why this mechanism.
"""
from __future__ import annotations

import logging
import weakref

import torch

from sk import settings
from sk.adapters import fused_blocks
from sk.adapters.fused_blocks import FusedBlocks, Plan
from sk.adapters.vllm import support

logger = logging.getLogger("vllm.standardkernels")

# This process's fused blocks (what its report lists).
BLOCKS = FusedBlocks()
UNQUANTIZED = ("UnquantizedLinearMethod",)
BASE_LOADER = "vllm.model_executor.model_loader.base_loader"
BATCH_INVARIANT = "VLLM_BATCH_INVARIANT=1 (vLLM's batch-invariant GEMMs)"
# vLLM's sequence-parallel compile pass (tp > 1) splits the residual across ranks where an all-reduce feeds an
# RMSNorm; it does not rewrite our fused block, whose residual would then be a shard (vLLM 0.25
# compilation/passes/fusion/sequence_parallelism.py).
SEQUENCE_PARALLEL = "vLLM's sequence-parallel pass is on (compilation_config.pass_config.enable_sp)"
# The engine config of the model being loaded in this process (set by the load_model wrappers).
_loading: list = []
# The models that went through the wrapped post-processing (a loader's own load_model leaves the others to us).
_processed: weakref.WeakSet = weakref.WeakSet()


def install() -> str:
    """Wrap vLLM's model loading (once per process) so that each loaded model gets its fused blocks (and, with
    SK_ATTENTION_LINEAR=1, its attention projections routed through sk.ops.linear)."""
    fused, routed = settings.get("fused_mlp"), settings.get("attention_linear")
    if not fused:
        BLOCKS.disabled = f"{settings.env_name('fused_mlp')}=0"
    if not (fused or routed):
        return f"off ({BLOCKS.disabled})"
    import wrapt
    from vllm.model_executor.model_loader import base_loader

    if not isinstance(base_loader.process_weights_after_loading, wrapt.FunctionWrapper):
        wrapt.wrap_function_wrapper(BASE_LOADER, "BaseModelLoader.load_model", _around_load)
        wrapt.wrap_function_wrapper(BASE_LOADER, "process_weights_after_loading", _around_processing)
        # A loader class defined later (a plugin's, one registered with register_model_loader) is wrapped when
        # its first instance is made.
        wrapt.wrap_function_wrapper(BASE_LOADER, "BaseModelLoader.__init__", _around_loader_init)
    import vllm.model_executor.model_loader  # noqa: F401  (imports every loader vLLM registers)

    _wrap_own_load_models(loaders_with_own_load_model(base_loader.BaseModelLoader))
    classes = ", ".join(cls for classes in support.FUSED_DECODER_LAYERS.values() for cls in classes)
    what = f"{fused_blocks.WHAT} in {classes} (after weight loading)" if fused else f"off ({BLOCKS.disabled})"
    return what + ("; QKV and output projections -> sk.ops.linear" if routed else "")


def _config_arg(args, kwargs):
    """The `vllm_config` argument of a loader's `load_model(vllm_config, model_config, ...)`."""
    return kwargs.get("vllm_config", args[0] if args else None)


def _around_load(wrapped, instance, args, kwargs):
    _loading.append(_config_arg(args, kwargs))
    try:
        return wrapped(*args, **kwargs)
    finally:
        _loading.pop()


def loaders_with_own_load_model(base: type) -> list[type]:
    """The imported subclasses of vLLM's `BaseModelLoader` (any depth) that define `load_model` themselves."""
    found, todo = [], list(base.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        if "load_model" in cls.__dict__ and cls not in found:
            found.append(cls)
    return found


def _wrap_own_load_models(classes) -> None:
    import wrapt

    for cls in classes:
        if not isinstance(cls.__dict__["load_model"], wrapt.FunctionWrapper):
            wrapt.wrap_function_wrapper(cls, "load_model", _around_own_load)


def _around_loader_init(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    _wrap_own_load_models([cls for cls in type(instance).__mro__ if cls is not BaseModelLoader
                           and issubclass(cls, BaseModelLoader) and "load_model" in cls.__dict__])


def _around_own_load(wrapped, instance, args, kwargs):
    config = _config_arg(args, kwargs)
    _loading.append(config)
    try:
        model = wrapped(*args, **kwargs)
    finally:
        _loading.pop()
    # Inside another loader's load_model (one loader delegating to another), the outermost one decides: it may
    # still post-process the model.
    if _loading:
        return model
    if isinstance(model, torch.nn.Module) and model not in _processed:
        logger.info("standardkernels: %s.load_model returned a model without vLLM's process_weights_after_loading"
                    " wrapper seeing it: its layers are planned and fused as loaded", type(instance).__name__)
        _after_loading(model, config, plan_model(model, config) if BLOCKS.disabled is None else None)
    return model


def _around_processing(wrapped, instance, args, kwargs):
    model = kwargs.get("model", args[0] if args else None)
    config = _loading[-1] if _loading else None
    plans = plan_model(model, config) if BLOCKS.disabled is None else None
    if settings.get("attention_linear"):
        plan_projections(model)
    result = wrapped(*args, **kwargs)
    _after_loading(model, config, plans)
    return result


def _after_loading(model: torch.nn.Module, config, plans) -> None:
    """The loaded, post-processed `model`'s layers swapped (and projections routed), once per model."""
    if model is not None:
        _processed.add(model)
    if BLOCKS.disabled is None:
        fuse_model(model, plans)
    if settings.get("attention_linear"):
        route_model_projections(model, config)


def _norm_attr_of(cls: type) -> str | None:
    return support.FUSED_DECODER_LAYERS.get(cls.__module__, {}).get(cls.__name__)


def _decoder_layers(model: torch.nn.Module):
    for name, layer in model.named_modules():
        norm_attr = _norm_attr_of(type(layer))
        if norm_attr is not None:
            yield name, layer, norm_attr


def _engine_mode_miss(vllm_config, batch_invariant: bool | None) -> str | None:
    """Why this engine's settings keep every layer's projections on vLLM's path (LoRA; batch-invariant mode, by
    default VLLM_BATCH_INVARIANT), or None."""
    if vllm_config is not None and getattr(vllm_config, "lora_config", None) is not None:
        return "LoRA is enabled (vLLM wraps the linears after loading)"
    if batch_invariant is None:
        import vllm.envs

        batch_invariant = bool(vllm.envs.VLLM_BATCH_INVARIANT)
    return BATCH_INVARIANT if batch_invariant else None


def plan_model(model: torch.nn.Module, vllm_config=None, cpu: bool | None = None,
               batch_invariant: bool | None = None) -> dict[str, Plan | str]:
    """Before vLLM post-processes the loaded weights: each supported layer's plan, or why it keeps vLLM's path.

    On CPU (`cpu`: by default vLLM's platform), the planned layers' projections keep their plain weights (vLLM's
    `_cpu_skip_gemm_dispatch`). In vLLM's batch-invariant mode (`batch_invariant`: by default VLLM_BATCH_INVARIANT)
    no layer is fused: the op's fused and composed routes round differently, so a row's result would depend on
    how many rows share its batch. Nor with LoRA or vLLM's sequence-parallel pass (`SEQUENCE_PARALLEL`)."""
    if cpu is None:
        from vllm.platforms import current_platform

        cpu = current_platform.is_cpu()
    pass_config = getattr(getattr(vllm_config, "compilation_config", None), "pass_config", None)
    refuse = (_engine_mode_miss(vllm_config, batch_invariant)
              or (SEQUENCE_PARALLEL if getattr(pass_config, "enable_sp", False) else None))
    plans: dict[str, Plan | str] = {}
    for name, layer, norm_attr in _decoder_layers(model):
        plans[name] = refuse or plan_layer(layer, norm_attr)
        if isinstance(plans[name], Plan) and cpu:
            for proj in (layer.mlp.gate_up_proj, layer.mlp.down_proj):
                proj._cpu_skip_gemm_dispatch = True
    return plans


def fuse_model(model: torch.nn.Module, plans: dict[str, Plan | str] | None = None,
               blocks: FusedBlocks | None = None, all_reduce=None) -> FusedBlocks:
    """Fuse every supported decoder layer of a loaded, post-processed `model` whose plan (`plan_model`; made
    here when not given) holds, or record why not; returns `blocks`. SK_STRICT=1: a layer left is an error.
    `all_reduce` (tests): what sums down_proj's partial products across ranks, by default vLLM's own."""
    blocks = BLOCKS if blocks is None else blocks
    if all_reduce is None:
        from vllm.distributed import tensor_model_parallel_all_reduce as all_reduce

    scope = blocks.scope(model)
    for name, layer, norm_attr in _decoder_layers(model):
        cls = type(layer)
        if isinstance(getattr(layer, "mlp", None), fused_blocks.MlpComputedByNorm):
            continue  # fused when the model was loaded (vLLM post-processing it again)
        plan = plans.get(name) if plans is not None else None
        if plan is None or isinstance(plan, Plan):
            plan = plan_layer(layer, norm_attr)  # again after post-processing: the weights must still be there
        if isinstance(plan, str):
            fused_blocks.left_on_engine_path(blocks, scope + name, cls.__name__, plan, "vLLM")
            continue
        fused_blocks.fuse_layer(layer, plan, all_reduce, scope + name)
        record_for_reloading(getattr(layer, plan.norm_attr))
        blocks.fused[scope + name] = (f"{cls.__name__}: {plan.norm_attr} + mlp, norm={plan.norm}, "
                                      f"activation={plan.activation}")
    for name, layer in model.named_modules():  # vLLM's EAGLE drafts subclass the listed layers
        subclass = fused_blocks.subclass_miss(type(layer), _norm_attr_of)
        if subclass:
            fused_blocks.left_on_engine_path(blocks, scope + name, type(layer).__name__, subclass, "vLLM")
    if blocks.fused or blocks.engine_path:
        logger.info("standardkernels fused blocks: %d decoder layers fused, %d on vLLM's path%s",
                    len(blocks.fused), len(blocks.engine_path),
                    "".join(f"; {k}: {v}" for k, v in list(blocks.engine_path.items())[:3]))
    return blocks


def record_for_reloading(fused: fused_blocks.FusedNormMLP) -> None:
    """vLLM's in-place reload (`reload_weights`) rebuilds each module's parameters from metadata recorded when
    the model was built (`record_metadata_for_reloading`); the fused block is made after that, so its own (its
    norm's weight, as the norm recorded it) is recorded here, with the norm's device. Without it the reload finds
    no `<norm>.weight` to load into."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
        from vllm.model_executor.model_loader.reload.meta import capture_layer_to_meta
    except ImportError:  # a vLLM without in-place reloading
        return
    norm_module, _ = fused.sk_engine_modules
    info = get_layerwise_info(fused)
    info.restore_metadata = capture_layer_to_meta(fused)
    info.restore_device = get_layerwise_info(norm_module).restore_device


def plan_projections(model: torch.nn.Module, cpu: bool | None = None) -> None:
    """Before vLLM post-processes the loaded weights: on CPU, the attention projections that will be routed keep
    their plain weights (vLLM's `_cpu_skip_gemm_dispatch`), which sk.ops.linear reads."""
    if cpu is None:
        from vllm.platforms import current_platform

        cpu = current_platform.is_cpu()
    if not cpu:
        return
    for _, layer, _ in _decoder_layers(model):
        for name in fused_blocks.PROJECTIONS:
            proj = getattr(getattr(layer, "self_attn", None), name, None)
            if proj is not None and fused_blocks.projection_miss(name, proj, UNQUANTIZED) is None:
                proj._cpu_skip_gemm_dispatch = True


def route_model_projections(model: torch.nn.Module, vllm_config=None, blocks: FusedBlocks | None = None,
                            batch_invariant: bool | None = None) -> FusedBlocks:
    """Route every supported decoder layer's QKV and output projections through sk.ops.linear, or record why
    not (LoRA, vLLM's batch-invariant mode, quantized, no kernel for the weight); returns `blocks`."""
    blocks = BLOCKS if blocks is None else blocks
    refuse = _engine_mode_miss(vllm_config, batch_invariant)
    scope = blocks.scope(model)
    for name, layer, _ in _decoder_layers(model):
        fused_blocks.route_projections(getattr(layer, "self_attn", None), f"{scope}{name}.self_attn", UNQUANTIZED,
                                       blocks, "vLLM", refuse)
    if blocks.projections or blocks.projections_engine_path:
        logger.info("standardkernels: %d attention projections through sk.ops.linear, %d on vLLM's GEMM",
                    len(blocks.projections), len(blocks.projections_engine_path))
    return blocks


def plan_layer(layer: torch.nn.Module, norm_attr: str) -> Plan | str:
    """How to fuse this loaded decoder layer, or why it keeps vLLM's path."""
    if getattr(layer, "ada_rms_norm_t_cond", None) is not None:  # Mistral: a time-conditioned scale in between
        return "ada_rms_norm_t_cond scales the normalized hidden states before the MLP"
    norm_module, mlp = getattr(layer, norm_attr, None), getattr(layer, "mlp", None)
    if isinstance(mlp, fused_blocks.MlpComputedByNorm):
        return "already fused"
    if type(mlp).__name__ not in support.FUSED_MLP_CLASSES:
        return f"unknown MLP class {type(mlp).__qualname__}"
    norm_names = [c.__name__ for c in type(norm_module).__mro__]
    if "GemmaRMSNorm" in norm_names:
        norm = "gemma_rms"
    elif type(norm_module).__name__ == "RMSNorm":
        norm = "rms"
        if not getattr(norm_module, "has_weight", True):
            return f"{norm_attr} has no weight (has_weight=False)"
        if getattr(norm_module, "variance_size_override", None) is not None:
            return f"{norm_attr} takes the variance over part of the hidden size (var_hidden_size)"
    else:
        return f"{norm_attr} is {type(norm_module).__qualname__}, not RMSNorm/GemmaRMSNorm"
    return fused_blocks.plan_projections(norm_attr, norm, norm_module, mlp, UNQUANTIZED, mlp.down_proj.reduce_results)


def report() -> dict:
    return BLOCKS.report()
