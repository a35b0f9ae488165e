"""The gated-MLP family's feed-forward modules for training: GatedMLP and the pre-norm block around it.

    GatedMLP:          y = down(act(gate(x)) · up(x)),   act = silu (SwiGLU), gelu (erf) or gelu_tanh (GEGLU)
    PreNormGatedFFN:   y = x + GatedMLP(RMSNorm(x))     (PreNormSwiGLUFFN: act = silu)

Parameters are `gate_proj`, `up_proj`, `down_proj` (torch Linears, Hugging Face's names and layout, so a
swapped model keeps its state_dict keys) in the dtype they were made with: FP32 by default, the masters the
optimizer updates. The compute dtype is the input's (or the autocast dtype under torch.autocast); one GEMM
writes the [g | u] rows `sk.ops.silu_and_mul` / `gelu_and_mul` read, from one [gate; up] matrix:

- training (grad enabled and a parameter or the input requiring it): cast and concatenated per call, so that
  gradients reach the FP32 masters through the cast;
- inference: the [gate; up] and down copies in the compute dtype are made once per weight version and reused
  (`sk.ops.weight_cache`: one extra copy of the weights in that dtype; call once before capturing a CUDA graph).
  PreNormGatedFFN in bf16/fp16 then runs the whole block as one `sk.ops.fused_gated_mlp` call (norm, gate/up,
  activation, down), plus the residual add.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sk import ops
from sk.nn.norm import GemmaRMSNorm, RMSNorm
from sk.ops import weight_cache
from sk.ops.act_and_mul import act_and_mul_reference
from sk.ops.rms_norm import GEMMA_OFFSET

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def _act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "silu":
        return ops.silu_and_mul(x)
    return ops.gelu_and_mul(x, approximate="tanh" if activation == "gelu_tanh" else "none")


_ACT_OPS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "gelu_tanh": "gelu_and_mul"}


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The autocast dtype under torch.autocast, else x's."""
    device_type = x.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype


def _training(x: torch.Tensor, module: nn.Module) -> bool:
    """Whether autograd must reach the parameters (or x) through this call."""
    return torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in module.parameters()))


