"""Experiment (2026-12-01, H200): what the op's first kernel costs at the seed now that gate/up can compute the
statistics itself. Whole forward in CUDA graphs of 20 calls, replays interleaved, three rounds:
  - "row stats in gate/up": the op (a one-program kernel zeroes the arrival counter, then gate/up);
  - "stats kernel": the path before (`computes_row_stats` forced off);
  - "no first kernel (wrong output)": that path with the statistics kernel not launched, gate/up launched
    dependently on the previous call's down GEMM (the eleventh run's bound, with today's down config);
  - "one-program first kernel (wrong output)": that path with the statistics kernel replaced by the
    one-program zeroing kernel, so gate/up reads statistics nobody wrote.
Run from the repository root with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/thirteenth-run/experiments/chain_cost.py OUT"""
import importlib
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_geglu as b  # noqa: E402
from sk.bench.timing import environment, side_by_side_us  # noqa: E402

geglu = importlib.import_module("sk.ops.fused_pre_norm_geglu")
cute = importlib.import_module("sk.ops.fused_pre_norm_geglu_cute")
COMPUTES, OP_STATS = cute.computes_row_stats, geglu._ln_stats_kernel


class NotLaunched:
    def __getitem__(self, grid):
        return lambda *args, **meta: None


class ZeroKernelInstead:
    def __getitem__(self, grid):
        def run(*args, **meta):
            geglu._zero_arrivals_kernel[(1,)](args[1], PDL=meta["PDL"], num_warps=1, launch_pdl=meta["launch_pdl"])
        return run


def forward(x, args, row_stats, stats_kernel=OP_STATS):
    def fn():
        if not row_stats:
            cute.computes_row_stats = lambda *a: False
        geglu._ln_stats_kernel = stats_kernel
        try:
            return geglu.fused_pre_norm_geglu(x, *args)
        finally:
            cute.computes_row_stats, geglu._ln_stats_kernel = COMPUTES, OP_STATS
    return fn


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    import quack
    results = {"environment": environment() | {"quack": quack.__version__}, "rounds": []}
    m, d, ff = b.SHAPES["seed"]
    _, x, args = b.inference_problem(m, d, ff)
    fns = {"row stats in gate/up": forward(x, args, True), "stats kernel": forward(x, args, False),
           "no first kernel (wrong output)": forward(x, args, False, NotLaunched()),
           "one-program first kernel (wrong output)": forward(x, args, False, ZeroKernelInstead())}
    with torch.no_grad():
        for r in range(3):
            times = side_by_side_us(fns, calls_per_replay=20, repeats=50, on_error=lambda n, e: print("ERR", n, e))
            results["rounds"].append(times)
            for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                print(f"seed round {r} {name:42s} {us:8.2f} us", flush=True)
    json.dump(results, open(os.path.join(out_dir, "chain_cost.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
