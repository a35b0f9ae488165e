"""Experiment (2026-12-01, H200): at the seed shape with QuACK's GEMMs, the statistics kernel letting QuACK's gate/up
kernel launch at its start (programmatic dependent launch; QuACK's kernels wait before their first load) against
stream order (`geglu.PDL` off, which on the QuACK path only changes that), and the statistics kernel's rows per
program. The whole forward in CUDA graphs of 20 calls, replays interleaved, three rounds. Run from the
repository root with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/tenth-run/experiments/stats_pdl.py OUT"""
import importlib
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_geglu as b  # noqa: E402
from sk.bench.timing import environment, side_by_side_us  # noqa: E402

geglu = importlib.import_module("sk.ops.fused_pre_norm_geglu")


def stats_kernel_alone(x, args):
    """The statistics kernel alone at (rows per program, warps) around the op's choice, µs per call."""
    m, d = x.shape
    ln_w, ln_b, eps = args[0], args[1], args[-1]
    stats = torch.empty((2, m), dtype=torch.float32, device=x.device)
    block_d = geglu._next_power_of_2(d)

    def launch(rows, warps):
        return lambda: geglu._ln_stats_kernel[(geglu._cdiv(m, rows),)](
            x, stats, ln_w, ln_b, stats, stats, m, d, eps, 0, D_ALIGN=geglu._align(d), HAS_LN_BIAS=ln_b is not None,
            STORE_XN=False, ARRIVALS_BLOCK=0, PDL=False, BLOCK_M=rows, BLOCK_D=block_d, num_warps=warps)
    fns = {f"{rows} rows, {warps} warps": launch(rows, warps)
           for rows, warps in [(2, 4), (1, 2), (1, 4), (2, 8), (4, 4), (4, 8), (8, 8), (8, 16)]}
    times = side_by_side_us(fns, calls_per_replay=20, repeats=50, on_error=lambda n, e: print("ERR", n, e))
    for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
        print(f"stats kernel {name:20s} {us:7.2f} us", flush=True)
    return times


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    results = {"environment": environment()}
    for shape in sys.argv[2:] or ["seed"]:
        m, d, ff = b.SHAPES[shape]
        _, x, args = b.inference_problem(m, d, ff)
        rows = slice(None, 1024)
        ref = geglu.fused_pre_norm_geglu_reference(x[rows].double(), *[a.double() if torch.is_tensor(a) else a
                                                                       for a in args])

        def run(pdl):
            def fn():
                geglu.PDL = pdl
                try:
                    return geglu.fused_pre_norm_geglu(x, *args)
                finally:
                    geglu.PDL = True
            return fn
        fns = {"stats triggers gate/up": run(True), "stats triggers gate/up (twin)": run(True),
               "stream order": run(False), "stream order (twin)": run(False)}
        with torch.no_grad():
            errs = {n: b.rel_err(f()[rows], ref) for n, f in fns.items()}
            print(errs, flush=True)
            rounds = []
            for r in range(3):
                times = side_by_side_us(fns, calls_per_replay=20, repeats=50 if shape != "prefill" else 20)
                rounds.append(times)
                for name, us in sorted(times.items(), key=lambda kv: kv[1]):
                    print(f"{shape} round {r} {name:32s} {us:9.2f} us", flush=True)
        results[shape] = {"rounds": rounds, "rel_err": errs, "stats_kernel": stats_kernel_alone(x, args)}
    json.dump(results, open(os.path.join(out_dir, "stats_pdl.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
