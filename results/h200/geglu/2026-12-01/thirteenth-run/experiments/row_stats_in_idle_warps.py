"""Experiment (2026-12-01, H200): gate/up computing LayerNorm's row statistics in the three producer warps that
QuACK's SM90 GEMM leaves idle (`fused_pre_norm_geglu_cute._row_stats_in_idle_warps`), against the statistics
kernel before gate/up (the op's path until now, `computes_row_stats` forced off). It ran at three commits:
    first/   (uncommitted, cefc975's kernel with a one-program kernel before gate/up that zeroed the arrival
             counter, and every CTA's epilogue acquiring it) -> seed 19.92-20.11 against 20.10-20.27
    second/  cefc975: counters that the last CTA zeroes, gate/up the op's first kernel -> 19.59-19.66 against
             20.22-20.30
    third/   4e308db: one statistics warp per CTA acquires the count and lets the epilogue through a named
             barrier, and counts the CTA past the wait, off the epilogue's critical path -> 19.25-19.30 against
             20.19-20.24
    fourth/  e3141a1 (final): counters per stream and per captured call, the CTA's statistics warps all arrived
             before it counts itself done, a bounded wait -> 19.26-19.32 against 20.21-20.22

Why: the statistics kernel's programs hold every SM's registers for ~1 µs, and a gate/up CTA needs a whole SM,
so gate/up's start waits for them (twelfth run: ~0.9 µs of the seed's 20.1-20.4). Each idle warp reads about 3 rows
of x from L2 while the main loop runs; the epilogue waits on the count of warps done.
Error against fp64 at several small-class shapes for both paths; then the whole forward in CUDA graphs of 20 calls,
replays interleaved, three rounds, at the given shapes.
Run from the repository root with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/thirteenth-run/experiments/row_stats_in_idle_warps.py OUT [shape ...]"""
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
COMPUTES = cute.computes_row_stats


def forward(x, args, row_stats):
    def fn():
        if not row_stats:
            cute.computes_row_stats = lambda *a: False
        try:
            return geglu.fused_pre_norm_geglu(x, *args)
        finally:
            cute.computes_row_stats = COMPUTES
    return fn


def errors():
    out = {}
    for m, d, ff, shift in [(1024, 768, 1448, 0.0), (1000, 768, 1448, 0.0), (1023, 200, 520, 0.0),
                            (333, 1000, 1448, 0.0), (1024, 768, 1448, 100.0), (100, 40, 24, 30.0),
                            (65, 64, 40, 0.0), (4097, 768, 1448, 0.0)]:
        _, x, args = b.inference_problem(m, d, ff)
        x = x + shift
        ref = geglu.fused_pre_norm_geglu_reference(x.double(), *[a.double() if torch.is_tensor(a) else a
                                                                 for a in args])
        key = f"{m}x{d}->{ff}, x + {shift}"
        with torch.no_grad():
            out[key] = {"computes_row_stats": COMPUTES(m, d, ff, geglu.shape_class(m, d, ff), x.device),
                        "stats kernel": b.rel_err(forward(x, args, False)(), ref),
                        "row stats in gate/up": b.rel_err(forward(x, args, True)(), ref)}
        print(key, out[key], flush=True)
    return out


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    import quack
    results = {"environment": environment() | {"quack": quack.__version__}, "rel_err": errors(), "rounds": {}}
    for shape in sys.argv[2:] or ["seed"]:
        m, d, ff = b.SHAPES[shape]
        _, x, args = b.inference_problem(m, d, ff)
        fns = {"stats kernel": forward(x, args, False), "stats kernel (twin)": forward(x, args, False),
               "row stats in gate/up": forward(x, args, True), "row stats in gate/up (twin)": forward(x, args, True)}
        results["rounds"][shape] = []
        with torch.no_grad():
            for r in range(3):
                times = side_by_side_us(fns, calls_per_replay=20, repeats=50,
                                        on_error=lambda n, e: print("ERR", n, e))
                results["rounds"][shape].append(times)
                for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                    print(f"{shape} round {r} {name:32s} {us:8.2f} us", flush=True)
    json.dump(results, open(os.path.join(out_dir, "row_stats_in_idle_warps.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
