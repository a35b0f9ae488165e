"""Experiments (2026-11-30, H200) at prefill: the whole forward in CUDA graphs, the variants' replays interleaved
(sk.bench.timing.side_by_side_us), three rounds each. Run from the repository root:

    python3 results/h200/geglu/2026-11-30/eighth-run/experiments/prefill_exp.py group|group2|pingpong OUT

group:    row tiles per group of the grouped tile order (GemmConfig.group_m), gate/up and down, folded inference
          and the prologue kernel (inference without the fold; training's gate/up is that kernel) -> group.json;
group2:   the same at more group sizes, and at d_model 4096 (8192 x 4096 -> 14336) -> group2.json;
down:     the down kernel's group with gate/up's at 32 -> down.json;
pingpong: gate/up on 64-row tiles, two programs per SM (one's epilogue beside the other's main loop), against
          the table's 128-row tiles on one program per SM -> pingpong.json.
The tables of that day held group_m 8 (group and group2 replace it; pingpong ran the tables with 32)."""
import dataclasses
import importlib
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_geglu as b  # noqa: E402
from sk.bench.timing import side_by_side_us  # noqa: E402

g = importlib.import_module("sk.ops.fused_pre_norm_geglu")


def forward_fns(m, d, ff, variants):
    """{name: one forward} for variants {name: (kernel, gate/up config or a function of the table's, same
    for down)}, kernel "folded" or "prologue"; each checked against the first for identical bits (the tile
    order and the tile shape change no sums: K is walked in the same blocks)."""
    block, x = b.make_problem(m, d, ff)
    block = block.to(torch.bfloat16)
    ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps = b.op_args(block)
    folded, fold = g._folded_gate_up(ln_w, ln_b, wg, bg, wu, bu, x.dtype)
    fns = {}
    for name, (kernel, gate_up, down) in variants.items():
        table = g.choose_configs(m, d, ff, kernel)
        cfgs = tuple(c(t) if callable(c) else c for c, t in zip((gate_up, down), table))
        args = ((x, ln_w, ln_b, folded, bg, None, bu, wd, bd, eps, "none", False, cfgs, fold) if kernel == "folded"
                else (x, ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps, "none", False, cfgs))
        fns[name] = lambda args=args: g._forward_kernels(*args)
    refs = {}
    for name, fn in fns.items():
        kernel = variants[name][0]
        out = fn()[0]
        assert torch.equal(out, refs.setdefault(kernel, out)), name
    return fns


def grouped(kernel, gate_up_group, down_group):
    return (kernel, lambda c: dataclasses.replace(c, group_m=gate_up_group, group_rows_bytes=0),
            lambda c: dataclasses.replace(c, group_m=down_group, group_rows_bytes=0))


def experiments(name):
    prefill = b.SHAPES["prefill"]
    if name == "group":
        pairs = ((8, 8), (16, 8), (32, 8), (32, 4), (16, 4), (64, 8))
        yield prefill, {f"{k} gate/up g{gu} down g{dn}": grouped(k, gu, dn)
                        for k in ("folded", "prologue") for gu, dn in pairs}
    elif name == "group2":
        for shape, pairs in ((prefill, ((8, 8), (24, 4), (32, 4), (40, 4), (32, 2), (32, 16))),
                             ((8192, 4096, 14336), ((8, 8), (8, 4), (16, 4), (32, 4)))):
            m, d, ff = shape
            yield shape, {f"{m}x{d}->{ff} folded gate/up g{gu} down g{dn}": grouped("folded", gu, dn)
                          for gu, dn in pairs}
    elif name == "down":
        pairs = ((32, 8), (32, 4), (32, 2), (32, 16))
        yield prefill, {f"{k} gate/up g{gu} down g{dn}": grouped(k, gu, dn)
                        for k in ("folded", "prologue") for gu, dn in pairs}
    elif name == "pingpong":
        same = lambda c: c  # noqa: E731
        variants = {"table 128x128 w8 s4 p1 g32": ("folded", same, same),
                    "128x128 w8 s3 p1 g32": ("folded", lambda c: dataclasses.replace(c, num_stages=3), same)}
        for per_sm in (0, 2):
            for group in (32, 64):
                variants[f"64x128 w4 s2 p{per_sm} g{group}"] = (
                    "folded", g.GemmConfig(64, 128, 64, 4, 2, group_m=group, programs_per_sm=per_sm), same)
        yield prefill, variants


def main(name, out_dir):
    rounds = []
    for shape, variants in experiments(name):
        fns = forward_fns(*shape, variants)
        for r in range(3):
            us = side_by_side_us(fns, calls_per_replay=20, repeats=9, on_error=lambda n, e: print("ERR", n, e))
            rounds.append(us)
            for label, t in us.items():
                print(f"round {r} {label:55s} {t:9.1f} us", flush=True)
        del fns
        torch.cuda.empty_cache()
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump({"meta": b.environment(), "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
