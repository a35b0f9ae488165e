"""Decoder-layer feed-forward blocks as one `sk.ops.fused_gated_mlp` call, engine-agnostic (vLLM and SGLang).

A Llama/Qwen/Gemma decoder layer ends with

    hidden, residual = <norm>(hidden, residual)     # post_attention_layernorm (Gemma-2/3: pre_feedforward_layernorm)
    hidden = mlp(hidden)                            # gate_up_proj -> act -> down_proj (+ the engine's all-reduce)
    return hidden, residual

`fuse_layer` replaces, on one layer instance, the norm by `FusedNormMLP` (which computes norm + MLP in one op
call, on the layer's own parameters, and returns the op's new tensors `(out, h)`: nothing is mutated) and the
MLP by `MlpComputedByNorm` (the identity). The layer's forward, its attention half and the engine's model code
stay the engine's. Both stand-ins keep the engine's parameter objects under the same names (`<norm>.weight`,
`mlp.gate_up_proj.weight`, ...), so weight (re)loading and the engines' bookkeeping see the same model.

Tensor parallelism: gate_up_proj holds this rank's d_ff/tp rows of gate and of up (MergedColumnParallelLinear,
gate rows first), down_proj this rank's d_ff/tp columns (RowParallelLinear): the op's shard is just a smaller
d_ff. The op computes this rank's partial product of down_proj; the engine's own all-reduce (the function the
engine's RowParallelLinear calls when `reduce_results and tp_size > 1`) then sums it, and down_proj's bias is
added on rank 0 only, as RowParallelLinear does.

What the op does not compute exactly as the engine's modules would is left on the engine path, with the reason
(`plan_layer`); nothing here imports an engine.
"""
from __future__ import annotations

import weakref
from typing import Callable, NamedTuple

import torch

import sk

# How the adapters name a fused block in their report.
WHAT = "norm + MLP -> sk.ops.fused_gated_mlp"


class Plan(NamedTuple):
    norm_attr: str          # the layer attribute of the norm fused into the block
    norm: str               # fused_gated_mlp's norm= ("rms", "gemma_rms")
    activation: str         # fused_gated_mlp's activation= ("silu", "gelu", "gelu_tanh")
    eps: float
    reduce: bool            # the engine all-reduces down_proj's output (reduce_results and tp_size > 1)
    down_bias_here: bool    # this rank adds down_proj's bias (rank 0, as RowParallelLinear)


class FusedNormMLP(torch.nn.Module):
    """Stands in for a decoder layer's pre-MLP norm: norm + gated MLP of the layer in one op call.

    Called as the norm was, `(x, residual) -> (out, h)` with h = x + residual (the next residual) and out the
    MLP's output (all-reduced by the engine's function where the engine would); `x -> out` without a residual.
    The layer's MLP is `MlpComputedByNorm` then, which returns `out` unchanged.
    """

    def __init__(self, norm_module: torch.nn.Module, mlp: "MlpComputedByNorm", plan: Plan,
                 all_reduce: Callable[[torch.Tensor], torch.Tensor] | None, layer_name: str):
        super().__init__()
        self.weight = norm_module.weight  # the same Parameter: `<norm>.weight` keeps its name and loader
        self.variance_epsilon = plan.eps
        self.sk_plan = plan
        self.sk_layer = layer_name
        self.sk_types = (type(mlp.gate_up_proj), type(mlp.down_proj))
        # Not a child module: the projections' parameters stay registered under the MLP (mlp.gate_up_proj.weight).
        # They are read through it at each call, so weights replaced after loading are the ones used.
        self.__dict__["sk_mlp"] = mlp
        self.__dict__["sk_all_reduce"] = all_reduce

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        plan = self.sk_plan
        gate_up, down = self.sk_mlp.gate_up_proj, self.sk_mlp.down_proj
        if (type(gate_up), type(down)) != self.sk_types:  # e.g. an engine's LoRA wrapped them after we planned
            raise RuntimeError(
                f"standardkernels: {self.sk_layer}'s MLP projections were replaced by {type(gate_up).__qualname__}/"
                f"{type(down).__qualname__} after its norm + MLP were fused; run with SK_FUSED_MLP=0")
        out, h = sk.ops.fused_gated_mlp(
            x, self.weight, gate_up.weight, down.weight, self.variance_epsilon, residual=residual,
            norm=plan.norm, activation=plan.activation, gate_up_bias=gate_up.bias,
            down_bias=down.bias if plan.down_bias_here else None)
        if plan.reduce:
            out = self.sk_all_reduce(out)
        return out if residual is None else (out, h)

    def extra_repr(self) -> str:
        p = self.sk_plan
        return f"{self.sk_layer}: {WHAT} (norm={p.norm}, activation={p.activation}, eps={p.eps}, reduce={p.reduce})"


