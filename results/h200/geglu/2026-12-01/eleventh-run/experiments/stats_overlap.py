"""Experiment (2026-12-01, H200): QuACK's gate/up GEMM waiting for the statistics kernel in its epilogue, where it
reads the statistics, instead of before its first load (`fused_pre_norm_geglu_cute.WAIT_IN_EPILOGUE`): its main
loop on x and the folded weights then runs beside the statistics kernel. With the statistics kernel's grid as
the op's (one program per two rows) or a few programs that walk the rows (`fused_pre_norm_geglu.stats_launch`:
programs, rows at a time, warps), which leave the SMs the gate/up tiles need free sooner. The whole forward in
CUDA graphs of 20 calls, replays interleaved, three rounds; the statistics kernel alone at each launch. Ran at
commit 9053599 (the switch and the row walk were taken out after). Run from the repository root there, with QuACK
on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/eleventh-run/experiments/stats_overlap.py OUT [seed prefill ...]"""
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
OP_LAUNCH = geglu.stats_launch
LAUNCHES = {"seed": [None, (2, 16, 16), (4, 16, 16), (4, 32, 16), (8, 16, 16), (16, 16, 16), (64, 16, 16),
                     (128, 8, 8)],
            "prefill": [None, (132, 16, 16)]}


def forward(x, args, wait_in_epilogue, launch):
    def fn():
        cute.WAIT_IN_EPILOGUE = wait_in_epilogue
        if launch is not None:
            geglu.stats_launch = lambda m, d, cute_gemms: launch
        try:
            return geglu.fused_pre_norm_geglu(x, *args)
        finally:
            cute.WAIT_IN_EPILOGUE, geglu.stats_launch = True, OP_LAUNCH
    return fn


def stats_kernel_alone(x, args, launches):
    m, d = x.shape
    ln_w, ln_b, eps = args[0], args[1], args[-1]
    stats = torch.empty((2, m), dtype=torch.float32, device=x.device)

    def run(launch):
        programs, rows, warps = launch or OP_LAUNCH(m, d, True)
        return lambda: geglu._ln_stats_kernel[(programs,)](
            x, stats, ln_w, ln_b, stats, stats, m, d, eps, 0, D_ALIGN=geglu._align(d), HAS_LN_BIAS=ln_b is not None,
            STORE_XN=False, ARRIVALS_BLOCK=0, PDL=False, BLOCK_M=rows, BLOCK_D=geglu._next_power_of_2(d),
            num_warps=warps)
    return side_by_side_us({str(launch or "op"): run(launch) for launch in launches}, calls_per_replay=20,
                           repeats=50, on_error=lambda n, e: print("ERR", n, e))


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    results = {"environment": environment()}
    for shape in sys.argv[2:] or ["seed"]:
        m, d, ff = b.SHAPES[shape]
        _, x, args = b.inference_problem(m, d, ff)
        rows = slice(None, 1024)
        ref = geglu.fused_pre_norm_geglu_reference(x[rows].double(), *[a.double() if torch.is_tensor(a) else a
                                                                       for a in args])
        fns = {"wait before loads, op's stats grid": forward(x, args, False, None),
               "wait before loads, op's stats grid (twin)": forward(x, args, False, None)}
        for launch in LAUNCHES[shape]:
            fns[f"wait in epilogue, stats {launch or 'op'}"] = forward(x, args, True, launch)
        fns["wait in epilogue, stats op (twin)"] = forward(x, args, True, None)
        with torch.no_grad():
            errs = {n: b.rel_err(f()[rows], ref) for n, f in fns.items()}
            print(json.dumps(errs, indent=1), flush=True)
            rounds = []
            for r in range(3):
                times = side_by_side_us(fns, calls_per_replay=20, repeats=50 if shape != "prefill" else 10,
                                        on_error=lambda n, e: print("ERR", n, e))
                rounds.append(times)
                for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                    print(f"{shape} round {r} {name:48s} {us:9.2f} us", flush=True)
            alone = stats_kernel_alone(x, args, LAUNCHES[shape])
            for name, us in alone.items():
                print(f"{shape} stats kernel alone {name:16s} {us:7.2f} us", flush=True)
        results[shape] = {"rounds": rounds, "rel_err": errs, "stats_kernel_alone": alone}
        json.dump(results, open(os.path.join(out_dir, "stats_overlap.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
