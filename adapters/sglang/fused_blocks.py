"""SGLang decoder layers' norm + MLP as one `sk.ops.fused_gated_mlp` call (`sk.adapters.fused_blocks` does the swap).

When: as each decoder layer is built, by an AFTER hook on its class's `__init__` in SGLang's HookRegistry
(installed with the other hooks, in every scheduler before the model is built). The layer's own modules are
planned there (`plan_layer`): SGLang has built its linears with their quant_method and tensor-parallel shard
sizes; the weights are loaded later, into the same Parameter objects the fused block reads at each call.
Once ModelRunner.load_model has loaded and processed the weights, an AFTER hook puts back on SGLang's path each
fused layer whose projections SGLang repacked (`check_loaded_model`). The op reads the layers' own weights: no
copy (SGLang's memory pools are stock's size), and weights SGLang's updates write in place are read as they are.

Which layers: `DECODER_LAYERS`, where the installed class's forward has `<norm>(hidden_states, residual)` then
`mlp(hidden_states)`, or (Qwen3) `layer_communicator.prepare_mlp(hidden_states, residual, ...)` then
`mlp(hidden_states, ...)` (checked once per class, `layout_miss`). A LayerCommunicator is fused only on its
plain path (one attention rank: `prepare_mlp` calls the norm and nothing else, `postprocess_layer` passes the
pair through), with the stand-in given to the communicator too; its communicating modes (attention tensor or
data parallelism, all-reduce fusion, scattered residuals), quantized linears, options the op does not compute
or unknown MLP/norm classes keep SGLang's path, recorded with the reason (an error under SK_STRICT=1). SGLang
logs and skips plugins that raise, so a layout we did not read is a per-layer record here, not a refusal of the
adapter.
"""
from __future__ import annotations

import functools
import gc
import importlib
import weakref

import torch

from sk import settings
from sk.adapters import fused_blocks
from sk.adapters.fused_blocks import FusedBlocks, Plan

BLOCKS = FusedBlocks()
UNQUANTIZED = ("UnquantizedLinearMethod",)
# module -> decoder layer class -> the norm fused with `mlp`.
DECODER_LAYERS = {
    "sglang.srt.models.llama": {"LlamaDecoderLayer": "post_attention_layernorm"},
    "sglang.srt.models.qwen2": {"Qwen2DecoderLayer": "post_attention_layernorm"},
    "sglang.srt.models.qwen3": {"Qwen3DecoderLayer": "post_attention_layernorm"},
    "sglang.srt.models.gemma": {"GemmaDecoderLayer": "post_attention_layernorm"},
    "sglang.srt.models.gemma2": {"Gemma2DecoderLayer": "pre_feedforward_layernorm"},
    "sglang.srt.models.gemma3_causal": {"Gemma3DecoderLayer": "pre_feedforward_layernorm"},
}
MLP_CLASSES = ("LlamaMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP", "Gemma3MLP")
# SGLang's names of the projections our kernels run (LoRA names its targets so: `_lora_miss`).
MLP_PROJECTIONS = ("gate_up_proj", "down_proj")
ATTENTION_PROJECTIONS = ("qkv_proj", "o_proj")


def hooks() -> dict[str, tuple]:
    """HookRegistry targets of the installed decoder classes: dotted `Class.__init__` -> (AFTER hook, class)."""
    if not settings.get("fused_mlp"):
        BLOCKS.disabled = f"{settings.env_name('fused_mlp')}=0"
    if BLOCKS.disabled and not settings.get("attention_linear"):
        return {}
    found = {}
    for module_name, classes in DECODER_LAYERS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for cls_name, norm_attr in classes.items():
            cls = getattr(module, cls_name, None)
            if isinstance(cls, type) and "__init__" in cls.__dict__:
                found[f"{module_name}.{cls_name}.__init__"] = (_after_init(norm_attr), cls)
    return found


def summary(installed: dict[str, tuple]) -> str:
    classes = ", ".join(cls.__name__ for _, cls in installed.values())
    what = f"off ({BLOCKS.disabled})" if BLOCKS.disabled else f"{fused_blocks.WHAT} in {classes} (at construction)"
    return what + ("; QKV and output projections -> sk.ops.linear" if settings.get("attention_linear") else "")


