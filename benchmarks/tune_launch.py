"""Sweep the launch configurations of the norm and activation kernels on a GPU; prints the fastest per size.

The op files pick configs by a fixed rule (no autotuning at call time: engines capture CUDA graphs right
after warm-up). This sweep is the evidence behind those rules: `python benchmarks/tune_launch.py OUT_DIR`.
"""
import itertools
import json
import pathlib
import sys

import torch
import triton

from sk.bench.timing import graph_time_us
from sk.ops.act_and_mul import _act_and_mul_kernel
from sk.ops.rms_norm import _rms_norm_kernel


def sweep_norm(rows, n, residual, dtype=torch.bfloat16):
    x = torch.randn(rows, n, device="cuda", dtype=dtype)
    r, y, w = torch.randn_like(x), torch.empty_like(x), torch.randn(n, device="cuda", dtype=dtype)
    block_n = triton.next_power_of_2(n)
    results = {}
    for rows_per_program, warps in itertools.product((1, 2, 4), (4, 8, 16)):
        def launch():
            _rms_norm_kernel[(triton.cdiv(rows, rows_per_program),)](
                x, n, r, n, w, y, n, r, n, rows, n, 1e-6, 0.0,
                HAS_RESIDUAL=residual, ROWS_PER_PROGRAM=rows_per_program, BLOCK_N=block_n, PDL=False,
                num_warps=warps)
        results[f"ROWS_PER_PROGRAM={rows_per_program} warps={warps}"] = graph_time_us(launch)
    return results


def sweep_act(rows, width, act, dtype=torch.bfloat16):
    d = width // 2
    x = torch.randn(rows, width, device="cuda", dtype=dtype)
    y = torch.empty(rows, d, device="cuda", dtype=dtype)
    results = {}
    for block, warps in itertools.product((512, 1024, 2048, 4096), (2, 4, 8, 16)):
        if block // (32 * warps) < 1:
            continue
        def launch():
            _act_and_mul_kernel[(rows, triton.cdiv(d, block))](
                x, width, y, d, rows, d, ACT=act, BLOCK=block, num_warps=warps)
        results[f"BLOCK={block} warps={warps}"] = graph_time_us(launch)
    return results


def main(out_dir):
    cases = {f"rms_norm residual={res} M={rows} N=4096": (sweep_norm, rows, 4096, res)
             for rows in (32, 256, 4096, 32768) for res in (False, True)}
    cases.update({f"{act}_and_mul M={rows} N=28672": (sweep_act, rows, 28672, act)
                  for rows in (1, 256, 4096, 16384) for act in ("gelu_tanh", "gelu")})
    report = {}
    pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
    for case, (sweep, *args) in cases.items():
        report[case] = sweep(*args)
        best = sorted(report[case].items(), key=lambda kv: kv[1])[:4]
        print(case, " | ".join(f"{k}: {v:.2f}" for k, v in best), flush=True)
        (pathlib.Path(out_dir) / "tune_launch.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
