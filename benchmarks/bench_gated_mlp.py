"""The gated-MLP block (sk.ops.fused_gated_mlp) on the GPU, side by side in one run with the engines' own op
sequences, per call inside a CUDA graph (sk.bench.timing: 20 calls a replay, medians, implementations
interleaved; fewer calls and replays at M >= 2048). bf16, with a residual (the engines' form). Each
implementation's calls (and the sweep's) read the weights from HBM, as a decode step does: they cycle through
copies that stream three L2s between two reads of one (`sk.bench.timing.l2_cold_copies`; since 2026-12-06, before
which a block of under ~100 MB was partly read from L2).

    python benchmarks/bench_gated_mlp.py --out DIR [--quick] [--shapes a,b] [--m 1,8,...] [--no-compile]
                                         [--budget-s S] [--sweep] [--kernels]

Implementations (each where importable):
  ours        sk.ops.fused_gated_mlp (strict: a fallback is an error, never a silently slow row)
  vllm        torch.ops._C.fused_add_rms_norm + cuBLAS gate/up + torch.ops._C.silu_and_mul / gelu_tanh_and_mul
              + cuBLAS down (Gemma's 1 + w passed as a precomputed weight: vLLM's _C has no Gemma norm)
  sglang      sgl_kernel.fused_add_rmsnorm / gemma_fused_add_rmsnorm + cuBLAS + sgl_kernel.silu_and_mul /
              gelu_tanh_and_mul + cuBLAS
  sk_engine   the same sequence with sk.ops.fused_add_rms_norm_ / gemma_fused_add_rms_norm_ + sk.ops.silu_and_mul
              / gelu_and_mul(approximate="tanh") + cuBLAS (our engine ops; always available)
  eager       the PyTorch reference (sk.ops.gated_mlp.gated_mlp_reference) in bf16
  compile     torch.compile(mode="max-autotune-no-cudagraphs") of the reference, while the run's time budget
              (--budget-s) lasts; later cases record "skipped: time budget"
`--kernels` adds, per case, each implementation's kernels and their GPU time per call (torch.profiler over
eager calls, sk.bench.timing.profile_per_step): where a sequence's time goes, kernel by kernel (`kernels` in the
JSON, a second Markdown table). Per case also: the bf16 relative error against the fp64 reference (first 256
rows) of ours and of the best available peer sequence; at M <= 32 the weight-streaming floor (weight bytes /
measured copy bandwidth) and ours as a percentage of it. Writes DIR/bench_gated_mlp.json and .md (GPU, versions,
date, command).

`--sweep` instead times candidate configs of the two GEMM kernels (sk.ops.gated_mlp.triton_kernels.GemmConfig,
through `forward_kernels(configs=...)`) at each selected shape and M, the table's entry first, and writes
DIR/bench_gated_mlp_sweep.json/.md: what the table's entries get chosen from (name the file in `source`). The
best pairs are timed side by side with the composed route (cuBLAS's GEMMs with our norm and activation kernels);
where a pair at M = 32 beats it by WIN (and, at M = 16 when swept, the best pair does not lose), the Markdown
gives the `TUNED` "m32" entry that makes a block above `LARGE_MLP` run its fused kernels up to 32 rows.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import pathlib
import sys
import time
import traceback

import torch

import sk
from sk.bench import peers as peer_libs
from sk.bench.tables import cell, failure_lines, heading
from sk.bench.timing import (copy_bandwidth_tbps, environment, graph_time_us, l2_cold_copies, profile_per_step,
                             side_by_side_us)
from sk.ops.gated_mlp import gated_mlp_reference
from sk.ops.gated_mlp import triton_kernels as tk
from sk.ops.gated_mlp.common import next_power_of_2

# name: (d_model, d_ff, norm, activation)
SHAPES = {
    "llama3.2-1b": (2048, 8192, "rms", "silu"),
    "llama3-8b": (4096, 14336, "rms", "silu"),
    "llama3-8b-tp2": (4096, 7168, "rms", "silu"),
    "llama3-8b-tp4": (4096, 3584, "rms", "silu"),
    "qwen3-0.6b": (1024, 3072, "rms", "silu"),
    "qwen3-8b": (4096, 12288, "rms", "silu"),
    "gemma-2b": (2048, 16384, "gemma_rms", "gelu_tanh"),
    "gemma2-9b": (3584, 14336, "gemma_rms", "gelu_tanh"),
}
MS = (1, 8, 32, 128, 2048, 8192)
QUICK_SHAPES = ("llama3-8b", "gemma-2b")
QUICK_MS = (1, 32, 2048)
EPS = 1e-6
ERR_ROWS = 256
DEFAULT_BUDGET_S = 300  # torch.compile (max-autotune) stops being started past this: the run stays < 8 min


def peer_modules() -> dict:
    """The engines' kernel libraries importable here: "vllm" (torch.ops._C), "sglang" (sgl_kernel)."""
    found = peer_libs.peer_modules()
    return {name: found[key] for name, key in (("vllm", "vllm_C"), ("sglang", "sgl_kernel")) if key in found}


