"""Test-only: a deliberately broken kernel in every Python process that has this folder on PYTHONPATH.

The gate's candidate run gets PYTHONPATH=<this folder> and SK_TEST_BROKEN_KERNEL=<bug>; the vLLM engine's
processes inherit both, and the interpreter imports this module at start-up in each of them. The engine still
reaches our ops through the real activation path (SK_ADAPTERS=vllm: the adapter's layers and IR provider);
only the arithmetic of the ops is wrong:
  wrong_epsilon     every RMSNorm/GemmaRMSNorm uses epsilon 1.0 instead of the model's 1e-6
  dropped_residual  the fused residual add forgets the residual (the stream restarts at every norm)
"""
import os

BUG = os.environ.get("SK_TEST_BROKEN_KERNEL")
WRONG_EPSILON = 1.0


def _break(ops) -> None:
    import torch

    if BUG == "wrong_epsilon":
        for name in ("rms_norm", "gemma_rms_norm", "fused_add_rms_norm_", "gemma_fused_add_rms_norm"):
            correct = getattr(ops, name)
            setattr(ops, name, lambda *args, _op=correct: _op(*args[:-1], WRONG_EPSILON))
    elif BUG == "dropped_residual":
        in_place, functional = ops.fused_add_rms_norm_, ops.gemma_fused_add_rms_norm

        def dropped_in_place(x, residual, weight, eps):
            residual.zero_()  # residual <- x + 0, x <- norm(x)
            return in_place(x, residual, weight, eps)

        def dropped_functional(x, residual, weight, eps):
            return functional(x, torch.zeros_like(residual), weight, eps)

        ops.fused_add_rms_norm_, ops.gemma_fused_add_rms_norm = dropped_in_place, dropped_functional
    else:
        raise ValueError(f"unknown SK_TEST_BROKEN_KERNEL={BUG!r}: wrong_epsilon or dropped_residual")


if BUG:
    import sk.ops

    _break(sk.ops)
