"""PreNormGEGLUFFN: the pre-norm GEGLU feed-forward block as an nn.Module over `sk.ops.fused_pre_norm_geglu`.

    y = x + down(gelu(gate(LN(x))) · up(LN(x)))

Parameters are FP32 masters (what the optimizer updates; their gradients are FP32). With a BF16 input the
op reads the LayerNorm scale and shift in FP32 and computes the projections on BF16 copies of the masters,
made once and re-made only after a master changes (`sk.ops.weight_cache` follows each parameter's identity,
storage and version counter, which every optimizer step advances; inference uses copies with the LayerNorm
scale folded in, cached the same way). The copies are never made inside a CUDA graph of inference: a graph
captured after one call (as `sk.cuda_graphs.make_graphed_callables` does) reads them, so the module replays
as fast as the op with BF16 weights. A module built under `torch.inference_mode()` (inference-tensor
parameters, which have no version counter) is cached on identity and storage: after changing such a
parameter in place inside inference mode, call `sk.ops.weight_cache.forget(param)`. Under CUDA BF16 autocast
an FP32 input is converted for this op; outside autocast an FP32 input runs the PyTorch fallback, recorded in
the coverage report.

Training steps that repeat on CUDA (same input shape, same parameters) are replayed from CUDA graphs of the
op's forward and backward after two eager calls, with the same results (see `sk_core/ops/_step_graphs.py`: what
it keeps per shape — 160 MiB per block at the seed shape — and `SK_STEP_GRAPHS=0` to turn it off).
"""
from __future__ import annotations

import torch
from torch import nn

from sk import ops

# Child names `from_module` recognizes for each role, matched as substrings of the lower-cased child name.
_ROLE_HINTS = {"norm": ("norm", "ln"), "gate": ("gate",), "up": ("up",), "down": ("down",)}


