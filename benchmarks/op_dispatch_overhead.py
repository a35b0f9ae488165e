"""Host time of one op call through each way of registering a PyTorch operator, on the CPU, no kernel run:

- a `torch.library.custom_op` (how sk.ops registered its ops before 2026-12-07) that does nothing,
- the same schema defined with `torch.library.Library` and a backend-key implementation that does nothing (how
  vLLM's `direct_register_custom_op` registers its Python ops, and sk.ops' `LibraryOp` since),
- sk.ops' own `torch.ops.sk.fused_add_rms_norm_` (what vLLM's compiled code calls per norm) with its coverage
  decision and kernel launch stubbed out: the dispatch and wrapper cost alone,

each with grad mode on, under `torch.inference_mode` on tensors made outside it, and on inference tensors (made
under `torch.inference_mode`, as the activations of an engine's forward are: vLLM runs its model in that mode).
The engines run ours this way in every eagerly run step (vLLM's prefill above its largest captured graph:
results/h100/engines/README.md, 2026-12-07).

    python benchmarks/op_dispatch_overhead.py [--calls N]
"""
from __future__ import annotations

import argparse
import platform
import sys

import torch

import sk  # noqa: F401  (registers torch.ops.sk.*)
from sk import coverage
from sk.bench.timing import host_us_per_call


def per_call_us(fn, calls: int) -> float:
    """Median over 5 timed loops of `calls` calls (after calls / 10 + 1 untimed ones) of µs per call."""
    return host_us_per_call(fn, calls=calls, repeats=5, warmup_calls=calls // 10 + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    tensors = {}
    for mode in ("normal", "inference"):
        with torch.inference_mode(mode == "inference"):
            x = torch.randn(1024, 4096, dtype=torch.bfloat16)
            tensors[mode] = (x, torch.randn_like(x), torch.ones(4096, dtype=torch.bfloat16))

    @torch.library.custom_op("sk_bench::noop_custom_op", mutates_args=("x", "residual"))
    def _noop(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> None:
        return None

    library = torch.library.Library("sk_bench", "FRAGMENT")
    library.define("noop_library(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps, float offset) -> ()")
    library.impl("noop_library", lambda x, residual, weight, eps, offset: None, "CPU")

    rms_norm_module = sys.modules["sk.ops.rms_norm"]
    calls = {
        "torch.library.custom_op, no-op": torch.ops.sk_bench.noop_custom_op.default,
        "torch.library.Library + CPU key, no-op": torch.ops.sk_bench.noop_library.default,
        "torch.ops.sk.fused_add_rms_norm_, decision and launch stubbed": torch.ops.sk.fused_add_rms_norm_.default,
    }
    launch, decide = rms_norm_module._launch, coverage.decide
    rms_norm_module._launch, coverage.decide = (lambda *a, **k: None), (lambda *a, **k: True)
    try:
        rows = {}
        for name, op in calls.items():
            def call(mode: str):
                return lambda: op(*tensors[mode], 1e-6, 0.0)
            grad_mode = per_call_us(call("normal"), args.calls)
            with torch.inference_mode():
                rows[name] = (grad_mode, per_call_us(call("normal"), args.calls),
                              per_call_us(call("inference"), args.calls))
    finally:
        rms_norm_module._launch, coverage.decide = launch, decide
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {platform.processor() or platform.machine()}; "
          f"µs per call, median of 5 loops of {args.calls}")
    print(f"{'call':<64} {'grad mode':>10} {'inference mode':>15} {'inference tensors':>18}")
    for name, (grad, inference, inference_tensors) in rows.items():
        print(f"{name:<64} {grad:10.1f} {inference:15.1f} {inference_tensors:18.1f}")


if __name__ == "__main__":
    main()