class MlpComputedByNorm(torch.nn.Module):
    """Stands in for a decoder layer's MLP whose output its norm's `FusedNormMLP` already computed: the identity.

    Holds the MLP's projections (and activation) as children, so their parameters keep their names."""

    def __init__(self, mlp: torch.nn.Module):
        super().__init__()
        for name, child in mlp.named_children():
            self.add_module(name, child)
        self.sk_replaced = type(mlp).__qualname__

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return x


_STAND_INS: dict[type, type] = {}


def stand_in_class(mlp_cls: type) -> type:
    """`MlpComputedByNorm`, or where the engine's MLP class loads its own weights (SGLang's `load_weights`, which
    merges gate_proj/up_proj into gate_up_proj), a subclass with that same method: it reads only the parameters,
    which the stand-in holds under the same names."""
    load = getattr(mlp_cls, "load_weights", None)
    if load is None:
        return MlpComputedByNorm
    cls = _STAND_INS.get(mlp_cls)
    if cls is None:
        cls = _STAND_INS[mlp_cls] = type("MlpComputedByNorm", (MlpComputedByNorm,), {
            "load_weights": load, "__module__": __name__,
            "__doc__": f"MlpComputedByNorm that loads its weights as {mlp_cls.__qualname__}.load_weights does."})
    return cls


def activation_of(act_fn: torch.nn.Module) -> str | None:
    """fused_gated_mlp's activation= for an engine's SiluAndMul / GeluAndMul (or our subclasses), else None."""
    names = [c.__name__ for c in type(act_fn).__mro__]
    if "SiluAndMul" in names:
        return "silu"
    if "GeluAndMul" in names:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(getattr(act_fn, "approximate", None))
    return None