class PreNormGEGLUFFN(nn.Module):
    def __init__(self, d_model: int = 768, d_ff: int = 1448, eps: float = 1e-5, *, bias: bool = True,
                 approximate: str = "none", device=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"PreNormGEGLUFFN: approximate must be 'none' or 'tanh', got {approximate!r}")
        factory = {"device": device, "dtype": dtype}
        self.norm = nn.LayerNorm(d_model, eps=eps, **factory)
        self.gate = nn.Linear(d_model, d_ff, bias=bias, **factory)
        self.up = nn.Linear(d_model, d_ff, bias=bias, **factory)
        self.down = nn.Linear(d_ff, d_model, bias=bias, **factory)
        self.d_model, self.d_ff, self.eps, self.approximate = d_model, d_ff, eps, approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.fused_pre_norm_geglu(x, *self._weights(), self.eps, self.approximate)

    def _weights(self) -> tuple:
        """(norm weight, norm bias, gate weight, gate bias, up weight, up bias, down weight, down bias), read from
        the children's parameter tables: 16 nn.Module attribute lookups cost ~10 µs of host time a call, more
        than the op's own checks. Anything else there (a child replaced by another class, a parametrized or
        deleted weight) takes the attribute path, which sees it, or raises, as usual."""
        try:
            m = self._modules
            n, g, u, d = (m["norm"]._parameters, m["gate"]._parameters, m["up"]._parameters,
                          m["down"]._parameters)
            return (n["weight"], n["bias"], g["weight"], g["bias"], u["weight"], u["bias"], d["weight"], d["bias"])
        except KeyError:
            return (self.norm.weight, self.norm.bias, self.gate.weight, self.gate.bias, self.up.weight,
                    self.up.bias, self.down.weight, self.down.bias)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}, eps={self.eps}, approximate={self.approximate!r}"

    @classmethod
    def from_module(cls, module: nn.Module, *, norm: str | None = None, gate: str | None = None,
                    up: str | None = None, down: str | None = None, approximate: str = "none") -> "PreNormGEGLUFFN":
        """A PreNormGEGLUFFN with `module`'s weights (copied exactly, as FP32), on the device they are on.

        `module` holds a LayerNorm and three Linears (gate, up: d_model → d_ff; down: d_ff → d_model) as direct
        children. They are found by name (`*norm*`/`*ln*`, `*gate*`, `*up*`, `*down*`, e.g. `my_norm`, `my_gate`,
        `my_up`, `my_down`); pass `norm=`, `gate=`, `up=`, `down=` to name them explicitly. `approximate` is
        the GELU the source block uses ("none" = erf, as torch.nn.functional.gelu's default).
        """
        explicit = {"norm": norm, "gate": gate, "up": up, "down": down}
        parts = {role: _find_child(module, role, name) for role, name in explicit.items()}
        ln, g, u, dn = parts["norm"], parts["gate"], parts["up"], parts["down"]
        d_model, d_ff = g.in_features, g.out_features
        expected = {"gate": (d_ff, d_model), "up": (d_ff, d_model), "down": (d_model, d_ff)}
        found = {role: (parts[role].out_features, parts[role].in_features) for role in expected}
        if found != expected or tuple(ln.normalized_shape) != (d_model,) or ln.weight is None:
            raise ValueError(
                f"PreNormGEGLUFFN.from_module: {type(module).__name__}'s parts do not form a GEGLU block: "
                f"norm LayerNorm{tuple(ln.normalized_shape)} (affine={ln.weight is not None}), "
                + ", ".join(f"{r} Linear(in={s[1]}, out={s[0]})" for r, s in found.items())
                + f"; expected LayerNorm(({d_model},)) with weight, gate/up Linear({d_model} → {d_ff}), "
                f"down Linear({d_ff} → {d_model})"
            )
        eps = float(getattr(module, "eps", ln.eps))
        if eps != ln.eps:
            raise ValueError(f"PreNormGEGLUFFN.from_module: {type(module).__name__}.eps = {eps} but its LayerNorm "
                             f"has eps = {ln.eps}; they must agree")
        source = ln.weight
        new = cls(d_model, d_ff, ln.eps, approximate=approximate, device=source.device)
        # Per-projection bias presence follows the source (a Linear without bias has none here either).
        for role in ("norm", "gate", "up", "down"):
            if parts[role].bias is None:
                getattr(new, role).register_parameter("bias", None)
        with torch.no_grad():
            for role in ("norm", "gate", "up", "down"):
                src, dst = parts[role], getattr(new, role)
                dst.weight.copy_(src.weight)
                if src.bias is not None:
                    dst.bias.copy_(src.bias)
        return new


def _find_child(module: nn.Module, role: str, name: str | None) -> nn.Module:
    kind = nn.LayerNorm if role == "norm" else nn.Linear
    children = dict(module.named_children())
    if name is not None:
        child = children.get(name)
        if not isinstance(child, kind):
            raise ValueError(
                f"PreNormGEGLUFFN.from_module: {role}={name!r} must name a {kind.__name__} child of "
                f"{type(module).__name__}; found {type(child).__name__ if child is not None else 'no such child'} "
                f"(children: {_describe(children)})"
            )
        return child
    matches = [n for n, c in children.items()
               if isinstance(c, kind) and any(h in n.lower() for h in _ROLE_HINTS[role])]
    if len(matches) != 1:
        problem = "none matches" if not matches else f"{len(matches)} match ({', '.join(matches)})"
        raise ValueError(
            f"PreNormGEGLUFFN.from_module: cannot tell which child of {type(module).__name__} is the {role} "
            f"{kind.__name__}: {problem} the names {list(_ROLE_HINTS[role])}; children: {_describe(children)}. "
            f"Pass {role}='<child name>'."
        )
    return children[matches[0]]


def _describe(children: dict) -> str:
    return ", ".join(f"{n}: {type(c).__name__}" for n, c in children.items()) or "none"