def _after_init(norm_attr: str):
    def after_init(result, layer, *args, **kwargs):
        layer_id = kwargs.get("layer_id", getattr(layer, "layer_id", "?"))
        name = kwargs.get("prefix") or f"{type(layer).__name__}[{layer_id}]"
        if BLOCKS.disabled is None:
            fuse_layer(layer, norm_attr, name)
        if settings.get("attention_linear"):
            route_layer_projections(layer, name)
        return None

    return after_init


def check_loaded_model(model: torch.nn.Module, blocks: FusedBlocks | None = None) -> int:
    """Once the weights are loaded and processed: each fused layer whose projections SGLang repacked goes back to
    SGLang's path; a subclass of a listed layer (another model's, left alone at construction) is recorded as on
    SGLang's path; fused layers that the model dropped while it was built (e.g. Ministral3's, built by the Llama
    base and then replaced) leave the report. All in `blocks` (default BLOCKS). Returns how many fused layers stay
    fused."""
    blocks = BLOCKS if blocks is None else blocks
    _forget_dropped_layers(blocks)
    kept = 0
    for name, layer in list(model.named_modules()):
        cls = type(layer)
        subclass = fused_blocks.subclass_miss(cls, _norm_attr_of)
        if subclass:
            fused_blocks.left_on_engine_path(blocks, name, cls.__name__, subclass, "SGLang")
            continue
        norm_attr = _norm_attr_of(cls)
        fused = getattr(layer, norm_attr, None) if norm_attr else None
        if not isinstance(fused, fused_blocks.FusedNormMLP):
            continue
        miss = fused_blocks.repacked_miss(layer)
        if miss:
            fused_blocks.unfuse_layer(layer, norm_attr)
            communicator = getattr(layer, "layer_communicator", None)
            if communicator is not None:
                communicator.post_attention_layernorm = getattr(layer, norm_attr)
            blocks.fused.pop(fused.sk_layer, None)
            fused_blocks.left_on_engine_path(blocks, fused.sk_layer, type(layer).__name__, miss, "SGLang")
            continue
        kept += 1
    return kept


def after_load_model(result, runner, *args, **kwargs):
    """AFTER hook of SGLang's ModelRunner.load_model (see `check_loaded_model`)."""
    model = getattr(runner, "model", None)
    if model is not None and BLOCKS.disabled is None:
        check_loaded_model(model)
    return None


def route_layer_projections(layer: torch.nn.Module, name: str, blocks: FusedBlocks | None = None) -> FusedBlocks:
    """Route a freshly built decoder layer's QKV and output projections through sk.ops.linear (their weights are
    allocated on the device, loaded later into the same Parameters), or record why not."""
    blocks = BLOCKS if blocks is None else blocks
    if _norm_attr_of(type(layer)):
        fused_blocks.route_projections(getattr(layer, "self_attn", None), f"{name}.self_attn", UNQUANTIZED, blocks,
                                       "SGLang", engine_mode_miss(ATTENTION_PROJECTIONS))
    return blocks


# The layers fused at construction, by name, until `check_loaded_model` finds them gone or kept.
_built: list[tuple[str, weakref.ref]] = []


def _forget_dropped_layers(blocks: FusedBlocks) -> None:
    """Drop from `blocks.fused` the layers fused at construction that no longer exist (a name another live layer
    holds, e.g. a draft model's, stays)."""
    gc.collect()
    live = {name for name, ref in _built if ref() is not None}
    for name, ref in list(_built):
        if ref() is None:
            _built.remove((name, ref))
            if name not in live:
                blocks.fused.pop(name, None)


def _norm_attr_of(cls: type) -> str | None:
    """The norm fused with the MLP in this decoder layer class (one of `DECODER_LAYERS` itself, not a subclass
    from another module: e.g. SGLang's EAGLE-3 draft layer subclasses LlamaDecoderLayer and replaces its MLP after
    the base __init__, where the hook fuses), or None."""
    return DECODER_LAYERS.get(cls.__module__, {}).get(cls.__name__)


