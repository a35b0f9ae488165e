"""Experiment (2026-12-01, H200): split-K for the seed shape's down projection (1024 × 1448 → 768) through QuACK's
SM90 GEMM (its `split_k`, SERIAL: per-tile turnstile in split order, deterministic; PARALLEL: arrival order), the
whole forward through sk.ops.fused_pre_norm_geglu in CUDA graphs of 20 calls (the benchmark's method), variants'
replays interleaved, three rounds. The down GEMM at 64 × 96 tiles runs 128 CTAs of 23 k-tiles each; split-K
gives bigger tiles (less operand traffic per CTA) at the same CTA count. Run from the repository root with QuACK
on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/tenth-run/experiments/split_k.py OUT"""
import dataclasses
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
from quack.gemm_config import SplitKMode  # noqa: E402
from quack.gemm_interface import gemm_tuned  # noqa: E402

R = dataclasses.replace
SERIAL, PARALLEL = SplitKMode.SERIAL, SplitKMode.PARALLEL


def variants():
    dn = cute.DOWN_CONFIGS["small"]  # 64 × 96 cooperative, cluster 2 × 1
    coop = R(dn, pingpong=False)
    v = {"table": (dn, 1, SERIAL), "table (twin)": (R(dn), 1, SERIAL)}
    for (tm, tn), s in [((128, 96), 2), ((64, 192), 2), ((128, 192), 4), ((128, 128), 2), ((128, 256), 4),
                        ((64, 96), 2), ((128, 192), 2), ((128, 192), 3)]:
        v[f"{tm}x{tn} coop split {s}"] = (R(coop, tile_m=tm, tile_n=tn), s, SERIAL)
    v["128x96 coop split 2 parallel"] = (R(coop, tile_m=128, tile_n=96), 2, PARALLEL)
    v["128x192 coop split 4 parallel"] = (R(coop, tile_m=128, tile_n=192), 4, PARALLEL)
    v["128x96 ping-pong split 2"] = (R(dn, tile_m=128, tile_n=96, pingpong=True), 2, SERIAL)
    v["128x192 ping-pong split 4"] = (R(dn, tile_m=128, tile_n=192, pingpong=True), 4, SERIAL)
    return v


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    import quack
    results = {"environment": environment() | {"quack": quack.__version__}}
    m, d, ff = b.SHAPES["seed"]
    _, x, args = b.inference_problem(m, d, ff)
    ref = geglu.fused_pre_norm_geglu_reference(x.double(), *[a.double() if torch.is_tensor(a) else a for a in args])
    table_down = cute.down
    fns, errs = {}, {}
    for name, (cfg, split, mode) in variants().items():
        def down(h, wd, bd, x2, y, shape_class, cfg=cfg, split=split, mode=mode):
            gemm_tuned.fn(h, wd.T, y, C=x2, bias=bd, config=cfg, split_k=split, split_k_mode=mode)

        def fn(down=down):
            cute.down = down
            try:
                return geglu.fused_pre_norm_geglu(x, *args)
            finally:
                cute.down = table_down
        try:
            with torch.no_grad():
                errs[name] = b.rel_err(fn(), ref)
            fns[name] = fn
        except Exception as e:
            errs[name] = f"{type(e).__name__}: {str(e)[:300]}"
        print(name, errs[name], flush=True)
    rounds = []
    with torch.no_grad():
        for r in range(3):
            times = side_by_side_us(fns, calls_per_replay=20, repeats=50, on_error=lambda n, e: print("ERR", n, e))
            rounds.append(times)
            print(f"== round {r}", flush=True)
            for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                print(f"{name:36s} {us:9.2f} us" if us else f"{name:36s} failed", flush=True)
    results["seed"] = {"rounds": rounds, "rel_err": errs,
                       "variants": {n: [dataclasses.asdict(c), s, int(md)] for n, (c, s, md) in variants().items()}}
    json.dump(results, open(os.path.join(out_dir, "split_k.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