def replay_plan(m: int) -> dict:
    """calls per replay and replays: fewer at prefill sizes, where one call is milliseconds."""
    return dict(calls_per_replay=20, repeats=50) if m < 2048 else dict(calls_per_replay=3, repeats=10)


def make_problem(m, d, ff, norm, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(*shape, generator=gen, device="cuda")).to(torch.bfloat16)
    w = rnd(d, scale=0.2, shift=0.0 if norm == "gemma_rms" else 1.0)
    return dict(x=rnd(m, d, shift=0.1), residual=rnd(m, d), norm_weight=w,
                gate_up_weight=rnd(2 * ff, d, scale=d ** -0.5), down_weight=rnd(d, ff, scale=ff ** -0.5))


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def cold_weights(p):
    """A cycle of copies of the problem's gate/up and down weights read from HBM at each call (`l2_cold_copies`)."""
    return l2_cold_copies({k: p[k] for k in ("gate_up_weight", "down_weight")})


def sequence(p, weights, add_norm, act_and_mul):
    """The engines' op sequence: in-place add+norm (x ← norm(x + residual), residual ← x + residual), cuBLAS
    gate/up, act_and_mul into a buffer, cuBLAS down; each call on the next of `weights` (`l2_cold_copies`).
    Returns a call returning (out, residual)."""
    x, r, w = p["x"].clone(), p["residual"].clone(), p["norm_weight"]
    ff = p["down_weight"].shape[1]
    a = torch.empty((x.shape[0], ff), dtype=x.dtype, device=x.device)

    def run():
        ws = next(weights)
        add_norm(x, r, w)
        gu = torch.mm(x, ws["gate_up_weight"].t())
        act_and_mul(a, gu)
        return torch.mm(a, ws["down_weight"].t()), r
    return run, (x, r)


def sk_engine_ops(norm, activation):
    """(add_norm, act_and_mul) of `sequence` with our own ops: the engines' sequence as our adapters run it, and
    the op's composed route above `fused_max_m` rows."""
    sk_add_norm = sk.ops.gemma_fused_add_rms_norm_ if norm == "gemma_rms" else sk.ops.fused_add_rms_norm_
    act = (lambda a, gu: sk.ops.gelu_and_mul(gu, "tanh", out=a)) if activation == "gelu_tanh" \
        else (lambda a, gu: sk.ops.silu_and_mul(gu, out=a))
    return (lambda x, r, w: sk_add_norm(x, r, w, EPS)), act


