"""Experiment (2026-12-01, H200): the down GEMM letting the next kernel launch as it starts
(`fused_pre_norm_geglu_cute.RowVecLoadLaunchingDependents`, in an epilogue of our own: y = acc + x + bias) against
QuACK's default epilogue, which lets it launch after its tile loop.

Why: the next call's statistics kernel now launches dependently and waits for the down GEMM before touching
memory (`stats_dependent_launch.json`); launched early it sits on the SMs the down GEMM leaves free (36 at the seed
in 1 × 4 clusters) and starts the moment the GEMM's memory is flushed. Ran with the statistics kernel launched
dependently (the op's code at this commit). Seed at the table's down config and at `down_1x4.json`'s; prefill.
Result: slower by 0.9-1.0 µs at the seed (the statistics programs, all resident on the few free SMs, then run
there alone and hold those SMs from gate/up), prefill within its spread. Ran at the commit that adds this script;
the early trigger was taken out in the next.
Run from the repository root with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/twelfth-run/experiments/down_early_trigger.py OUT [shape ...]"""
import dataclasses
import importlib
import json
import os
import sys

import torch
from quack.gemm_interface import gemm_tuned

sys.path.insert(0, "benchmarks")
import bench_geglu as b  # noqa: E402
from sk.bench.timing import environment, profile_per_step, side_by_side_us  # noqa: E402

geglu = importlib.import_module("sk.ops.fused_pre_norm_geglu")
cute = importlib.import_module("sk.ops.fused_pre_norm_geglu_cute")
OP_DOWN = cute.down
DN = dict(cute.DOWN_CONFIGS)
DOWN_1X4 = dataclasses.replace(DN["small"], tile_m=128, tile_n=64, cluster_m=1, cluster_n=4)


def quack_default_down(h, down_weight, down_bias, x, y, shape_class):
    """The down GEMM as before: QuACK's default epilogue (residual and bias), launching dependents after its loop."""
    gemm_tuned.fn(h, down_weight.T, y, C=x, bias=down_bias, config=cute.DOWN_CONFIGS[shape_class])


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    import quack
    results = {"environment": environment() | {"quack": quack.__version__}}
    for shape in sys.argv[2:] or ["seed", "prefill"]:
        m, d, ff = b.SHAPES[shape]
        cls = geglu.shape_class(m, d, ff)
        _, x, args = b.inference_problem(m, d, ff)
        rows = slice(None, 1024)
        ref = geglu.fused_pre_norm_geglu_reference(x[rows].double(), *[a.double() if torch.is_tensor(a) else a
                                                                       for a in args])

        def forward(down_fn, config):
            def fn():
                cute.down, cute.DOWN_CONFIGS[cls] = down_fn, config
                try:
                    return geglu.fused_pre_norm_geglu(x, *args)
                finally:
                    cute.down, cute.DOWN_CONFIGS[cls] = OP_DOWN, DN[cls]
            return fn

        configs = {"table": DN[cls]} | ({"1x4": DOWN_1X4} if shape == "seed" else {})
        fns = {}
        for cname, config in configs.items():
            fns[f"down {cname}, QuACK's epilogue"] = forward(quack_default_down, config)
            fns[f"down {cname}, launching dependents at start"] = forward(OP_DOWN, config)
            fns[f"down {cname}, launching dependents at start (twin)"] = forward(OP_DOWN, config)
        errs = {}
        with torch.no_grad():
            for name, fn in list(fns.items()):
                try:
                    errs[name] = b.rel_err(fn()[rows], ref)
                except Exception as e:
                    errs[name] = f"{type(e).__name__}: {str(e)[:600]}"
                    del fns[name]
                print(shape, name, errs[name], flush=True)
            rounds = []
            for r in range(3):
                times = side_by_side_us(fns, calls_per_replay=20, repeats=50 if shape != "prefill" else 10,
                                        on_error=lambda n, e: print("ERR", n, e))
                rounds.append(times)
                for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                    print(f"{shape} round {r} {name:52s} {us:9.2f} us", flush=True)
            kernels = {name: profile_per_step(fn)["kernels"] for name, fn in fns.items()}
        for name, ks in kernels.items():
            print(f"{shape} profile {name:52s} " + " + ".join(f"{k['us']:.2f}" for k in ks), flush=True)
        results[shape] = {"rounds": rounds, "rel_err": errs, "kernels": kernels}
        json.dump(results, open(os.path.join(out_dir, "down_early_trigger.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
