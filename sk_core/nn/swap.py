"""`sk.nn.swap(model)`: put our modules in place of the recognised submodules of a Hugging Face model.

    import sk
    replaced = sk.nn.swap(model)      # in place; a list of what was replaced
    print(replaced.summary())         # ... and what was skipped, with why (replaced.skipped)

No per-model patch file: a submodule is recognised by what it is and what it computes, not by the model's name.

- **RMS norms**: a module whose class name ends in `RMSNorm` (Llama, Qwen2/3, Mistral, Gemma 1-3, ...), with a 1-D
  `weight`, an eps, and a forward that computes x·rstd·weight (→ `sk.nn.RMSNorm`) or x·rstd·(1 + weight)
  (→ `sk.nn.GemmaRMSNorm`) on a probe.
- **Gated MLPs**: a module with `gate_proj`, `up_proj`, `down_proj` Linear children (or a class name ending in
  `MLP`) whose `act_fn` computes SiLU, GELU (erf) or GELU (tanh), and whose own forward computes
  down(act(gate(x)) · up(x)) on a probe (→ `sk.nn.GatedMLP`).

A candidate that does not pass is left as it is and listed in `.skipped` with the reason (`strict=True` raises
instead). The replacements keep the source's parameter dtypes, devices, values and state_dict keys (the
parameter objects are new: make the optimizer after swapping). Attention, embeddings and the decoder layers'
residual adds stay the model's own.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from sk.nn.mlp import GatedMLP, norm_from_module
from sk.nn.norm import GemmaRMSNorm, RMSNorm
from sk.ops.act_and_mul import act_and_mul_reference


@dataclasses.dataclass(frozen=True)
class Replacement:
    name: str       # the submodule's qualified name in the model
    source: str     # its class
    target: str     # the sk.nn class now there
    detail: str     # e.g. "hidden 64, eps 1e-06" or "64 -> 172 -> 64, silu"


@dataclasses.dataclass(frozen=True)
class Skipped:
    name: str
    source: str
    reason: str


class SwapResult(list):
    """The `Replacement`s made, in module order; `.skipped` holds the candidates left alone and why."""

    def __init__(self, replaced=(), skipped=()):
        super().__init__(replaced)
        self.skipped: list[Skipped] = list(skipped)

    def summary(self) -> str:
        lines = [f"sk.nn.swap: replaced {len(self)} module(s), skipped {len(self.skipped)}"]
        lines += [f"  {r.name}: {r.source} -> sk.nn.{r.target} ({r.detail})" for r in self]
        lines += [f"  skipped {s.name}: {s.source}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)


class SwapError(ValueError):
    """`swap(..., strict=True)` found a candidate it could not replace."""


_OURS = (RMSNorm, GatedMLP)
_MLP_CHILDREN = ("gate_proj", "up_proj", "down_proj")


def _is_norm_candidate(module: nn.Module) -> bool:
    return type(module).__name__.lower().endswith("rmsnorm")


def _is_mlp_candidate(module: nn.Module) -> bool:
    children = dict(module.named_children())
    return type(module).__name__.endswith("MLP") or all(c in children for c in _MLP_CHILDREN)


def swap(model: nn.Module, *, norms: bool = True, mlps: bool = True, strict: bool = False) -> SwapResult:
    """Replace `model`'s recognised RMS norms and gated MLPs in place; returns what was replaced (and
    `.skipped`). With `strict`, a candidate that cannot be replaced raises SwapError and nothing is changed."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"sk.nn.swap: model must be a torch.nn.Module, got {type(model).__name__}")
    planned: list[tuple[nn.Module, str, nn.Module, Replacement]] = []
    skipped: list[Skipped] = []

    def visit(parent: nn.Module, prefix: str) -> None:
        for child_name, child in parent.named_children():
            name = f"{prefix}.{child_name}" if prefix else child_name
            if isinstance(child, _OURS):
                continue  # already ours (a second swap)
            kind = ("norm" if norms and _is_norm_candidate(child) else
                    "mlp" if mlps and _is_mlp_candidate(child) else None)
            if kind is not None:
                try:
                    new, detail = _norm(child) if kind == "norm" else _mlp(child)
                except ValueError as why:
                    skipped.append(Skipped(name, type(child).__name__, str(why)))
                else:
                    planned.append((parent, child_name, new,
                                    Replacement(name, type(child).__name__, type(new).__name__, detail)))
                    continue  # its children go with it
            visit(child, name)

    visit(model, "")
    if strict and skipped:
        raise SwapError("sk.nn.swap(strict=True): nothing replaced; these candidates do not match:\n"
                        + "\n".join(f"  {s.name}: {s.source}: {s.reason}" for s in skipped))
    for parent, child_name, new, _ in planned:
        old = getattr(parent, child_name)
        new.train(old.training)
        setattr(parent, child_name, new)
    return SwapResult([r for *_, r in planned], skipped)


def _norm(module: nn.Module) -> tuple[RMSNorm, str]:
    new = norm_from_module(module)
    return new, f"hidden {new.hidden_size}, eps {new.eps}" + (", 1 + weight" if isinstance(new, GemmaRMSNorm) else "")


def _mlp(module: nn.Module) -> tuple[GatedMLP, str]:
    new = GatedMLP.from_module(module)
    _check_mlp_forward(module, new)
    return new, f"{new.hidden_size} -> {new.intermediate_size} -> {new.hidden_size}, {new.activation}"


def _check_mlp_forward(module: nn.Module, new: GatedMLP) -> None:
    """Refuse an MLP whose own forward is not down(act(gate(x)) · up(x)) (say, one that scales or adds a term):
    the source runs on a probe in its weights' dtype, against that formula in fp32 (PyTorch reference)."""
    weight = new.gate_proj.weight
    if weight.device.type == "meta":
        raise ValueError("its parameters are on the meta device: its forward cannot be checked")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, new.hidden_size, generator=gen).to(weight.device, weight.dtype)
    with torch.no_grad():
        try:
            got = module(x)
        except Exception as error:
            raise ValueError(f"its forward fails on a probe of shape {tuple(x.shape)}: {error}") from None
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            raise ValueError(f"its forward on a probe {tuple(x.shape)} does not return a tensor of that shape")
        p = {n: t.float() if t is not None else None for n, t in (
            ("wg", new.gate_proj.weight), ("bg", new.gate_proj.bias), ("wu", new.up_proj.weight),
            ("bu", new.up_proj.bias), ("wd", new.down_proj.weight), ("bd", new.down_proj.bias))}
        xf = x.float()
        gu = torch.cat([F.linear(xf, p["wg"], p["bg"]), F.linear(xf, p["wu"], p["bu"])], -1)
        want = F.linear(act_and_mul_reference(gu, new.activation), p["wd"], p["bd"])
        tolerance = 1e-4 if weight.dtype in (torch.float32, torch.float64) else 3e-2
        err = ((got.float() - want).norm() / (want.norm() + 1e-30)).item()
        if err > tolerance:
            raise ValueError(f"its forward is not down({new.activation}(gate(x)) · up(x)) on a probe "
                             f"(relative error {err:.1e} > {tolerance:g})")
