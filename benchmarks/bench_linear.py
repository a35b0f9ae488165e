"""sk.ops.linear's split-K kernel (backend="split_k") at the decoder's attention-side projections (QKV and
output), side by side in one run with cuBLAS (torch.nn.functional.linear: what vLLM's and SGLang's unquantized
linear layers call on CUDA, and the op's default backend), per call inside a CUDA graph (sk.bench.timing: 20
calls a replay, medians, implementations interleaved). bf16, with no bias (the Llama/Qwen/Gemma projections have
none). The weight is read from HBM as in an engine's decode step: each captured call takes the next of enough
copies to stream three times the L2 between two reads of one (`l2_cold_copies`; one 32 MB weight called back to
back would be read from a 50 MB L2).

    python benchmarks/bench_linear.py --out DIR [--shapes a,b] [--m 1,8,...] [--sweep]

Per case: µs of ours and cuBLAS, ours ÷ cuBLAS, the weight-streaming floor (weight bytes / the copy bandwidth
measured in the same run) and both as a percentage of it, the bf16 relative error of both against fp64, the
config ours ran. Writes DIR/bench_linear.json and .md (GPU, versions, date, command).

`--sweep` instead times candidate split-K configs of the kernel (`triton_kernels.linear_kernels(config=...)`)
at each selected shape and M, the table's entry first, and writes DIR/bench_linear_sweep.json/.md: what a tuned
entry for these shapes would be chosen from.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import pathlib
import sys
import time

import torch

import sk
from sk.bench.tables import cell, failure_lines, heading
from sk.bench.timing import copy_bandwidth_tbps, environment, graph_time_us, l2_cold_copies, side_by_side_us
from sk.ops.gated_mlp import triton_kernels as tk

# name: (N, K) of one projection's weight; the models' attention shapes (heads x head_dim).
SHAPES = {
    "llama3-8b-qkv": (6144, 4096),       # 32 x 128 queries, 8 x 128 keys and values
    "llama3-8b-o": (4096, 4096),
    "llama3-8b-tp2-qkv": (3072, 4096),
    "llama3-8b-tp2-o": (4096, 2048),
    "llama3.2-1b-qkv": (3072, 2048),     # 32 x 64, 8 x 64
    "llama3.2-1b-o": (2048, 2048),
    "qwen3-0.6b-qkv": (4096, 1024),      # 16 x 128, 8 x 128
    "qwen3-0.6b-o": (1024, 2048),
    "gemma-2b-qkv": (2560, 2048),        # 8 x 256, 1 x 256
    "gemma-2b-o": (2048, 2048),
}
MS = (1, 8, 32, 64)
ERR_ROWS = 256


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def make_problem(m, n, k, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen, device="cuda") * k ** -0.5).to(torch.bfloat16)
    return x, w


def bench_case(shape, m, n, k, bw_tbps, log):
    x, w = make_problem(m, n, k)
    row = {"shape": shape, "M": m, "N": n, "K": k, "weight_mb": n * k * 2 / 1e6}
    ours_w, cublas_w = l2_cold_copies({"w": w}), l2_cold_copies({"w": w})
    fns = {"ours": lambda: sk.ops.linear(x, next(ours_w)["w"], backend="split_k"),
           "cublas": lambda: torch.nn.functional.linear(x, next(cublas_w)["w"])}
    with torch.no_grad():
        ref = torch.nn.functional.linear(x[:ERR_ROWS].double(), w.double())
        for name, fn in fns.items():
            row[f"rel_err_{name}"] = rel_err(fn()[:ERR_ROWS], ref)

        def failed(name, e):
            row.setdefault("failures", {})[name] = f"{type(e).__name__}: {e}"
            log(f"[{shape} M={m}] {name} could not be timed: {type(e).__name__}: {e}")
        with sk.coverage.strict():
            times = side_by_side_us(fns, on_error=failed)
    for name, us in times.items():
        row[f"{name}_us"] = us
    floor = n * k * 2 / (bw_tbps * 1e12) * 1e6
    row["floor_us"] = floor
    for name in fns:
        if row.get(f"{name}_us"):
            row[f"{name}_pct_of_floor"] = 100 * floor / row[f"{name}_us"]
    if row.get("ours_us") and row.get("cublas_us"):
        row["speedup_vs_cublas"] = row["cublas_us"] / row["ours_us"]
    if m <= tk.LINEAR_MAX_M:
        row["config"] = dataclasses.asdict(tk.linear_config(m, n, k, tk.sm_count(torch.device("cuda"))))
    log(f"[{shape} M={m}] ours {row.get('ours_us', float('nan')):.1f} us, cuBLAS {row.get('cublas_us', float('nan')):.1f}"
        f" us ({row.get('speedup_vs_cublas', float('nan')):.2f}x); floor {floor:.1f} us: ours "
        f"{row.get('ours_pct_of_floor', float('nan')):.0f}%, cuBLAS {row.get('cublas_pct_of_floor', float('nan')):.0f}%")
    return row


def markdown(rows, env, bw, command) -> str:
    lines = heading("sk.ops.linear", env, command, bw, "µs per call in a CUDA graph (medians); bf16, no bias.") + [
             "| shape | M | N × K | ours µs | cuBLAS µs | ours ÷ cuBLAS | floor µs | ours % floor | cuBLAS % floor "
             "| err ours | err cuBLAS |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    f = cell
    for r in rows:
        lines.append(f"| {r['shape']} | {r['M']} | {r['N']} × {r['K']} | {f(r.get('ours_us'))} | "
                     f"{f(r.get('cublas_us'))} | {f(r.get('speedup_vs_cublas'), '{:.2f}x')} | {f(r['floor_us'])} | "
                     f"{f(r.get('ours_pct_of_floor'), '{:.0f}%')} | {f(r.get('cublas_pct_of_floor'), '{:.0f}%')} | "
                     f"{f(r.get('rel_err_ours'), '{:.1e}')} | {f(r.get('rel_err_cublas'), '{:.1e}')} |")
    return "\n".join(lines + failure_lines(rows, "shape")) + "\n"


SMEM_LIMIT = 220 * 1024


def candidates(m: int) -> list[tk.GemmConfig]:
    """Split-K candidates for m <= 32 rows (before fitting), shared memory within the limit."""
    bm = max(16, 1 << max(0, m - 1).bit_length())
    configs = [tk.GemmConfig(bm, bn, bk, wp, st, split_k=0, split_waves=sw, swap_ab=True)
               for bn, bk, wp, st, sw in itertools.product((64, 128), (64, 128, 256), (4,), (3, 4, 6),
                                                           (1.0, 2.0, 4.0, 8.0))]
    return [c for c in configs if (c.block_m + c.block_n) * c.block_k * 2 * c.num_stages <= SMEM_LIMIT]


def sweep_case(shape, m, n, k, log):
    x, w = make_problem(m, n, k)
    sms = tk.sm_count(torch.device("cuda"))
    table = tk.linear_config(m, n, k, sms)
    result = {"shape": shape, "M": m, "N": n, "K": k, "table": dataclasses.asdict(table)}
    ws = l2_cold_copies({"w": w})
    with torch.no_grad():
        result["table_us"] = graph_time_us(lambda: tk.linear_kernels(x, next(ws)["w"], None, table), repeats=15)
        result["cublas_us"] = graph_time_us(lambda: torch.nn.functional.linear(x, next(ws)["w"]), repeats=15)
        timed = []
        for c in candidates(m):
            fitted = tk.fit_split(c, m, n, k, sms)
            try:
                us = graph_time_us(lambda fitted=fitted: tk.linear_kernels(x, next(ws)["w"], None, fitted),
                                   repeats=15)
            except Exception as e:  # out of shared memory or registers: reported, not fatal
                us = None
                log(f"  {c}: failed: {type(e).__name__}: {str(e)[:160]}")
            timed.append({"config": dataclasses.asdict(c), "split_k": fitted.split_k, "us": us})
    timed.sort(key=lambda t: float("inf") if t["us"] is None else t["us"])
    result["candidates"] = timed
    log(f"[sweep {shape} M={m}] table {result['table_us']:.1f} us, cuBLAS {result['cublas_us']:.1f} us, best "
        f"{timed[0]['us']} us {timed[0]['config']} split {timed[0]['split_k']}")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=pathlib.Path, help="folder for the JSON and Markdown")
    parser.add_argument("--shapes", help=f"comma-separated of: {', '.join(SHAPES)}")
    parser.add_argument("--m", help=f"comma-separated row counts (default {','.join(map(str, MS))})")
    parser.add_argument("--sweep", action="store_true", help="time candidate split-K configs instead of cuBLAS")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_linear needs a CUDA GPU: its timings are CUDA-graph replays", file=sys.stderr)
        return 2
    shapes = args.shapes.split(",") if args.shapes else list(SHAPES)
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    ms = [int(v) for v in args.m.split(",")] if args.m else list(MS)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "benchmarks/bench_linear.py", *(argv if argv is not None else sys.argv[1:])])
    env = environment()
    start = time.time()

    def log(msg):
        print(msg, flush=True)
    if args.sweep:
        results = []
        for s, m in ((s, m) for s in shapes for m in ms if m <= tk.LINEAR_MAX_M):
            results.append(sweep_case(s, m, *SHAPES[s], log))
            (args.out / "bench_linear_sweep.json").write_text(json.dumps(  # each case kept if a later one hangs
                {"environment": env, "command": command, "results": results}, indent=1) + "\n")
        md = [f"# sk.ops.linear config sweep on {env['gpu']} ({env['date']})", "", f"`{command}`", "",
              "| shape | M | table µs | cuBLAS µs | best µs | best config (block_n, block_k, warps, stages, waves) "
              "| split |", "|---|---|---|---|---|---|---|"]
        for r in results:
            best = r["candidates"][0]
            c = best["config"]
            md.append(f"| {r['shape']} | {r['M']} | {r['table_us']:.1f} | {r['cublas_us']:.1f} | {best['us']} | "
                      f"{c['block_n']}, {c['block_k']}, {c['num_warps']}, {c['num_stages']}, {c['split_waves']} | "
                      f"{best['split_k']} |")
        (args.out / "bench_linear_sweep.md").write_text("\n".join(md) + "\n")
        log(f"sweep done in {time.time() - start:.0f} s")
        return 0
    bw = copy_bandwidth_tbps()
    log(f"copy bandwidth {bw:.2f} TB/s")
    rows = [bench_case(s, m, *SHAPES[s], bw, log) for s in shapes for m in ms]
    data = {"environment": env, "command": command, "copy_bandwidth_tbps": bw, "total_s": time.time() - start,
            "rows": rows}
    (args.out / "bench_linear.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "bench_linear.md").write_text(markdown(rows, env, bw, command))
    log(f"done in {time.time() - start:.0f} s: {args.out}/bench_linear.json, .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