def _reference_activation(activation: str, g: torch.Tensor) -> torch.Tensor:
    return act_and_mul_reference(torch.cat([g, torch.ones_like(g)], -1), activation)


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "silu", *, bias: bool = False,
                 device=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"GatedMLP: activation must be one of {ACTIVATIONS}, got {activation!r}")
        factory = {"device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)
        self.hidden_size, self.intermediate_size, self.activation = hidden_size, intermediate_size, activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = _compute_dtype(x)
        return self._gate_up_act_down(x.to(dtype), dtype)

    def _gate_up_act_down(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        d = self.down_proj
        if _training(x, self):
            g, u = self.gate_proj, self.up_proj
            w_gu = torch.cat([g.weight.to(dtype), u.weight.to(dtype)])
            b_gu = None if g.bias is None else torch.cat([g.bias.to(dtype), u.bias.to(dtype)])
            h = _act_and_mul(F.linear(x, w_gu, b_gu), self.activation)
            return F.linear(h, d.weight.to(dtype), None if d.bias is None else d.bias.to(dtype))
        op = _ACT_OPS[self.activation]
        w_gu, b_gu = self.gate_up(dtype, op)
        h = _act_and_mul(F.linear(x, w_gu, b_gu), self.activation)
        return F.linear(h, weight_cache.cast(op, d.weight, dtype),
                        None if d.bias is None else weight_cache.cast(op, d.bias, dtype))

    def gate_up(self, dtype: torch.dtype, op: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([gate; up] weight, [gate; up] bias or None) in `dtype`, cached per weight version (inference only:
        no gradient reaches the parameters through them). `op` names the coverage row of a capture-time miss."""
        g, u = self.gate_proj, self.up_proj

        def cat(a, b):
            return lambda: torch.cat([a.detach().to(dtype), b.detach().to(dtype)])
        w = weight_cache.derived(op, (g.weight, u.weight), ("gated_mlp_gate_up", dtype), cat(g.weight, u.weight))
        b = None if g.bias is None else weight_cache.derived(op, (g.bias, u.bias), ("gated_mlp_gate_up", dtype),
                                                             cat(g.bias, u.bias))
        return w, b

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"activation={self.activation!r}")

    @classmethod
    def from_module(cls, module: nn.Module, *, activation: str | None = None, dtype: torch.dtype | None = None,
                    gate: str = "gate_proj", up: str = "up_proj", down: str = "down_proj") -> "GatedMLP":
        """A GatedMLP with `module`'s weights (copied exactly), on their device, in `dtype` (default: the
        source's dtype; torch.float32 for FP32 masters).

        `module` is a Hugging Face `LlamaMLP`-style block: Linear children `gate_proj`, `up_proj`, `down_proj`
        (other names via gate=, up=, down=) and an activation `act_fn`, recognised by what it computes on a probe
        (SiLU; GELU erf; GELU tanh, e.g. `gelu_pytorch_tanh`); or pass `activation=`. Raises ValueError naming
        what does not fit."""
        children = dict(module.named_children())
        parts = {}
        for role, name in (("gate", gate), ("up", up), ("down", down)):
            child = children.get(name)
            if not isinstance(child, nn.Linear):
                raise ValueError(
                    f"GatedMLP.from_module: {type(module).__name__} has no Linear child {name!r} for the {role} "
                    f"projection (children: {_describe(children)}); pass {role}='<child name>'")
            parts[role] = child
        g, u, d = parts["gate"], parts["up"], parts["down"]
        hidden, inter = g.in_features, g.out_features
        if (u.in_features, u.out_features, d.in_features, d.out_features) != (hidden, inter, inter, hidden):
            raise ValueError(
                f"GatedMLP.from_module: {type(module).__name__}'s projections do not form a gated MLP: "
                + ", ".join(f"{r} Linear(in={p.in_features}, out={p.out_features})" for r, p in parts.items())
                + f"; expected gate/up Linear({hidden} → {inter}), down Linear({inter} → {hidden})")
        biases = {r: p.bias is not None for r, p in parts.items()}
        if len(set(biases.values())) > 1:
            raise ValueError(f"GatedMLP.from_module: {type(module).__name__}'s projections mix biased and unbiased "
                             f"Linears ({biases}); GatedMLP has biases on all three or none")
        found = activation_of(getattr(module, "act_fn", None))
        if activation is None:
            if found is None:
                act = getattr(module, "act_fn", None)
                raise ValueError(
                    f"GatedMLP.from_module: cannot tell {type(module).__name__}'s activation: act_fn is "
                    f"{type(act).__name__ if act is not None else 'missing'}, which computes none of {ACTIVATIONS} "
                    f"on a probe; pass activation=")
            activation = found
        elif found is not None and found != activation:
            raise ValueError(f"GatedMLP.from_module: activation={activation!r} given but "
                             f"{type(module).__name__}.act_fn computes {found!r}")
        new = cls(hidden, inter, activation, bias=biases["gate"], device=g.weight.device,
                  dtype=dtype or g.weight.dtype)
        with torch.no_grad():
            for role, name in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                src, dst = parts[role], getattr(new, name)
                dst.weight.copy_(src.weight)
                if src.bias is not None:
                    dst.bias.copy_(src.bias)
        return new


class PreNormGatedFFN(nn.Module):
    """y = x + GatedMLP(RMSNorm(x)) (GemmaRMSNorm with `gemma_norm=True`): `norm` and `mlp` children."""

    def __init__(self, d_model: int, d_ff: int, eps: float = 1e-6, activation: str = "silu", *,
                 gemma_norm: bool = False, bias: bool = False, device=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.norm = (GemmaRMSNorm if gemma_norm else RMSNorm)(d_model, eps, device=device, dtype=dtype)
        self.mlp = GatedMLP(d_model, d_ff, activation, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _training(x, self):
            dtype = _compute_dtype(x)
            if dtype in (torch.bfloat16, torch.float16):
                # The residual added in x's own dtype, as on the training path (under autocast an fp32 x stays
                # the fp32 residual stream; the MLP computes in the autocast dtype on both paths).
                return x + self._fused(x.to(dtype), dtype)
        return x + self.mlp(self.norm(x))

    def _fused(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Inference in bf16/fp16: norm + MLP as one sk.ops.fused_gated_mlp call (the residual add is the
        caller's)."""
        norm, mlp = self.norm, self.mlp
        kind = "gemma_rms" if norm.weight_offset == GEMMA_OFFSET else "rms"
        op = f"fused_gated_mlp/{kind}"
        gate_up, gate_up_bias = mlp.gate_up(dtype, op)
        down = mlp.down_proj
        out, _ = ops.fused_gated_mlp(
            x, norm.weight, gate_up, weight_cache.cast(op, down.weight, dtype), norm.eps, norm=kind,
            activation=mlp.activation, gate_up_bias=gate_up_bias,
            down_bias=None if down.bias is None else weight_cache.cast(op, down.bias, dtype))
        return out

    @classmethod
    def from_modules(cls, norm: nn.Module, mlp: nn.Module, *, dtype: torch.dtype | None = None,
                     activation: str | None = None) -> "PreNormGatedFFN":
        """The block of a Hugging Face decoder layer's `post_attention_layernorm` and `mlp` (any norm
        `RMSNorm.from_module` / `GemmaRMSNorm.from_module` takes, any MLP `GatedMLP.from_module` takes)."""
        new_mlp = GatedMLP.from_module(mlp, activation=activation, dtype=dtype)
        new_norm = norm_from_module(norm, dtype=dtype)
        if new_norm.hidden_size != new_mlp.hidden_size:
            raise ValueError(f"PreNormGatedFFN.from_modules: the norm is {new_norm.hidden_size} wide but the MLP's "
                             f"hidden size is {new_mlp.hidden_size}")
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block.norm, block.mlp = new_norm, new_mlp
        return block


class PreNormSwiGLUFFN(PreNormGatedFFN):
    """PreNormGatedFFN with SiLU: x + down(silu(gate(RMSNorm(x))) · up(RMSNorm(x)))."""

    def __init__(self, d_model: int, d_ff: int, eps: float = 1e-6, **kwargs):
        super().__init__(d_model, d_ff, eps, "silu", **kwargs)

    @classmethod
    def from_modules(cls, norm: nn.Module, mlp: nn.Module, *, dtype: torch.dtype | None = None,
                     activation: str | None = None) -> "PreNormSwiGLUFFN":
        if activation not in (None, "silu"):
            raise ValueError(f"PreNormSwiGLUFFN.from_modules: the activation is SiLU, got activation={activation!r}")
        block = super().from_modules(norm, mlp, dtype=dtype, activation=activation)
        if block.mlp.activation != "silu":
            raise ValueError(f"PreNormSwiGLUFFN.from_modules: {type(mlp).__name__}'s activation is "
                             f"{block.mlp.activation!r}, not SiLU; use sk.nn.PreNormGatedFFN")
        return block


def norm_from_module(module: nn.Module, *, dtype: torch.dtype | None = None) -> RMSNorm:
    """RMSNorm.from_module or GemmaRMSNorm.from_module, whichever formula `module` computes."""
    try:
        return RMSNorm.from_module(module, dtype=dtype)
    except ValueError as error:
        if "use sk.nn.GemmaRMSNorm" not in str(error):
            raise
    return GemmaRMSNorm.from_module(module, dtype=dtype)


def activation_of(act_fn) -> str | None:
    """Which of ACTIVATIONS `act_fn` computes, judged on a probe over [-8, 8] in fp32 (the tanh and erf GELUs
    differ by up to 2e-4 there, fp32 evaluation by ~1e-6), or None."""
    if not callable(act_fn):
        return None
    g = torch.linspace(-8, 8, 257, dtype=torch.float32)
    with torch.no_grad():
        try:
            got = act_fn(g)
        except Exception:
            return None
        if not isinstance(got, torch.Tensor) or got.shape != g.shape:
            return None
        for activation in ACTIVATIONS:
            if (got.float() - _reference_activation(activation, g)).abs().max() < 2e-5:
                return activation
    return None


def _describe(children: dict) -> str:
    return ", ".join(f"{n}: {type(c).__name__}" for n, c in children.items()) or "none"
