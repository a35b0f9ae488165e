"""Experiment (2026-12-01, H200): the op's two QuACK GEMMs at configs beside its table, the whole forward through
sk.ops.fused_pre_norm_geglu in CUDA graphs of 20 calls (the benchmark's method), variants' replays interleaved,
three rounds. Two sweeps:
- clusters: thread-block cluster shapes. At the seed shape both GEMMs move ~42 MB from L2 into shared memory
  (gate/up: x re-read by 16 column tiles, the weights by 8 row tiles halved by 2 × 1 multicast) in ~10 µs, near the
  L2's bandwidth; a cluster of 2 × 2 also multicasts x, 4 × 2 halves both again.
- tile_k_swap (seed): k-tiles of 128 (half the main-loop iterations and barrier round trips) or 32, and the down
  projection computed transposed (swap_ab: yᵀ = W·hᵀ, tiles over d × M; 64 × 96 tiles make 12 × 11 = 132 CTAs).
Run from the repository root with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/tenth-run/experiments/config_sweep.py OUT clusters|tile_k_swap [shape ...]"""
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
R = dataclasses.replace
CLUSTERS = {"seed": [(2, 2), (4, 1), (4, 2), (2, 4), (8, 1), (1, 4), (1, 1)], "prefill": [(2, 2), (4, 1), (1, 2)]}


def cluster_variants(shape, gu, dn):
    v = {}
    for cm, cn in CLUSTERS[shape]:
        v[f"gate/up {cm}x{cn}"] = (R(gu, cluster_m=cm, cluster_n=cn), dn)
        v[f"down {cm}x{cn}"] = (gu, R(dn, cluster_m=cm, cluster_n=cn))
    v["both 2x2"] = (R(gu, cluster_m=2, cluster_n=2), R(dn, cluster_m=2, cluster_n=2))
    if shape == "seed":
        v["both 4x2"] = (R(gu, cluster_m=4, cluster_n=2), R(dn, cluster_m=4, cluster_n=2))
        v["both 4x1"] = (R(gu, cluster_m=4, cluster_n=1), R(dn, cluster_m=4, cluster_n=1))
    return v


def tile_k_swap_variants(shape, gu, dn):
    return {"gate/up tile_k 128": (R(gu, tile_k=128), dn), "down tile_k 128": (gu, R(dn, tile_k=128)),
            "both tile_k 128": (R(gu, tile_k=128), R(dn, tile_k=128)),
            "gate/up tile_k 32": (R(gu, tile_k=32), dn), "down tile_k 32": (gu, R(dn, tile_k=32)),
            "down swap 64x96": (gu, R(dn, swap_ab=True)),
            "down swap 128x64": (gu, R(dn, swap_ab=True, tile_m=128, tile_n=64)),
            "down swap 64x128": (gu, R(dn, swap_ab=True, tile_n=128)),
            "down swap 128x96 1x2": (gu, R(dn, swap_ab=True, tile_m=128, cluster_m=1, cluster_n=2)),
            "down 64x112": (gu, R(dn, tile_n=112))}


SWEEPS = {"clusters": (cluster_variants, ("seed", "prefill")), "tile_k_swap": (tile_k_swap_variants, ("seed",))}
SWEEP = sys.argv[2]


def variants(shape, cls):
    gu, dn = cute.GATE_UP_CONFIGS[cls], cute.DOWN_CONFIGS[cls]
    return {"table": (gu, dn), "table (twin)": (R(gu), R(dn))} | SWEEPS[SWEEP][0](shape, gu, dn)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    import quack
    results = {"environment": environment() | {"quack": quack.__version__}}
    for shape in sys.argv[3:] or SWEEPS[SWEEP][1]:
        m, d, ff = b.SHAPES[shape]
        cls = geglu.shape_class(m, d, ff)
        _, x, args = b.inference_problem(m, d, ff)
        rows = slice(None, 1024)
        ref = geglu.fused_pre_norm_geglu_reference(x[rows].double(), *[a.double() if torch.is_tensor(a) else a
                                                                       for a in args])
        table = (cute.GATE_UP_CONFIGS[cls], cute.DOWN_CONFIGS[cls])
        fns, errs = {}, {}
        for name, cfgs in variants(shape, cls).items():
            def fn(cfgs=cfgs):
                cute.GATE_UP_CONFIGS[cls], cute.DOWN_CONFIGS[cls] = cfgs
                try:
                    return geglu.fused_pre_norm_geglu(x, *args)
                finally:
                    cute.GATE_UP_CONFIGS[cls], cute.DOWN_CONFIGS[cls] = table
            try:
                with torch.no_grad():
                    errs[name] = b.rel_err(fn()[rows], ref)
                fns[name] = fn
            except Exception as e:
                errs[name] = f"{type(e).__name__}: {str(e)[:300]}"
            print(shape, name, errs[name], flush=True)
        rounds = []
        with torch.no_grad():
            for r in range(3):
                times = side_by_side_us(fns, calls_per_replay=20, repeats=50 if shape == "seed" else 15,
                                        on_error=lambda n, e: print("ERR", n, e))
                rounds.append(times)
                print(f"== {shape} round {r}", flush=True)
                for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                    print(f"{shape} {name:24s} {us:9.2f} us" if us else f"{shape} {name:24s} failed", flush=True)
        results[shape] = {"rounds": rounds, "rel_err": errs,
                          "variants": {n: [dataclasses.asdict(c) for c in cs] for n, cs in variants(shape, cls).items()}}
        json.dump(results, open(os.path.join(out_dir, f"{SWEEP}.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
