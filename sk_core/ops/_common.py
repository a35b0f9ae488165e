"""Plumbing shared by the op files: argument checks with clear errors, 2-D views, and the reference backward."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from sk import coverage

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"sk.ops.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"sk.ops.{op}: {name} has dtype {t.dtype} (shape {tuple(t.shape)}); supported: bfloat16, float16, "
            f"float32 (kernel) and float64 (reference only)"
        )


def check_same_device(op: str, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        seen = ", ".join(f"{n} on {t.device}" for n, t in zip(names, tensors))
        raise ValueError(f"sk.ops.{op}: all tensors must be on one device; got {seen}")


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """`t` as (rows, last dim) with unit stride along the last dim: a view when possible, a copy otherwise."""
    n = t.shape[-1]
    # reshape(-1, 0) is ambiguous (any row count fits 0 elements): width 0 names its row count.
    t2 = t.reshape(-1, n) if n else t.reshape(math.prod(t.shape[:-1]), 0)
    return t2 if t2.stride(-1) == 1 or t2.shape[-1] <= 1 else t2.contiguous()


def attach_reference_backward(
    op: torch.library.CustomOpDef, coverage_name: Callable[[Sequence], str], reference: Callable
) -> None:
    """Give `op` an autograd formula: the gradient of `reference` at the same inputs, recomputed in the backward.

    The table's `training` column says whether a backward kernel exists; until it does, each backward is a
    recorded fallback (an error under strict mode), so training is correct everywhere and never silently slow.
    """

    def setup_context(ctx, inputs, output):
        ctx.inputs = inputs
        ctx.save_for_backward(*[t for t in inputs if isinstance(t, torch.Tensor)])

    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        inputs = [next(saved) if isinstance(t, torch.Tensor) else t for t in ctx.inputs]
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        coverage.decide(coverage_name(inputs), tensors, backward=True)
        leaves = [t.detach().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
                  for t in inputs]
        with torch.enable_grad():
            outputs = reference(*leaves)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None]
        wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        found = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
        found = iter(found)
        return tuple(next(found) if isinstance(t, torch.Tensor) and t.requires_grad else None for t in leaves)

    op.register_autograd(backward, setup_context=setup_context)