def implementations(p, norm, activation, peers, with_compile, log):
    """name -> (call, reset) where reset() restores in-place inputs before an error check. Each implementation's
    calls cycle through copies of the weights that stream three L2s between two reads of one (`l2_cold_copies`):
    a decode step reads them from HBM."""
    impls = {}
    tanh = activation == "gelu_tanh"
    gemma = norm == "gemma_rms"

    mine = cold_weights(p)

    def ours():
        w = next(mine)
        return sk.ops.fused_gated_mlp(p["x"], p["norm_weight"], w["gate_up_weight"], w["down_weight"], EPS,
                                      residual=p["residual"], norm=norm, activation=activation)
    impls["ours"] = ours
    impls["sk_engine"] = ("seq", *sk_engine_ops(norm, activation))
    if "vllm" in peers:
        C = peers["vllm"]
        w1 = (p["norm_weight"].float() + 1).to(p["norm_weight"].dtype) if gemma else p["norm_weight"]
        act = C.gelu_tanh_and_mul if tanh else C.silu_and_mul
        # Each lambda binds its own act: the SGLang block below rebinds the name.
        impls["vllm"] = ("seq", lambda x, r, w, w1=w1: C.fused_add_rms_norm(x, r, w1, EPS),
                         lambda a, gu, act=act: act(a, gu))
    if "sglang" in peers:
        s = peers["sglang"]
        add = s.gemma_fused_add_rmsnorm if gemma else s.fused_add_rmsnorm
        act = s.gelu_tanh_and_mul if tanh else s.silu_and_mul
        impls["sglang"] = ("seq", lambda x, r, w, add=add: add(x, r, w, EPS), lambda a, gu, act=act: act(gu, a))

    def reference(x, r, wgu, wd):  # the weights as arguments: graph inputs to torch.compile, not constants
        return gated_mlp_reference(x, p["norm_weight"], wgu, wd, EPS, residual=r, norm=norm, activation=activation)

    def on_next(fn, weights):
        def call():
            w = next(weights)
            return fn(p["x"], p["residual"], w["gate_up_weight"], w["down_weight"])
        return call
    impls["eager"] = on_next(reference, cold_weights(p))
    if with_compile:
        # A fresh Dynamo state per case: otherwise the 9th shape would pass the recompile limit (and silently run
        # eagerly) and later shapes would compile with dynamic sizes.
        torch._dynamo.reset()
        impls["compile"] = on_next(torch.compile(reference, mode="max-autotune-no-cudagraphs"),
                                    cold_weights(p))
    fns, seq_state = {}, {}
    for name, impl in impls.items():
        if isinstance(impl, tuple):
            run, state = sequence(p, cold_weights(p), impl[1], impl[2])
            fns[name], seq_state[name] = run, state
        else:
            fns[name] = impl
    return fns, seq_state


def bench_case(shape, m, d, ff, norm, activation, peers, bw_tbps, with_compile, log, kernels=False):
    p = make_problem(m, d, ff, norm)
    row = {"shape": shape, "M": m, "d_model": d, "d_ff": ff, "norm": norm, "activation": activation}
    weight_bytes = (3 * ff * d) * 2
    row["weight_mb"] = weight_bytes / 1e6
    with torch.no_grad():
        fns, seq_state = implementations(p, norm, activation, peers, with_compile, log)
        t0 = time.time()
        if "compile" in fns:
            fns["compile"]()
            row["compile_s"] = time.time() - t0
        # errors: the first rows against fp64 (each sequence from fresh copies of x and residual)
        rows = slice(0, ERR_ROWS)
        ref = gated_mlp_reference(p["x"][rows].double(), p["norm_weight"].double(), p["gate_up_weight"].double(),
                                  p["down_weight"].double(), EPS, residual=p["residual"][rows].double(), norm=norm,
                                  activation=activation)[0]
        for name, fn in fns.items():
            if name in seq_state:
                x, r = seq_state[name]
                x.copy_(p["x"])
                r.copy_(p["residual"])
            try:
                out = fn()[0]
                row[f"rel_err_{name}"] = rel_err(out[rows], ref)
            except Exception as e:
                row.setdefault("failures", {})[name] = f"{type(e).__name__}: {e}"
                log(f"[{shape} M={m}] {name} failed:\n{''.join(traceback.format_exception(e))}")
        fns = {k: v for k, v in fns.items() if k not in row.get("failures", {})}

        def failed(name, e):
            row.setdefault("failures", {})[name] = f"{type(e).__name__}: {e}"
            log(f"[{shape} M={m}] {name} could not be timed: {type(e).__name__}: {e}")
        with sk.coverage.strict():
            times = side_by_side_us(fns, on_error=failed, **replay_plan(m))
            if kernels:
                row["kernels"] = {name: [(k["name"], k["us"]) for k in profile_per_step(fn, steps=5)["kernels"]]
                                  for name, fn in fns.items() if name != "compile"}
    for name, us in times.items():
        row[f"{name}_us"] = us
    ours = row.get("ours_us")
    # Peers are the other implementations; sk_engine (our own engine ops in the engines' sequence) is compared apart.
    peer_names = [n for n in ("vllm", "sglang", "eager", "compile") if row.get(f"{n}_us")]
    if peer_names and ours:
        best = min(peer_names, key=lambda n: row[f"{n}_us"])
        row["best_peer"], row["speedup_vs_best_peer"] = best, row[f"{best}_us"] / ours
    if ours and row.get("sk_engine_us"):
        row["speedup_vs_sk_engine"] = row["sk_engine_us"] / ours
    engine_peers = [n for n in ("vllm", "sglang", "sk_engine") if f"rel_err_{n}" in row]
    if engine_peers:
        row["rel_err_peer_sequence"] = row[f"rel_err_{engine_peers[0]}"]
        row["peer_sequence"] = engine_peers[0]
    if m <= 32 and ours:
        row["floor_us"] = weight_bytes / (bw_tbps * 1e12) * 1e6
        row["pct_of_floor"] = 100 * row["floor_us"] / ours
    row["configs"] = [dataclasses.asdict(c) for c in tk.choose_configs(m, d, ff, tk.sm_count(torch.device("cuda")))]
    log(f"[{shape} M={m}] " + ", ".join(f"{n} {row[f'{n}_us']:.1f}" for n in ["ours", *peer_names, "sk_engine"]
                                          if row.get(f"{n}_us")) + " us"
        + (f"; {row['speedup_vs_best_peer']:.2f}x vs {row['best_peer']}" if "best_peer" in row else "")
        + (f"; {row['pct_of_floor']:.0f}% of the weight-streaming floor" if "pct_of_floor" in row else "")
        + f"; err ours {row.get('rel_err_ours', float('nan')):.2e} "
          f"peer {row.get('rel_err_peer_sequence', float('nan')):.2e}")
    return row


