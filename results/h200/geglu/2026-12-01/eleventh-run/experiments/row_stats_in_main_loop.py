"""Experiment (2026-12-01, H200): the gate/up GEMM computing the LayerNorm statistics in its own main loop
(`fused_pre_norm_geglu_cute.gate_up_with_row_stats`: the 256 consumer threads sum the rows of each x k-tile in
shared memory, two threads a row, and write mean and 1/std to the epilogue's shared memory), so that no
statistics kernel runs, against the op (statistics kernel, gate/up waiting for it in its epilogue). Error against
fp64 at the seed, at shapes with partial row and k-tiles, and on inputs whose mean is large against their spread;
the whole forward at the seed in CUDA graphs of 20 calls, replays interleaved, three rounds; at the last commit
beside it, what the main loop's hooks cost without the summing, and without the copying either
(`fused_pre_norm_geglu_cute.ROW_STATS_WORK`, wrong outputs, timing only). The code it ran against was taken out
again; it ran at four commits, each result file named by its variant:
    f227109 row sums in a wrapper of each k-tile's wgmma issue (ptxas put them between the 4 wgmmas)
            -> row_stats_between_wgmmas.json
    cee81c7 row sums as each k-tile's stage is released (after its wgmmas) -> row_stats_after_wgmma.json
    67f310b rows copied before the release and summed after it, 16-byte chunks in a bank-conflict-free order
            -> row_stats_conflict_free.json
    7a9f0fa the same, with the diagnostic variants (--timing-only) -> row_stats_diagnostic.json
Run from the repository root at one of those commits with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/eleventh-run/experiments/row_stats_in_main_loop.py OUT [--timing-only]"""
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
OP_GATE_UP, OP_STATS = cute.gate_up, geglu._ln_stats_kernel


class NotLaunched:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def forward(x, args, row_stats, work="copy and sum"):
    eps = args[-1]

    def gate_up(x, stats, folded, fold, h, approximate, shape_class):
        cute.gate_up_with_row_stats(x, stats, folded, fold, h, eps, approximate, shape_class)

    def fn():
        if row_stats:
            cute.gate_up, geglu._ln_stats_kernel, cute.ROW_STATS_WORK = gate_up, NotLaunched(), work
        try:
            return geglu.fused_pre_norm_geglu(x, *args)
        finally:
            cute.gate_up, geglu._ln_stats_kernel, cute.ROW_STATS_WORK = OP_GATE_UP, OP_STATS, "copy and sum"
    return fn


def errors():
    out = {}
    for m, d, ff, shift in [(1024, 768, 1448, 0.0), (1000, 200, 520, 0.0), (333, 1000, 1448, 0.0),
                            (1024, 768, 1448, 100.0), (1000, 40, 24, 30.0)]:
        _, x, args = b.inference_problem(m, d, ff)
        x = x + shift
        ref = geglu.fused_pre_norm_geglu_reference(x.double(), *[a.double() if torch.is_tensor(a) else a
                                                                 for a in args])
        with torch.no_grad():
            out[f"{m}x{d}->{ff}, x + {shift}"] = {
                "op": b.rel_err(forward(x, args, False)(), ref),
                "row stats in main loop": b.rel_err(forward(x, args, True)(), ref)}
        print(out, flush=True)
    return out


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    results = {"environment": environment(), "rel_err": errors() if "--timing-only" not in sys.argv else None,
               "rounds": []}
    m, d, ff = b.SHAPES["seed"]
    _, x, args = b.inference_problem(m, d, ff)
    fns = {"op": forward(x, args, False), "op (twin)": forward(x, args, False),
           "row stats in main loop": forward(x, args, True), "row stats in main loop (twin)": forward(x, args, True),
           "row stats: rows copied, not summed (wrong output)": forward(x, args, True, "copy"),
           "row stats: neither copied nor summed (wrong output)": forward(x, args, True, "none")}
    with torch.no_grad():
        for r in range(3):
            times = side_by_side_us(fns, calls_per_replay=20, repeats=50, on_error=lambda n, e: print("ERR", n, e))
            results["rounds"].append(times)
            for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                print(f"seed round {r} {name:36s} {us:8.2f} us", flush=True)
    json.dump(results, open(os.path.join(out_dir, "row_stats_in_main_loop.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])  # --timing-only: skip the errors
