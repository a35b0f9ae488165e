"""Experiment (2026-12-01, H200): the seed's two QuACK GEMMs in 2 × 2 clusters at tiles that make at most as many
CTAs as four-CTA clusters can keep resident at once.

Why: at the seed both GEMMs run one tile per CTA and their time follows the bytes each CTA pulls from L2 (tenth
run: one-CTA clusters 11.3 µs for down against 8.8 in 2 × 1, about the ratio of their bytes once ~2.5 µs of fixed
cost is taken off). A 2 × 2 cluster multicasts both operands, a quarter less per CTA again. The tenth run's 2 × 2
clusters ran 29.7 µs, every cluster of four or eight alike: the table's 128 tiles are 32 clusters of four, and if
fewer than 32 such clusters fit at once (printed here), QuACK's persistent schedule gives some CTAs two tiles.
Tiles of 128 × 208 (gate/up, 8 × 14 = 112 CTAs) or 64 × 112 (down, 16 × 7 = 112) make 28 clusters.
The whole forward through sk.ops.fused_pre_norm_geglu in CUDA graphs of 20 calls, replays interleaved, three rounds.
Run from the repository root with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/twelfth-run/experiments/cluster4_tiles.py OUT cluster4|down_clusters|down_1x4"""
import dataclasses
import importlib
import json
import os
import sys

import cutlass.utils
import torch

sys.path.insert(0, "benchmarks")
import bench_geglu as b  # noqa: E402
from sk.bench.timing import environment, profile_per_step, side_by_side_us  # noqa: E402

geglu = importlib.import_module("sk.ops.fused_pre_norm_geglu")
cute = importlib.import_module("sk.ops.fused_pre_norm_geglu_cute")
R = dataclasses.replace
GU, DN = cute.GATE_UP_CONFIGS["small"], cute.DOWN_CONFIGS["small"]


def gu(tile_n, cm=2, cn=2):
    return R(GU, tile_n=tile_n, cluster_m=cm, cluster_n=cn)


def dn(tile_m, tile_n, cm=2, cn=2):
    return R(DN, tile_m=tile_m, tile_n=tile_n, cluster_m=cm, cluster_n=cn)


VARIANT_SETS = {
    # First run: which clusters of four fit; gate/up's acc_pair epilogue turned out to need tile_n % 32 == 0.
    "cluster4": {
        "table": (GU, DN), "table (twin)": (R(GU), R(DN)),
        "gate/up 128x208 2x2": (gu(208), DN), "gate/up 128x224 2x2": (gu(224), DN),
        "gate/up 128x256 2x2": (gu(256), DN), "gate/up 128x208 2x1": (gu(208, 2, 1), DN),
        "gate/up 128x208 4x1": (gu(208, 4, 1), DN),
        "down 64x112 2x2": (GU, dn(64, 112)), "down 64x128 2x2": (GU, dn(64, 128)),
        "down 128x64 2x2": (GU, dn(128, 64)), "down 64x112 4x1": (GU, dn(64, 112, 4, 1)),
        "both 208 / 64x112 2x2": (gu(208), dn(64, 112)), "both 224 / 64x128 2x2": (gu(224), dn(64, 128)),
    },
    # Second: down in the larger clusters that fit (at most 30 of four, 15 of eight), and where its time goes.
    "down_clusters": {
        "table": (GU, DN), "table (twin)": (R(GU), R(DN)),
        "down 64x112 4x1": (GU, dn(64, 112, 4, 1)), "down 64x112 4x1 (twin)": (GU, dn(64, 112, 4, 1)),
        "down 64x112 8x1": (GU, dn(64, 112, 8, 1)), "down 64x128 4x2": (GU, dn(64, 128, 4, 2)),
        "down 64x128 4x1": (GU, dn(64, 128, 4, 1)), "down 64x128 8x1": (GU, dn(64, 128, 8, 1)),
        "down 128x64 1x4": (GU, dn(128, 64, 1, 4)), "down 128x64 2x4": (GU, dn(128, 64, 2, 4)),
        "down 64x112 4x1 swizzle 1": (GU, R(dn(64, 112, 4, 1), max_swizzle_size=1)),
        "down 64x112 4x1 swizzle 16": (GU, R(dn(64, 112, 4, 1), max_swizzle_size=16)),
    },
    # Third: around the second's best, down in 128 × 64 tiles multicasting h across four CTAs along N.
    "down_1x4": {
        "table": (GU, DN), "table (twin)": (R(GU), R(DN)),
        "down 128x64 1x4": (GU, dn(128, 64, 1, 4)), "down 128x64 1x4 (twin)": (GU, dn(128, 64, 1, 4)),
        "down 128x64 1x4 tile_k 128": (GU, R(dn(128, 64, 1, 4), tile_k=128)),
        "down 128x64 1x4 tile_k 32": (GU, R(dn(128, 64, 1, 4), tile_k=32)),
        "down 128x64 1x2": (GU, dn(128, 64, 1, 2)), "down 128x96 1x4": (GU, dn(128, 96, 1, 4)),
        "down 128x64 1x4 swizzle 1": (GU, R(dn(128, 64, 1, 4), max_swizzle_size=1)),
        "down 128x64 1x4, gate/up swizzle 1": (R(GU, max_swizzle_size=1), dn(128, 64, 1, 4)),
        "down 128x64 1x4, gate/up swizzle 16": (R(GU, max_swizzle_size=16), dn(128, 64, 1, 4)),
    },
}
VARIANTS = VARIANT_SETS[sys.argv[2]]


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    import quack
    m, d, ff = b.SHAPES["seed"]
    _, x, args = b.inference_problem(m, d, ff)  # also makes the CUDA context HardwareInfo queries in
    hw = cutlass.utils.HardwareInfo()
    clusters = {n: hw.get_max_active_clusters(cluster_size=n) for n in (1, 2, 4, 8)}
    print("max active clusters by size:", clusters, flush=True)
    results = {"environment": environment() | {"quack": quack.__version__}, "max_active_clusters": clusters}
    ref = geglu.fused_pre_norm_geglu_reference(x.double(), *[a.double() if torch.is_tensor(a) else a for a in args])
    fns, errs = {}, {}
    for name, cfgs in VARIANTS.items():
        def fn(cfgs=cfgs):
            cute.GATE_UP_CONFIGS["small"], cute.DOWN_CONFIGS["small"] = cfgs
            try:
                return geglu.fused_pre_norm_geglu(x, *args)
            finally:
                cute.GATE_UP_CONFIGS["small"], cute.DOWN_CONFIGS["small"] = GU, DN
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
            print(f"== seed round {r}", flush=True)
            for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                print(f"seed {name:26s} {us:9.2f} us" if us else f"seed {name:26s} failed", flush=True)
        kernels = {name: profile_per_step(fn)["kernels"] for name, fn in fns.items()}
    for name, ks in kernels.items():
        print(f"profile {name:26s} " + " + ".join(f"{k['us']:.2f}" for k in ks), flush=True)
    results["seed"] = {"rounds": rounds, "rel_err": errs, "kernels": kernels,
                       "variants": {n: [dataclasses.asdict(c) for c in cs] for n, cs in VARIANTS.items()}}
    json.dump(results, open(os.path.join(out_dir, f"{sys.argv[2]}.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