def markdown(rows, env, bw, command) -> str:
    lines = heading("fused_gated_mlp", env, command, bw,
                    "µs per call in a CUDA graph (medians); bf16 with a residual.") + [
             "| shape | M | ours | vllm | sglang | sk_engine | eager | compile | best peer | speedup | vs sk_engine "
             "| % floor | err ours | err peer seq |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = cell
    for r in rows:
        lines.append(f"| {r['shape']} | {r['M']} | {f(r.get('ours_us'))} | {f(r.get('vllm_us'))} | "
                     f"{f(r.get('sglang_us'))} | {f(r.get('sk_engine_us'))} | {f(r.get('eager_us'))} | "
                     f"{f(r.get('compile_us'))} | {r.get('best_peer', '–')} | "
                     f"{f(r.get('speedup_vs_best_peer'), '{:.2f}x')} | {f(r.get('speedup_vs_sk_engine'), '{:.2f}x')} | "
                     f"{f(r.get('pct_of_floor'), '{:.0f}%')} | {f(r.get('rel_err_ours'), '{:.1e}')} | "
                     f"{f(r.get('rel_err_peer_sequence'), '{:.1e}')} |")
    lines += failure_lines(rows, "shape")
    if any("kernels" in r for r in rows):
        lines += ["", "Kernels per call (µs, torch.profiler over eager calls; names cut at 60 characters):", "",
                  "| shape | M | implementation | kernel | µs |", "|---|---|---|---|---|"]
        for r in rows:
            for name, ks in r.get("kernels", {}).items():
                lines += [f"| {r['shape']} | {r['M']} | {name} | `{k[:60]}` | {us:.1f} |" for k, us in ks]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- sweep

SMEM_LIMIT = 220 * 1024
PAIRED_TOP = 3  # the sweep times the best 3 gate/up configs with the best 3 down configs together
COMPOSED = "composed (cuBLAS GEMMs, our norm and activation)"
WIN = 1.02  # the fused pair's lead over the composed route, side by side, before it replaces it (run-to-run ±2 %)


def smem_ok(c: tk.GemmConfig) -> bool:
    return (c.block_m + c.block_n) * c.block_k * 2 * c.num_stages <= SMEM_LIMIT


def candidates(m: int) -> dict[str, list[tk.GemmConfig]]:
    """Candidate (gate_up, down) configs for m rows (before fitting); shared memory within the limit."""
    G = tk.GemmConfig
    if m <= 32:
        bm = max(16, next_power_of_2(m))
        # block_n counts weight rows, half gate and half up: 128 is the least wgmma's 64-row side allows.
        gate_up = [G(bm, bn, bk, 4, st, swap_ab=True, dependent_launch=dl)
                   for bn, bk, st, dl in itertools.product((128, 256), (64, 128, 256), (3, 4, 6),
                                                           ("at_start", "after_stores", "none"))
                   if dl == "at_start" or (bn, bk, st) == (128, 128, 4)]
        down = [G(bm, bn, bk, 4, st, split_k=0, split_waves=w, swap_ab=True)
                for bn, bk, st, w in itertools.product((64, 128), (128, 256), (3, 4, 6), (1.0, 2.0, 4.0))]
    else:
        gate_up = [G(bm, bn, bk, wp, st, group_m=g)
                   for bm, bn, bk, wp, st, g in itertools.product((64, 128), (128, 256), (64, 128), (4, 8), (3, 4),
                                                                  (8,))]
        down = [G(bm, bn, bk, wp, st, split_k=0 if m <= 1024 else 1)
                for bm, bn, bk, wp, st in itertools.product((64, 128), (128, 256), (64, 128), (4, 8), (3, 4))]
    return {"gate_up": [c for c in gate_up if smem_ok(c)], "down": [c for c in down if smem_ok(c)]}


def sweep_case(shape, m, d, ff, norm, activation, log):
    p = make_problem(m, d, ff, norm)
    dev = torch.device("cuda")
    sms = tk.sm_count(dev)
    base_gu, base_down = tk.choose_configs(m, d, ff, sms)

    weights = cold_weights(p)

    def run(configs):
        def call():
            w = next(weights)
            return tk.forward_kernels(p["x"], p["residual"], p["norm_weight"], None, w["gate_up_weight"], None,
                                      w["down_weight"], None, EPS, norm, activation, configs)
        return call
    result = {"shape": shape, "M": m, "d_model": d, "d_ff": ff, "table": [dataclasses.asdict(base_gu),
                                                                          dataclasses.asdict(base_down)]}
    with torch.no_grad():
        result["table_us"] = graph_time_us(run((base_gu, base_down)), repeats=15, **{
            k: v for k, v in replay_plan(m).items() if k == "calls_per_replay"})
        log(f"[sweep {shape} M={m}] table: {result['table_us']:.1f} us")
        for kind, cands in candidates(m).items():
            timed = []
            for c in cands:
                configs = tk.fit_configs(c, base_down, m, d, ff, sms) if kind == "gate_up" else \
                    tk.fit_configs(base_gu, c, m, d, ff, sms)
                try:
                    us = graph_time_us(run(configs), repeats=15,
                                       calls_per_replay=replay_plan(m)["calls_per_replay"])
                except Exception as e:  # e.g. out of shared memory or registers: reported, not fatal
                    us = None
                    log(f"  {kind} {c}: failed: {type(e).__name__}: {str(e)[:160]}")
                timed.append({"config": dataclasses.asdict(c), "us": us})
            timed.sort(key=lambda t: float("inf") if t["us"] is None else t["us"])
            result[kind] = timed
            best = timed[0]
            log(f"[sweep {shape} M={m}] best {kind}: {best['us']} us {best['config']}")
        # Each kind was swept beside the table's other config; the kernels overlap (dependent launches), so the
        # best of each are timed together too: the PAIRED_TOP x PAIRED_TOP pairs, the table's pair among them.
        top = {kind: [t["config"] for t in result[kind][:PAIRED_TOP] if t["us"] is not None]
               for kind in ("gate_up", "down")}
        # name -> (fitted configs, the configs as a table entry gives them: the candidates', the table's fitted)
        pairs = {"table": ((base_gu, base_down), result["table"])}
        for i, gu in enumerate(top["gate_up"]):
            for j, dn in enumerate(top["down"]):
                pairs[f"gate_up #{i + 1} + down #{j + 1}"] = (
                    tk.fit_configs(tk.GemmConfig(**gu), tk.GemmConfig(**dn), m, d, ff, sms), [gu, dn])
        # The composed route (cuBLAS's GEMMs with our norm and activation kernels) beside them: where the fused
        # kernels should stop (`tk.fused_max_m`).
        composed, _ = sequence(p, cold_weights(p), *sk_engine_ops(norm, activation))
        times = side_by_side_us({**{name: run(fitted) for name, (fitted, _) in pairs.items()}, COMPOSED: composed},
                                calls_per_replay=replay_plan(m)["calls_per_replay"], repeats=25)
        result["composed_us"] = times.pop(COMPOSED, None)
        result["pairs"] = sorted(({"name": name, "us": us, "gate_up": dataclasses.asdict(pairs[name][0][0]),
                                   "down": dataclasses.asdict(pairs[name][0][1]), "entry": pairs[name][1]}
                                  for name, us in times.items() if us is not None), key=lambda t: t["us"])
        log(f"[sweep {shape} M={m}] pairs, side by side: " + ", ".join(
            f"{t['name']} {t['us']:.1f}" for t in result["pairs"]) + f"; {COMPOSED} {result['composed_us']}")
    return result


def m32_entries(results) -> list[str]:
    """`TUNED` "m32" lines for the blocks whose fused kernels beat the composed route at 32 rows by WIN, side by
    side (and, where 16 rows were swept, whose best pair there did not lose): their `source` is this sweep."""
    by_case = {(r["shape"], r["M"]): r for r in results}
    lines = []
    for (shape, m), r in by_case.items():
        r16 = by_case.get((shape, 16))
        if m != 32 or not r.get("composed_us") or r["pairs"][0]["us"] * WIN > r["composed_us"]:
            continue
        if r16 is not None and not (r16.get("composed_us") and r16["pairs"][0]["us"] <= r16["composed_us"]):
            continue

        def config(c):
            return "GemmConfig(" + ", ".join(f"{k}={v!r}" for k, v in c.items() if k != "source") + ", source=...)"
        gate_up, down = r["pairs"][0]["entry"]
        lines.append(f'("m32", {r["d_model"]}, {r["d_ff"]}): ({config(gate_up)}, {config(down)}),')
    return lines


# ----------------------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=pathlib.Path, help="folder for the JSON and Markdown")
    parser.add_argument("--shapes", help=f"comma-separated of: {', '.join(SHAPES)}")
    parser.add_argument("--m", help=f"comma-separated row counts (default {','.join(map(str, MS))})")
    parser.add_argument("--quick", action="store_true",
                        help=f"{', '.join(QUICK_SHAPES)} at M {QUICK_MS}, no torch.compile (~1 min)")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile (max-autotune)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="start no torch.compile peer after this many seconds of the run")
    parser.add_argument("--sweep", action="store_true", help="time candidate GEMM configs instead of the peers")
    parser.add_argument("--kernels", action="store_true",
                        help="also each implementation's kernels and their time per call (torch.profiler)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gated_mlp needs a CUDA GPU: its timings are CUDA-graph replays", file=sys.stderr)
        return 2
    shapes = args.shapes.split(",") if args.shapes else list(QUICK_SHAPES if args.quick else SHAPES)
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    ms = [int(v) for v in args.m.split(",")] if args.m else list(QUICK_MS if args.quick else MS)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "benchmarks/bench_gated_mlp.py", *(argv if argv is not None else sys.argv[1:])])
    env = environment()
    start = time.time()
    log_lines = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)
    if args.sweep:
        results = [sweep_case(s, m, *SHAPES[s], log) for s in shapes for m in ms]
        (args.out / "bench_gated_mlp_sweep.json").write_text(json.dumps(
            {"environment": env, "command": command, "results": results}, indent=1) + "\n")
        md = [f"# fused_gated_mlp config sweep on {env['gpu']} ({env['date']})", "", f"`{command}`", "",
              "| shape | M | table µs | best gate_up µs | best down µs | table pair, side by side µs | best pair µs "
              "| composed route, side by side µs |", "|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['shape']} | {r['M']} | {r['table_us']:.1f} | {r['gate_up'][0]['us']:.1f} | "
               f"{r['down'][0]['us']:.1f} | {next(t['us'] for t in r['pairs'] if t['name'] == 'table'):.1f} | "
               f"{r['pairs'][0]['us']:.1f} ({r['pairs'][0]['name']}) | {cell(r.get('composed_us'))} |"
               for r in results]
        entries = m32_entries(results)
        md += ["", f"`TUNED` \"m32\" entries (the fused kernels {WIN:.2f}× the composed route or better at 32 rows; "
               "`source`: this JSON's committed path): " + ("none" if not entries else ""), ""] + [
            f"    {line}" for line in entries]
        (args.out / "bench_gated_mlp_sweep.md").write_text("\n".join(md) + "\n")
        log(f"sweep done in {time.time() - start:.0f} s")
        return 0
    peers = peer_modules()
    bw = copy_bandwidth_tbps()
    log(f"copy bandwidth {bw:.2f} TB/s; peers importable: {sorted(peers) or 'none'}")
    rows = []
    for s in shapes:
        for m in ms:
            with_compile = not (args.no_compile or args.quick) and time.time() - start < args.budget_s
            row = bench_case(s, m, *SHAPES[s], peers, bw, with_compile, log, kernels=args.kernels)
            if not with_compile and not (args.no_compile or args.quick):
                row.setdefault("notes", []).append("compile skipped: time budget")
            rows.append(row)
            torch.cuda.empty_cache()
    total = time.time() - start
    data = {"environment": env, "command": command, "copy_bandwidth_tbps": bw, "peers": sorted(peers),
            "total_s": total, "rows": rows}
    (args.out / "bench_gated_mlp.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "bench_gated_mlp.md").write_text(markdown(rows, env, bw, command))
    log(f"done in {total:.0f} s: {args.out}/bench_gated_mlp.json, .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
