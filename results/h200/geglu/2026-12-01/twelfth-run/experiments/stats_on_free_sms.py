"""Experiment (2026-12-01, H200): the statistics kernel on the few SMs gate/up leaves free, walking the rows with
its loads pipelined, so that it never holds an SM that a gate/up CTA waits for.

Why: at the seed QuACK's gate/up runs 128 CTAs on 132 SMs and starts its main loop while the statistics kernel
runs (eleventh run); yet the statistics still cost ~1.35 µs of the forward (19.95 µs without them). A gate/up CTA
takes a whole SM's registers, so it starts on an SM only once every statistics program there has left: the op's
512 programs touch every SM. Four programs would sit on the four SMs gate/up does not use, if each can read its
256 rows (393 KB) before gate/up's epilogue needs them (~8 µs in). The eleventh run's row walk on 2-16 programs
was latency-bound (4 programs: 23.5 µs alone); this one pipelines its loads (`num_stages`).
The down GEMM runs here at the config of `down_1x4.json` (128 × 64 tiles, 1 × 4 clusters).
Two walks: `pointer` (first run: loads of [rows, 1024] through pointers, `tl.range(num_stages=...)`), which ran
~1 µs per step of 8 rows in the forward, latency-bound; `tma` (second run), the rows through TMA descriptors in
256-column boxes, which Triton's pipeliner keeps `STAGES` steps ahead. "alone" times each walk in a graph of 20
calls twice: launched dependently (the calls overlap, so that is throughput) and in stream order (latency).
Run from the repository root with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/twelfth-run/experiments/stats_on_free_sms.py OUT pointer|tma"""
import dataclasses
import importlib
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, "benchmarks")
import bench_geglu as b  # noqa: E402
from sk.bench.timing import environment, profile_per_step, side_by_side_us  # noqa: E402

geglu = importlib.import_module("sk.ops.fused_pre_norm_geglu")
cute = importlib.import_module("sk.ops.fused_pre_norm_geglu_cute")
OP_STATS = geglu._ln_stats_kernel
DN = cute.DOWN_CONFIGS["small"]
DOWN_1X4 = dataclasses.replace(DN, tile_m=128, tile_n=64, cluster_m=1, cluster_n=4)


@triton.jit(do_not_specialize=["n_rows", "eps"])
def _ln_stats_walk_kernel(x_ptr, stats_ptr, n_rows, d, eps, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                          STAGES: tl.constexpr):
    gdc_launch_dependents()
    cols = tl.arange(0, BLOCK_D)[None, :]
    for first in tl.range(tl.program_id(0) * BLOCK_M, n_rows, tl.num_programs(0) * BLOCK_M, num_stages=STAGES):
        rows = first + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & (cols < d)
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * d + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / d
        centered = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(centered * centered, axis=1) / d + eps)
        tl.store(stats_ptr + rows, mean, mask=row_ok)
        tl.store(stats_ptr + n_rows + rows, rstd, mask=row_ok)


@triton.jit(do_not_specialize=["n_rows", "eps"])
def _ln_stats_tma_walk_kernel(x_desc, stats_ptr, n_rows, d, eps, BLOCK_M: tl.constexpr, BOX_D: tl.constexpr,
                              STAGES: tl.constexpr):
    gdc_launch_dependents()
    for first in tl.range(tl.program_id(0) * BLOCK_M, n_rows, tl.num_programs(0) * BLOCK_M, num_stages=STAGES):
        # d == 3 · BOX_D here (768): the row in three boxes held in registers, for the op's two exact passes
        # (boxes past d would read zeros).
        x0 = x_desc.load([first, 0]).to(tl.float32)
        x1 = x_desc.load([first, BOX_D]).to(tl.float32)
        x2 = x_desc.load([first, 2 * BOX_D]).to(tl.float32)
        mean = (tl.sum(x0, axis=1) + tl.sum(x1, axis=1) + tl.sum(x2, axis=1)) / d
        c0, c1, c2 = x0 - mean[:, None], x1 - mean[:, None], x2 - mean[:, None]
        rstd = tl.rsqrt((tl.sum(c0 * c0, axis=1) + tl.sum(c1 * c1, axis=1) + tl.sum(c2 * c2, axis=1)) / d + eps)
        rows = first + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        tl.store(stats_ptr + rows, mean, mask=row_ok)
        tl.store(stats_ptr + n_rows + rows, rstd, mask=row_ok)