def fuse_layer(layer: torch.nn.Module, norm_attr: str, name: str, blocks: FusedBlocks | None = None,
               all_reduce=None) -> FusedBlocks:
    """Fuse one freshly built decoder layer, or record why it keeps SGLang's path (in `blocks`, default BLOCKS)."""
    blocks = BLOCKS if blocks is None else blocks
    cls = type(layer)
    if _norm_attr_of(cls) is None:
        return blocks  # a subclass (another model's layer, built through the base's __init__): left alone
    plan = plan_layer(layer, norm_attr)
    if isinstance(plan, str):
        fused_blocks.left_on_engine_path(blocks, name, cls.__name__, plan, "SGLang")
        return blocks
    if all_reduce is None:
        from sglang.srt.distributed import tensor_model_parallel_all_reduce as all_reduce
    fused_blocks.fuse_layer(layer, plan, all_reduce, name)
    _built.append((name, weakref.ref(layer)))
    communicator = getattr(layer, "layer_communicator", None)
    if communicator is not None:  # prepare_mlp calls the communicator's norm, not the layer's attribute
        communicator.post_attention_layernorm = getattr(layer, norm_attr)
    blocks.fused[name] = f"{cls.__name__}: {norm_attr} + mlp, norm={plan.norm}, activation={plan.activation}"
    return blocks


# The communicator's plain path (SGLang's names): the norm called as it is, the (hidden, residual) pair passed on.
PLAIN_COMMUNICATION = ("CommunicateWithAllReduceAndLayerNormFn._simple", "CommunicateSummableTensorPairFn._trivial")


@functools.lru_cache(maxsize=None)
def layout_miss(cls: type, norm_attr: str) -> str | None:
    """Why `cls.forward` is not a layout the fused block was written for, or None."""
    # Gemma-2/3: SGLang's post_feedforward_layernorm follows, on the MLP's output: ours returns that output.
    if fused_blocks.norm_then_mlp(cls.forward, norm_attr, then_return=False):
        return None
    if norm_attr == "post_attention_layernorm" and _communicator_then_mlp(cls.forward):
        return None
    return (f"{cls.__name__}.forward does not call {norm_attr}(hidden_states, residual) (or "
            f"layer_communicator.prepare_mlp) then mlp(hidden_states) (the layouts the fused block was written for)")


def _communicator_then_mlp(forward) -> bool:
    import re

    source = fused_blocks.source_text(forward)
    return re.search(r"hidden_states, residual = self\.layer_communicator\.prepare_mlp\( ?hidden_states, residual, "
                     r"forward_batch\b.*?\) hidden_states = self\.mlp\(hidden_states\b", source) is not None


def _communicator_miss(layer: torch.nn.Module, norm_attr: str) -> str | None:
    communicator = getattr(layer, "layer_communicator", None)
    if communicator is None:
        return None
    fns = (getattr(communicator, "_communicate_with_all_reduce_and_layer_norm_fn", None),
           getattr(communicator, "_communicate_summable_tensor_pair_fn", None))
    names = tuple(getattr(getattr(fn, "func", fn), "__qualname__", None) for fn in fns)
    if type(communicator).__name__ != "LayerCommunicator" or names != PLAIN_COMMUNICATION:
        return ("SGLang's LayerCommunicator communicates around the norm here (attention tensor/data parallelism, "
                f"all-reduce fusion or scattered residuals: {', '.join(map(str, names))}); only its plain path "
                "is fused")
    if getattr(communicator, "post_attention_layernorm", None) is not getattr(layer, norm_attr, None):
        return f"the LayerCommunicator's post_attention_layernorm is not the layer's {norm_attr}"
    return None


@functools.lru_cache(maxsize=None)
def _mlp_miss(cls: type) -> str | None:
    if cls.__name__ not in MLP_CLASSES:
        return f"unknown MLP class {cls.__qualname__}"
    if not fused_blocks.mlp_is_gate_up_act_down(cls.forward):
        return f"{cls.__qualname__}.forward is not gate_up_proj -> act_fn -> down_proj"
    return None


