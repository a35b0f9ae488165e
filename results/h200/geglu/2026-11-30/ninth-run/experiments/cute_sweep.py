"""Experiment (2026-11-30, H200): the op's CuTe-DSL GEMM configs (sk/ops/fused_pre_norm_geglu_cute.py) varied one
at a time, the whole forward through sk.ops.fused_pre_norm_geglu in CUDA graphs of 20 calls (the benchmark's
method), variants' replays interleaved, three rounds; with "confirm", prefill's candidates beside the table and
an identical twin of it, five rounds. Run from the repository root with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-11-30/ninth-run/experiments/cute_sweep.py OUT [seed] [prefill] [confirm]"""
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
CONFIRM = "confirm" in sys.argv  # the second run: prefill's candidates only, five rounds


def confirm_variants(cls):
    """The prefill candidates of the sweep's three rounds beside the table and an identical twin of it (the
    spread between two graphs of the same code)."""
    gu, dn = cute.GATE_UP_CONFIGS[cls], cute.DOWN_CONFIGS[cls]
    coop = R(dn, tile_n=256, pingpong=False)
    return {"table": (gu, dn), "table (twin)": (gu, R(dn)), "down 128x256 coop": (gu, coop),
            "down 128x256 coop + gate/up swizzle 16": (R(gu, max_swizzle_size=16), coop),
            "gate/up swizzle 16": (R(gu, max_swizzle_size=16), dn)}


def variants(cls):
    if CONFIRM:
        return confirm_variants(cls)
    gu, dn = cute.GATE_UP_CONFIGS[cls], cute.DOWN_CONFIGS[cls]
    v = {"table": (gu, dn), "Triton GEMMs": None}
    for sw in (2, 4, 16, 32):
        v[f"gate/up swizzle {sw}"] = (R(gu, max_swizzle_size=sw), dn)
    v["gate/up cluster 1x2"] = (R(gu, cluster_m=1, cluster_n=2), dn)
    v["gate/up dynamic persistent"] = (R(gu, is_dynamic_persistent=True), dn)
    v["down swizzle 16"] = (gu, R(dn, max_swizzle_size=16))
    v["down cluster 1x2"] = (gu, R(dn, cluster_m=1, cluster_n=2))
    if cls == "large":
        v["gate/up 128x128 pp"] = (R(gu, tile_n=128), dn)
        v["down 128x256 coop"] = (gu, R(dn, tile_n=256, pingpong=False))
        v["down 128x192 pp"] = (gu, R(dn, tile_n=192))
    else:
        v["down 128x48"] = (gu, R(dn, tile_m=128, tile_n=48, cluster_m=1, cluster_n=2))
        v["down 64x96 pp"] = (gu, R(dn, pingpong=True))
        v["gate/up 128x96"] = (R(gu, tile_n=96), dn)
    return v


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    results = {"environment": environment()}
    for shape in [a for a in sys.argv[2:] if a != "confirm"] or ("seed", "prefill"):
        m, d, ff = b.SHAPES[shape]
        cls = geglu.shape_class(m, d, ff)
        _, x, args = b.inference_problem(m, d, ff)
        rows = slice(None, 1024)
        ref = geglu.fused_pre_norm_geglu_reference(x[rows].double(), *[a.double() if torch.is_tensor(a) else a
                                                                       for a in args])
        table = (cute.GATE_UP_CONFIGS[cls], cute.DOWN_CONFIGS[cls])
        fns, errs = {}, {}
        for name, cfgs in variants(cls).items():
            def fn(cfgs=cfgs):
                geglu.CUTE = cfgs is not None
                if cfgs:
                    cute.GATE_UP_CONFIGS[cls], cute.DOWN_CONFIGS[cls] = cfgs
                try:
                    return sk_op(x, *args)
                finally:
                    geglu.CUTE = True
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
            for r in range(5 if CONFIRM else 3):
                times = side_by_side_us(fns, calls_per_replay=20, repeats=25 if cls == "large" else 50,
                                        on_error=lambda n, e: print("ERR", n, e))
                rounds.append(times)
                print(f"== {shape} round {r}", flush=True)
                for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                    print(f"{shape} {name:30s} {us:9.2f} us", flush=True)
        results[shape] = {"rounds": rounds, "rel_err": errs,
                          "variants": {n: None if c is None else [dataclasses.asdict(x) for x in c]
                                       for n, c in variants(cls).items()}}
        json.dump(results, open(os.path.join(out_dir, "cute_confirm.json" if CONFIRM else "cute_sweep.json"), "w"),
                  indent=1)


def sk_op(x, *args):
    import sk
    return sk.ops.fused_pre_norm_geglu(x, *args)


if __name__ == "__main__":
    main(sys.argv[1])
