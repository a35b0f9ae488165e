"""Experiment (2026-12-01, H200): the statistics kernel launched dependently on the kernel before it (the previous
call's down GEMM in the benchmark's graph of 20 calls), waiting for it (`griddepcontrol.wait`) before touching
memory and only then letting gate/up launch, against the stream-ordered launch it had.

Why: it was the one launch of the three in a stream order, so each call paid a full kernel-to-kernel gap before
it; launched dependently it is resident while the previous kernel drains (the seed's down GEMM in 1 × 4 clusters
leaves 36 SMs free) and starts the moment that kernel's memory is flushed. Waiting before gate/up may launch keeps
gate/up's main loop on x safe when x is the previous kernel's output.
Ran with the kernel's wait in place (a no-op when launched in stream order); "stream order" launches it as
before. The down GEMM at the table's config and at `down_1x4.json`'s (seed). At the seed also the statistics
kernel's (rows per program, warps) beside the op's (2, 4), launched dependently with the down GEMM in 1 × 4
clusters. The first run (`stats_dependent_launch_seed*`) stopped after the seed on a bug since fixed here.
Run from the repository root with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/twelfth-run/experiments/stats_dependent_launch.py OUT [shape ...]"""
import dataclasses
import importlib
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_geglu as b  # noqa: E402
from sk.bench.timing import environment, profile_per_step, side_by_side_us  # noqa: E402

geglu = importlib.import_module("sk.ops.fused_pre_norm_geglu")
cute = importlib.import_module("sk.ops.fused_pre_norm_geglu_cute")
OP_STATS = geglu._ln_stats_kernel
DN = dict(cute.DOWN_CONFIGS)
DOWN_1X4 = dataclasses.replace(DN["small"], tile_m=128, tile_n=64, cluster_m=1, cluster_n=4)


class Launch:
    """`_ln_stats_kernel` launched dependently at (rows per program, warps)."""

    def __init__(self, rows, warps):
        self.rows, self.warps = rows, warps

    def __getitem__(self, grid):
        def run(*args, **meta):
            m = args[6]
            OP_STATS[(-(-m // self.rows),)](*args, **(meta | {"BLOCK_M": self.rows, "num_warps": self.warps}))
        return run


class StreamOrder:
    """`_ln_stats_kernel` launched in stream order, as before this change."""

    def __getitem__(self, grid):
        return lambda *args, **meta: OP_STATS[grid](*args, **(meta | {"launch_pdl": False}))


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    import quack
    results = {"environment": environment() | {"quack": quack.__version__}}
    for shape in sys.argv[2:] or ["seed", "decode", "prefill"]:
        m, d, ff = b.SHAPES[shape]
        cls = geglu.shape_class(m, d, ff)
        _, x, args = b.inference_problem(m, d, ff)
        rows = slice(None, 1024)
        ref = geglu.fused_pre_norm_geglu_reference(x[rows].double(), *[a.double() if torch.is_tensor(a) else a
                                                                       for a in args])

        def forward(stats_kernel, down):
            def fn():
                geglu._ln_stats_kernel = stats_kernel
                if down is not None:
                    cute.DOWN_CONFIGS[cls] = down
                try:
                    return geglu.fused_pre_norm_geglu(x, *args)
                finally:
                    geglu._ln_stats_kernel = OP_STATS
                    if down is not None:
                        cute.DOWN_CONFIGS[cls] = DN[cls]
            return fn

        fns = {"stats in stream order": forward(StreamOrder(), None),
               "stats dependent": forward(OP_STATS, None), "stats dependent (twin)": forward(OP_STATS, None)}
        if shape == "seed":
            fns |= {"stats in stream order, down 1x4": forward(StreamOrder(), DOWN_1X4),
                    "stats dependent, down 1x4": forward(OP_STATS, DOWN_1X4),
                    "stats dependent, down 1x4 (twin)": forward(OP_STATS, DOWN_1X4)}
            fns |= {f"stats dependent {launch}, down 1x4": forward(Launch(*launch), DOWN_1X4)
                    for launch in [(1, 1), (1, 2), (2, 2), (4, 4), (4, 8), (8, 8), (16, 16)]}
        with torch.no_grad():
            errs = {n: b.rel_err(f()[rows], ref) for n, f in fns.items()}
            print(shape, json.dumps(errs, indent=1), flush=True)
            rounds = []
            for r in range(3):
                times = side_by_side_us(fns, calls_per_replay=20, repeats=50 if shape != "prefill" else 10,
                                        on_error=lambda n, e: print("ERR", n, e))
                rounds.append(times)
                for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                    print(f"{shape} round {r} {name:40s} {us:9.2f} us", flush=True)
            kernels = {name: profile_per_step(fn)["kernels"] for name, fn in fns.items()}
        for name, ks in kernels.items():
            print(f"{shape} profile {name:36s} " + " + ".join(f"{k['us']:.2f}" for k in ks), flush=True)
        results[shape] = {"rounds": rounds, "rel_err": errs, "kernels": kernels}
        json.dump(results, open(os.path.join(out_dir, "stats_dependent_launch.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