def linear_miss(name: str, linear: torch.nn.Module, unquantized: tuple[str, ...]) -> str | None:
    """Why the op cannot stand in for this gate_up_proj/down_proj (quantized, bias handling, layout), or None."""
    method = type(getattr(linear, "quant_method", None)).__name__
    if method not in unquantized:
        return f"{name} is quantized ({method})"
    weight = getattr(linear, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return f"{name} has no 2-D weight"
    if getattr(linear, "skip_bias_add", False) and getattr(linear, "bias", None) is not None:  # (TeleChat2's: none)
        return f"{name} returns its bias separately (skip_bias_add)"
    if name == "gate_up_proj" and getattr(linear, "gather_output", False):
        return "gate_up_proj gathers its output across ranks (gather_output)"
    if name == "down_proj" and not getattr(linear, "input_is_parallel", True):
        return "down_proj takes an unsharded input (input_is_parallel=False)"
    return None


def shard_miss(norm_weight: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> str | None:
    """Why the loaded shard shapes do not form a gated MLP: gate_up [2·d_ff_shard, d], down [d, d_ff_shard]."""
    d = norm_weight.shape[-1]
    if gate_up.shape[0] % 2 or gate_up.shape[1] != d or tuple(down.shape) != (d, gate_up.shape[0] // 2):
        return (f"shapes do not form a gated MLP: norm weight {tuple(norm_weight.shape)}, gate_up_proj "
                f"{tuple(gate_up.shape)}, down_proj {tuple(down.shape)}")
    return None


# Devices whose layers are fused without asking the op's coverage: on CPU the engine's path is PyTorch too (the op's
# reference, recorded, is what the CPU engine tests run); meta weights are not placed yet (SGLang's layered loader
# builds the model on the meta device), so the op decides, and records, at its calls.
UNJUDGED_DEVICES = ("cpu", "meta")


def placed_weight_miss(weight: torch.Tensor, op: str, miss: Callable[[], str | None]) -> str | None:
    """Why a layer whose weight is placed on a GPU keeps the engine's path: `op` has no kernel for its device,
    dtype or shape (`miss()`, the op's own coverage verdict; its PyTorch reference would run, slower than the
    engine's kernels), or None (also on `UNJUDGED_DEVICES`)."""
    if weight.device.type in UNJUDGED_DEVICES:
        return None
    reason = miss()
    return None if reason is None else f"no {op} kernel covers it ({reason})"


def kernel_gap(norm: str, gate_up_weight: torch.Tensor) -> str | None:
    """`placed_weight_miss` of the fused block (fused_gated_mlp at this layer's d_model, d_ff and norm)."""
    d_model, d_ff = gate_up_weight.shape[1], gate_up_weight.shape[0] // 2
    return placed_weight_miss(gate_up_weight, "fused_gated_mlp",
                              lambda: sk.ops.gated_mlp.kernel_miss(gate_up_weight, norm, d_model, d_ff))


def plan_projections(norm_attr: str, norm: str, norm_module: torch.nn.Module, mlp: torch.nn.Module,
                     unquantized: tuple[str, ...], reduce_results: bool) -> Plan | str:
    """The engine-independent half of a layer's plan, once its norm is known to be `norm`: activation,
    projections, shard shapes. `reduce_results`: what the engine's down_proj says about its all-reduce."""
    activation = activation_of(getattr(mlp, "act_fn", None))
    if activation is None:
        return f"activation {type(getattr(mlp, 'act_fn', None)).__qualname__} is not SiluAndMul/GeluAndMul(none|tanh)"
    for proj in ("gate_up_proj", "down_proj"):
        miss = linear_miss(proj, getattr(mlp, proj, None), unquantized)
        if miss:
            return miss
    gate_up, down = mlp.gate_up_proj, mlp.down_proj
    miss = shard_miss(norm_module.weight, gate_up.weight, down.weight)
    if miss:
        return miss
    miss = kernel_gap(norm, gate_up.weight)
    if miss:
        return miss
    eps = getattr(norm_module, "variance_epsilon", None)
    eps = norm_module.eps if eps is None else eps  # SGLang's Gemma3RMSNorm names it `eps`
    return Plan(norm_attr=norm_attr, norm=norm, activation=activation, eps=float(eps),
                reduce=bool(reduce_results) and getattr(down, "tp_size", 1) > 1,
                down_bias_here=getattr(down, "tp_rank", 0) == 0)


def fuse_layer(layer: torch.nn.Module, plan: Plan, all_reduce, layer_name: str) -> None:
    """Replace `layer`'s pre-MLP norm and MLP by the fused pair (see the module docstring)."""
    norm_module, mlp = getattr(layer, plan.norm_attr), layer.mlp
    stand_in = stand_in_class(type(mlp))(mlp)
    fused = FusedNormMLP(norm_module, stand_in, plan, all_reduce, layer_name)
    # The engine's own modules (not children: their parameters are the stand-ins'), for `unfuse_layer`.
    fused.__dict__["sk_engine_modules"] = (norm_module, mlp)
    layer.set_submodule(plan.norm_attr, fused)
    layer.set_submodule("mlp", stand_in)


def unfuse_layer(layer: torch.nn.Module, norm_attr: str) -> FusedNormMLP:
    """Give `layer` its engine's norm and MLP back (the same module objects, sharing the same parameters);
    returns the fused block taken out."""
    fused = getattr(layer, norm_attr)
    norm_module, mlp = fused.sk_engine_modules
    layer.set_submodule(norm_attr, norm_module)
    layer.set_submodule("mlp", mlp)
    return fused


def repacked_miss(layer: torch.nn.Module) -> str | None:
    """Why a fused layer's projections can no longer be read as plain weights once the engine processed them
    after loading (SGLang on a CPU with AMX packs them: `use_intel_amx_backend`), or None."""
    for name in ("gate_up_proj", "down_proj"):
        if getattr(getattr(layer.mlp, name, None), "use_intel_amx_backend", False):
            return f"the engine packed {name}'s weight for its CPU backend (AMX) after loading; the op reads plain weights"
    return None


def source_text(forward) -> str:
    """`forward`'s source with every run of whitespace made one space, for the layout checks' patterns."""
    import inspect

    return " ".join(inspect.getsource(forward).split())


def norm_then_mlp(forward, norm_attr: str, interlude: str | None = None, epilogue: str | None = None,
                  then_return: bool = True) -> bool:
    """Whether `forward`'s source has `hidden_states, residual = self.<norm_attr>(hidden_states, residual)` then
    `hidden_states = self.mlp(hidden_states)` (regex `interlude` allowed between them; `epilogue` then `return
    hidden_states, residual` after them when `then_return`); whitespace-insensitive."""
    import re

    source = source_text(forward)
    pattern = (rf"hidden_states, residual = self\.{norm_attr}\( ?hidden_states, residual,? ?\) "
               + (rf"(?:{interlude} )?" if interlude else "")
               + r"hidden_states = self\.mlp\(hidden_states\)"
               + ((rf" {epilogue}" if epilogue else "") + r" return hidden_states, residual" if then_return else ""))
    return re.search(pattern, source) is not None


def mlp_is_gate_up_act_down(forward) -> bool:
    """Whether an MLP's forward calls gate_up_proj(x), then act_fn, then down_proj, in that order."""
    source = source_text(forward)
    calls = [source.find(c) for c in ("self.gate_up_proj(x)", "self.act_fn", "self.down_proj(")]
    return -1 not in calls and calls == sorted(calls)


class FusedBlocks:
    """This process's fused blocks, for its report: layers fused, layers left on the engine path and why; and,
    with SK_ATTENTION_LINEAR=1, the attention projections routed through `sk.ops.linear` (`route_projections`)."""

    def __init__(self) -> None:
        self.fused: dict[str, str] = {}          # layer name -> "<class>: norm=..., activation=..."
        self.engine_path: dict[str, str] = {}    # layer name -> reason
        self.disabled: str | None = None         # why the fused blocks are off in this process
        self.projections: dict[str, str] = {}    # projection name -> its weight's shape
        self.projections_engine_path: dict[str, str] = {}  # projection name -> reason
        # Each model planned -> its number, in order (`scope`); weak, so that a model freed and another built at
        # its address (id() reused) are two models, not one.
        self._models: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
        self._planned = 0

    def scope(self, model: torch.nn.Module) -> str:
        """The prefix of `model`'s layer names in this report: none for the first model of the process, "modelK:"
        for the K-th after it (e.g. a speculative-decoding draft model, whose layers have the target's names)."""
        if model not in self._models:
            self._models[model], self._planned = self._planned, self._planned + 1
        k = self._models[model]
        return f"model{k}:" if k else ""

    def report(self) -> dict:
        coverage = sk.coverage.report()
        calls = {op: n for op, n in coverage["kernel_calls"].items() if op.startswith("fused_gated_mlp")}
        prepared = {op: n for op, n in coverage["weights_prepared"].items() if op.startswith("fused_gated_mlp")}

        def fallbacks(ops: Callable[[str], bool]) -> dict:
            found = [f for f in coverage["fallbacks"] if ops(f["op"])]
            return {"fallback_calls": sum(f["count"] for f in found),
                    "fallback_reasons": sorted({f["reason"] for f in found})}
        return {"enabled": self.disabled is None, "disabled": self.disabled, "what": WHAT,
                "layers_fused": len(self.fused), "fused": dict(self.fused), "engine_path": dict(self.engine_path),
                "kernel_calls": calls, "weights_prepared": prepared,
                **fallbacks(lambda op: op.startswith("fused_gated_mlp")),
                "projections": {"routed": len(self.projections), "engine_path": dict(self.projections_engine_path),
                                "kernel_calls": coverage["kernel_calls"].get(LINEAR, 0),
                                **fallbacks(lambda op: op == LINEAR)}}


# ----------------------------------------------------------------------------------------------- projections

# The attention side's weight streams, routed through sk.ops.linear with SK_ATTENTION_LINEAR=1.
PROJECTIONS = ("qkv_proj", "o_proj")
LINEAR = "linear"  # sk.ops.linear's coverage row
_ROUTED: dict[type, type] = {}


def _apply_sk_linear(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None):
    return sk.ops.linear(x, layer.weight, bias, backend="auto")  # the kernel where measured faster, else cuBLAS


def routed_method(method):
    """A copy of a projection's unquantized linear method whose `apply(layer, x, bias)` runs `sk.ops.linear`.
    The engine's `LinearBase.forward` (its tensor-parallel split, all-reduce and bias handling) stays the
    engine's; the copy's class subclasses the method's, so the engine's isinstance checks (weight processing,
    reloading) see what they saw."""
    cls = type(method)
    routed = _ROUTED.get(cls)
    if routed is None:
        routed = _ROUTED[cls] = type(f"Sk{cls.__name__}", (cls,), {
            "apply": _apply_sk_linear, "__module__": __name__, "sk_replaced": cls.__qualname__,
            "__doc__": f"{cls.__qualname__} whose apply() runs sk.ops.linear (sk.adapters.fused_blocks)."})
    copy = object.__new__(routed)
    copy.__dict__.update(method.__dict__)
    return copy


def projection_miss(name: str, proj: torch.nn.Module | None, unquantized: tuple[str, ...]) -> str | None:
    """Why sk.ops.linear cannot stand in for this projection's GEMM, or None."""
    if proj is None:
        return f"no {name}"
    method = getattr(proj, "quant_method", None)
    if type(method) in _ROUTED.values():
        return "already routed"
    if type(method).__name__ not in unquantized:
        return f"{name} is quantized ({type(method).__name__})"
    weight = getattr(proj, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return f"{name} has no 2-D weight"
    return placed_weight_miss(weight, "sk.ops.linear",
                              lambda: sk.ops.gated_mlp.linear_kernel_miss(weight, weight.shape[0], weight.shape[1]))


def route_projections(attention: torch.nn.Module, prefix: str, unquantized: tuple[str, ...], blocks: FusedBlocks,
                      engine: str, refuse: str | None = None) -> None:
    """Route `attention`'s QKV and output projections through sk.ops.linear (`routed_method`), or record why
    each keeps the engine's GEMM (`refuse`: a reason that holds for all, e.g. an engine mode the op ignores);
    in strict mode a projection left is an error naming it."""
    for name in PROJECTIONS:
        proj = getattr(attention, name, None)
        full = f"{prefix}.{name}"
        miss = refuse or projection_miss(name, proj, unquantized)
        if miss == "already routed":
            continue
        if miss:
            blocks.projections_engine_path[full] = miss
            if sk.coverage.is_strict():
                raise UncoveredLayerError(
                    f"standardkernels (strict): projection {full} keeps {engine}'s own GEMM, not sk.ops.linear: "
                    f"{miss}. Run without --strict/SK_STRICT=1 to allow it, or SK_ATTENTION_LINEAR=0.")
            continue
        proj.quant_method = routed_method(proj.quant_method)
        blocks.projections[full] = "x".join(map(str, proj.weight.shape))


class UncoveredLayerError(RuntimeError):
    """Strict mode: a decoder layer whose feed-forward block the op cannot compute (named, with the reason)."""


def subclass_miss(cls: type, norm_attr_of: Callable[[type], str | None]) -> str | None:
    """Why a layer of `cls`, not listed itself (`norm_attr_of` None) but a subclass of a listed class (another
    model's layer, an EAGLE draft's), keeps the engine's path; None for a listed class or an unrelated one."""
    if norm_attr_of(cls):
        return None
    base = next((c for c in cls.__mro__[1:] if norm_attr_of(c)), None)
    return None if base is None else (f"a subclass of {base.__name__} from {cls.__module__}; only the listed "
                                      f"classes themselves are fused (a subclass may change the MLP or the forward)")


def left_on_engine_path(blocks: FusedBlocks, layer_name: str, cls: str, reason: str, engine: str) -> None:
    """Record a layer that keeps the engine's path; in strict mode that is an error naming it."""
    blocks.engine_path[layer_name] = f"{cls}: {reason}"
    if sk.coverage.is_strict():
        raise UncoveredLayerError(
            f"standardkernels (strict): decoder layer {layer_name} ({cls}) keeps {engine}'s own norm + MLP, "
            f"not sk.ops.fused_gated_mlp: {reason}. Run without --strict/SK_STRICT=1 to allow it, or "
            f"SK_FUSED_MLP=0 to leave every decoder MLP to {engine}.")