class Walk:
    """Stands in for `_ln_stats_kernel[grid](...)` on the inference path: the walk at a fixed launch."""

    def __init__(self, programs, rows, warps, stages, pdl=True):
        self.launch, self.pdl = (programs, rows, warps, stages), pdl

    def __getitem__(self, grid):
        programs, rows, warps, stages = self.launch

        def run(x, stats, ln_w, ln_b, xn, arrivals, m, d, eps, tiles, **meta):
            assert not meta["STORE_XN"] and not meta["ARRIVALS_BLOCK"] and meta["PDL"]
            if WALK == "tma":
                _ln_stats_tma_walk_kernel[(programs,)](
                    TensorDescriptor.from_tensor(x, [rows, 256]), stats, m, d, eps, BLOCK_M=rows, BOX_D=256,
                    STAGES=stages, num_warps=warps, launch_pdl=self.pdl)
            else:
                _ln_stats_walk_kernel[(programs,)](x, stats, m, d, eps, BLOCK_M=rows, BLOCK_D=meta["BLOCK_D"],
                                                   STAGES=stages, num_warps=warps, launch_pdl=self.pdl)
        return run


WALK = sys.argv[2]
LAUNCHES = {"pointer": [(4, 8, 8, 3), (4, 8, 8, 4), (4, 4, 4, 4), (4, 16, 16, 3), (4, 8, 4, 6), (2, 8, 8, 4),
                        (8, 8, 8, 3), (12, 8, 8, 3)],
            "tma": [(4, 16, 8, 3), (4, 32, 8, 2), (4, 16, 4, 4), (4, 8, 4, 4), (4, 32, 16, 3), (8, 16, 8, 3),
                    (2, 32, 8, 3), (16, 16, 8, 2)]}[WALK]


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    import quack
    results = {"environment": environment() | {"quack": quack.__version__}}
    m, d, ff = b.SHAPES["seed"]
    _, x, args = b.inference_problem(m, d, ff)
    ref = geglu.fused_pre_norm_geglu_reference(x.double(), *[a.double() if torch.is_tensor(a) else a for a in args])

    def forward(down, stats_kernel):
        def fn():
            cute.DOWN_CONFIGS["small"], geglu._ln_stats_kernel = down, stats_kernel
            try:
                return geglu.fused_pre_norm_geglu(x, *args)
            finally:
                cute.DOWN_CONFIGS["small"], geglu._ln_stats_kernel = DN, OP_STATS
        return fn

    fns = {"table": forward(DN, OP_STATS), "down 1x4": forward(DOWN_1X4, OP_STATS),
           "down 1x4 (twin)": forward(DOWN_1X4, OP_STATS)}
    for launch in LAUNCHES:
        fns[f"down 1x4, stats walk {launch}"] = forward(DOWN_1X4, Walk(*launch))
    errs = {}
    with torch.no_grad():
        for name, fn in list(fns.items()):
            try:
                errs[name] = b.rel_err(fn(), ref)
            except Exception as e:
                errs[name] = f"{type(e).__name__}: {str(e)[:300]}"
                del fns[name]
            print(name, errs[name], flush=True)
        rounds = []
        for r in range(3):
            times = side_by_side_us(fns, calls_per_replay=20, repeats=50, on_error=lambda n, e: print("ERR", n, e))
            rounds.append(times)
            print(f"== seed round {r}", flush=True)
            for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                print(f"seed {name:40s} {us:9.2f} us" if us else f"seed {name:40s} failed", flush=True)
        kernels = {name: profile_per_step(fn)["kernels"] for name, fn in fns.items()}
        stats = torch.empty((2, m), dtype=torch.float32, device=x.device)
        alone = side_by_side_us({f"{launch}{' in stream order' if not pdl else ''}": (
            lambda launch=launch, pdl=pdl: Walk(*launch, pdl=pdl)[None](
                x, stats, None, None, None, None, m, d, args[-1], 0, STORE_XN=False, ARRIVALS_BLOCK=0, PDL=True,
                BLOCK_D=1024)) for launch in LAUNCHES for pdl in (True, False)}, calls_per_replay=20, repeats=50)
    for name, ks in kernels.items():
        print(f"profile {name:40s} " + " + ".join(f"{k['us']:.2f}" for k in ks), flush=True)
    for name, us in alone.items():
        print(f"stats walk alone {name:32s} {us:7.2f} us", flush=True)
    results["seed"] = {"rounds": rounds, "rel_err": errs, "kernels": kernels, "stats_walk_alone": alone}
    json.dump(results, open(os.path.join(out_dir, f"stats_on_free_sms_{WALK}.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