def _lora_miss(args, modules: tuple[str, ...]) -> str | None:
    """Why LoRA rules out our kernels on `modules` (SGLang's normalized names): SGLang wraps each module its
    LoRA targets after loading. Only an explicit `--lora-target-modules` (adapters must stay within it) that
    names none of `modules` leaves them alone; without one, the targets come from the adapters' configs, which
    are read later (and may name any module)."""
    if not (getattr(args, "enable_lora", False) or getattr(args, "lora_paths", None)):
        return None
    targets = getattr(args, "lora_target_modules", None)
    if targets:
        try:
            from sglang.srt.lora.utils import get_normalized_target_modules

            named = get_normalized_target_modules(targets)
        except (ImportError, ValueError):
            named = {"all"}
        hit = [m for m in modules if m in named or "all" in named]
        if not hit:
            return None
        return f"LoRA targets {', '.join(hit)} (--lora-target-modules; SGLang wraps them after loading)"
    return (f"LoRA is enabled without --lora-target-modules (SGLang wraps the modules its adapters target after "
            f"loading, which may include {'/'.join(modules)}: pass --lora-target-modules without them to keep them "
            f"on our kernels)")


def engine_mode_miss(modules: tuple[str, ...] = MLP_PROJECTIONS) -> str | None:
    """Why this SGLang server's settings rule out our kernels on the layer's `modules` (LoRA targeting them,
    torchao, deterministic inference), or None (also where no server's settings are published: a layer built
    outside an engine)."""
    try:
        from sglang.srt.server_args import get_global_server_args

        args = get_global_server_args()
    except (ImportError, ValueError):  # ValueError: "Global server args is not set yet!"
        args = None
    lora = None if args is None else _lora_miss(args, modules)
    if lora:
        return lora
    if args is not None and getattr(args, "torchao_config", None):
        return (f"torchao quantization (--torchao-config {args.torchao_config}: SGLang swaps the linears' weights "
                f"for quantized tensors after loading)")
    if args is not None and getattr(args, "enable_deterministic_inference", False):
        return ("deterministic inference (SGLang's batch-invariant mode: the op's fused and composed routes round "
                "differently, so a row's result would depend on its batch)")
    return None


def plan_layer(layer: torch.nn.Module, norm_attr: str) -> Plan | str:
    """How to fuse this SGLang decoder layer, or why it keeps SGLang's path."""
    miss = engine_mode_miss() or layout_miss(type(layer), norm_attr) or _communicator_miss(layer, norm_attr)
    if miss:
        return miss
    norm_module, mlp = getattr(layer, norm_attr, None), getattr(layer, "mlp", None)
    miss = _mlp_miss(type(mlp))
    if miss:
        return miss
    norm_names = [c.__name__ for c in type(norm_module).__mro__]
    if "GemmaRMSNorm" in norm_names or "Gemma3RMSNorm" in norm_names:  # Gemma3's: x·rstd·(1 + w), one rounding
        norm = "gemma_rms"
    elif "RMSNorm" in norm_names:
        norm = "rms"
        for attr, what in (("variance_size_override", "variance over part of the hidden size (var_hidden_size)"),
                           ("override_orig_dtype", "output dtype override (override_orig_dtype)")):
            if getattr(norm_module, attr, None) is not None:
                return f"{norm_attr}: {what}"
        for attr, what in (("cast_x_before_out_mul", "cast before the weight multiply (cast_x_before_out_mul)"),
                           ("fp32_residual", "fp32 residual (fp32_residual)")):
            if getattr(norm_module, attr, False):
                return f"{norm_attr}: {what}"
        if not getattr(norm_module, "has_weight", True):
            return f"{norm_attr} has no weight (has_weight=False)"
    else:
        return f"{norm_attr} is {type(norm_module).__qualname__}, not RMSNorm/GemmaRMSNorm/Gemma3RMSNorm"
    # vLLM's RowParallelLinear always has reduce_results; SGLang's may not (then it reduces).
    return fused_blocks.plan_projections(norm_attr, norm, norm_module, mlp, UNQUANTIZED,
                                         getattr(mlp.down_proj, "reduce_results", True))


def report() -> dict:
    return BLOCKS.report()
