"""Pre-norm GEGLU block on the GPU: ours side by side with PyTorch eager, eager in a CUDA graph, and
torch.compile(mode="max-autotune-no-cudagraphs") in a CUDA graph; plus a training step (forward + backward)
at the seed shape against eager. bf16; µs per call, medians.

    python benchmarks/bench_geglu.py OUT_DIR [--no-compile] [--sweep] [--profile]

Writes OUT_DIR/bench_geglu.json and OUT_DIR/bench_geglu.md (GPU, versions, date). `--sweep` also times
candidate tile configs of our two GEMM kernels per shape (bench_geglu_sweep.json): how the configs in
`sk_core/ops/gated_mlp/geglu_kernels.py` were chosen. `--profile` adds profile_geglu.md/.json: per call, each GPU
kernel's time (ours and eager, per shape) and, for the training step, the host-side ops by self time (the step
is host-bound at the seed shape).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import importlib.metadata
import json
import os
import statistics
import sys
import time
import traceback

import torch

import sk
from sk.bench.timing import environment, graph_time_us, profile_per_step, side_by_side_us

geglu = importlib.import_module("sk.ops.gated_mlp.geglu")
gk = importlib.import_module("sk.ops.gated_mlp.geglu_kernels")
step_graphs = importlib.import_module("sk.ops._step_graphs")

SHAPES = {"seed": (1024, 768, 1448), "prefill": (8192, 2048, 16384), "decode": (32, 2048, 16384)}
CALLS_PER_REPLAY = 20  # as the peer table: 20 calls captured per graph, time per call


class EagerBlock(torch.nn.Module):
    """The seed page's block (its MyGEGLUBlock), the PyTorch baseline."""

    def __init__(self, d_model, d_ff, eps=1e-5):
        super().__init__()
        self.my_norm = torch.nn.LayerNorm(d_model, eps=eps)
        self.my_gate = torch.nn.Linear(d_model, d_ff)
        self.my_up = torch.nn.Linear(d_model, d_ff)
        self.my_down = torch.nn.Linear(d_ff, d_model)
        self.eps = eps

    def forward(self, x):
        h = self.my_norm(x)
        return x + self.my_down(torch.nn.functional.gelu(self.my_gate(h)) * self.my_up(h))


def _events_ms(fn, calls, repeats):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def time_eager_us(fns: dict, repeats=30) -> dict:
    """Per call of each fn, launched from Python back to back (host overhead included when it dominates):
    medians of `repeats` samples of CALLS_PER_REPLAY calls, the fns' samples interleaved so that the host's
    drift (its clocks, other work) hits all alike."""
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            def many(fn=fn):
                for _ in range(CALLS_PER_REPLAY):
                    fn()
            samples[name].append(1e3 * _events_ms(many, CALLS_PER_REPLAY, 1))
    return {name: statistics.median(s) for name, s in samples.items()}


def make_problem(m, d, ff, seed=0):
    torch.manual_seed(seed)
    block = EagerBlock(d, ff).cuda()
    with torch.no_grad():  # a trained-looking LayerNorm, not the identity init
        block.my_norm.weight.uniform_(0.5, 1.5)
        block.my_norm.bias.uniform_(-0.2, 0.2)
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    return block, x


def inference_problem(m, d, ff):
    """(the bf16 eager block, x, the op's arguments from that block's weights) for an inference comparison."""
    block, x = make_problem(m, d, ff)
    block_bf16 = EagerBlock(d, ff).cuda().to(torch.bfloat16)
    block_bf16.load_state_dict(block.state_dict())
    return block_bf16, x, op_args(block_bf16)


def op_args(block):
    return (block.my_norm.weight, block.my_norm.bias, block.my_gate.weight, block.my_gate.bias,
            block.my_up.weight, block.my_up.bias, block.my_down.weight, block.my_down.bias, block.eps)


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def switched_off(fn, setting):
    """`fn` with the `sk.settings` switch `setting` off while it runs: the A/B of one of the op's switches
    (`geglu_fold_ln`: the gate/up kernel normalizing in its prologue, as in training, instead of using weights
    with the LayerNorm scale folded in; `geglu_pdl`: kernels launched in plain stream order; `geglu_cute`: the
    Triton GEMMs where QuACK's would run; `step_graphs`: training steps launched from Python, not replayed).
    Read at launch, so a graph capturing `fn` captures the switched-off op."""
    def run():
        with sk.settings.override(**{setting: False}):
            return fn()
    return run


def bench_inference(name, m, d, ff, with_compile):
    block_bf16, x, args = inference_problem(m, d, ff)
    row = {"shape": name, "M": m, "D": d, "FF": ff, "gflop": 2 * m * d * ff * 3 / 1e9}
    with torch.no_grad():
        ours = lambda: sk.ops.fused_pre_norm_geglu(x, *args)  # noqa: E731
        eager = lambda: block_bf16(x)  # noqa: E731
        rows = slice(None, 1024)  # rows are independent: the fp64 oracle on the first 1024 rows is enough
        ref64 = geglu.fused_pre_norm_geglu_reference(x[rows].double(), *[a.double() if torch.is_tensor(a) else a
                                                                         for a in args])
        row["rel_err_ours_vs_fp64"] = rel_err(ours()[rows], ref64)
        row["rel_err_eager_bf16_vs_fp64"] = rel_err(eager()[rows], ref64)
        unfolded = switched_off(ours, "geglu_fold_ln")
        row["rel_err_ours_unfolded_vs_fp64"] = rel_err(unfolded()[rows], ref64)
        row["gate_up_config"], row["down_config"] = [dataclasses.asdict(c) for c in gk.choose_configs(m, d, ff)]
        row["gemms"] = "cute" if gk.quack_gemms_for(x.device, m, d, ff, sk.settings.get("geglu_fold_ln")) else "triton"
        triton_gemms = switched_off(ours, "geglu_cute")
        row["rel_err_ours_triton_gemms_vs_fp64"] = rel_err(triton_gemms()[rows], ref64)
        def failed(variant, e):  # reported and left as NaN in the table, never silently missing
            print(f"[{name}] {variant} could not be timed:\n{''.join(traceback.format_exception(e))}", flush=True)
            row.setdefault("failures", {})[variant] = f"{type(e).__name__}: {e}"
        times = side_by_side_us({"ours_graph_us": ours, "ours_triton_gemms_graph_us": triton_gemms,
                                 "ours_unfolded_graph_us": unfolded,
                                 "ours_no_pdl_graph_us": switched_off(ours, "geglu_pdl"), "eager_graph_us": eager},
                                calls_per_replay=CALLS_PER_REPLAY, on_error=failed)
        row.update({variant: float("nan") if us is None else us for variant, us in times.items()})
        row.update(time_eager_us({"ours_eager_us": ours, "eager_us": eager}))
        if with_compile:
            compiled = torch.compile(block_bf16, mode="max-autotune-no-cudagraphs")
            t0 = time.time()
            compiled(x)
            row["maxat_compile_s"] = time.time() - t0
            row["maxat_graph_us"] = graph_time_us(lambda: compiled(x), calls_per_replay=CALLS_PER_REPLAY)
    best_peer = min((v for k, v in row.items() if k in ("eager_graph_us", "maxat_graph_us") and v == v),
                    default=float("nan"))
    row["speedup_vs_best_measured"] = best_peer / row["ours_graph_us"]
    print(f"[{name}] ours {row['ours_graph_us']:.1f} us (graph, {row['gemms']} GEMMs; Triton GEMMs "
          f"{row['ours_triton_gemms_graph_us']:.1f}; LN not folded {row['ours_unfolded_graph_us']:.1f}), "
          f"{row['ours_eager_us']:.1f} us (eager launch); "
          f"eager {row['eager_us']:.1f}, eager graph {row['eager_graph_us']:.1f}, "
          f"maxat graph {row.get('maxat_graph_us', float('nan')):.1f}; err ours {row['rel_err_ours_vs_fp64']:.2e} "
          f"eager {row['rel_err_eager_bf16_vs_fp64']:.2e}", flush=True)
    return row


def bench_training(m, d, ff):
    """fwd+bwd per step, FP32 masters, bf16 input, CUDA bf16 autocast (the peer table's setting)."""
    block, x = make_problem(m, d, ff)
    ours = sk.nn.PreNormGEGLUFFN.from_module(block)
    x = x.requires_grad_()
    grad = torch.randn_like(x)

    def step_after_update(model):
        # An optimizer step changes every master in place: ours without replay re-makes its BF16 copies on the
        # next call; a replayed step casts inside its graphs anyway.
        params = list(model.parameters())

        def run():
            with torch.no_grad():
                torch._foreach_mul_(params, 1.0)
            training_step(model, x, grad)()
        return run

    row = {"shape": "seed", "M": m, "D": d, "FF": ff}
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    ours_step = captured(training_step(ours, x, grad))
    torch.cuda.empty_cache()  # what is still reserved now, the captured step holds (its slot and graphs' pool)
    row["step_graph_mib"] = (torch.cuda.memory_reserved() - reserved) / 2**20
    row.update(time_eager_us({
        "eager_step_us": training_step(block, x, grad), "ours_step_us": ours_step,
        "ours_no_replay_step_us": switched_off(training_step(ours, x, grad), "step_graphs")}, repeats=20))
    row.update(time_eager_us({"eager_step_with_update_us": step_after_update(block),
                              "ours_step_with_update_us": step_after_update(ours)}, repeats=20))
    row["eager_torch_graphed_step_us"] = torch_graphed_step_us(block, x, grad)
    row["speedup"] = row["eager_step_us"] / row["ours_step_us"]
    row["speedup_no_replay"] = row["eager_step_us"] / row["ours_no_replay_step_us"]
    row["speedup_with_update"] = row["eager_step_with_update_us"] / row["ours_step_with_update_us"]
    print(f"[train seed] eager {row['eager_step_us']:.0f} us, ours {row['ours_step_us']:.0f} us "
          f"({row['speedup']:.2f}x; without step graphs {row['ours_no_replay_step_us']:.0f}); with master update: "
          f"eager {row['eager_step_with_update_us']:.0f}, ours {row['ours_step_with_update_us']:.0f} "
          f"({row['speedup_with_update']:.2f}x); eager under torch.cuda.make_graphed_callables "
          f"{row['eager_torch_graphed_step_us']:.0f}; memory held by the captured step {row['step_graph_mib']:.0f} MiB",
          flush=True)
    return row


# Candidate (block_m, block_n, block_k, num_warps, num_stages[, split_k][, markers]) per shape for --sweep;
# markers: "swap" (the products computed transposed, `GemmConfig.swap_ab`), "p1"/"p2" (gate/up: a persistent
# grid of 1 or 2 programs per SM, `programs_per_sm`), "tma" (gate/up: h stored by TMA, `tma_store`), "g16" etc.
# (row tiles per group of the grouped order, `group_m`; 8 without): those that
# compile for sm90 without register spills (checked ahead with benchmarks/compile_report_geglu.py on a CPU
# machine; the gate/up kernel swept is the inference one, γ folded), except A/B partners kept to show what a
# table entry gains: the folded gate/up kernel's 128 × 128 tiles (16-88 bytes spilled in the epilogue) and the
# seed's 128 × 64 persistent tiles without the TMA store (160 bytes), set against the same tiles with it.
SWEEP = {
    "seed": {
        "gate_up": [(64, 64, 64, 4, 3), (64, 64, 64, 4, 3, "tma"), (64, 64, 64, 4, 4, "tma"),
                    (128, 64, 64, 4, 3), (128, 64, 64, 4, 3, "tma"),
                    (128, 64, 64, 4, 3, "p2"), (128, 64, 64, 4, 3, "p2", "tma"), (64, 64, 64, 4, 4, "p2", "tma"),
                    (128, 128, 64, 8, 3, "tma"), (128, 64, 64, 8, 3, "p2", "tma")],
        "down": [(64, 128, 64, 4, 3, 1), (64, 128, 64, 4, 4, 1), (64, 128, 64, 4, 5, 1), (64, 128, 64, 8, 3, 1),
                 (64, 64, 64, 4, 3, 1), (128, 64, 64, 4, 3, 1), (64, 128, 64, 4, 3, 2), (64, 128, 64, 4, 4, 2),
                 (64, 64, 64, 4, 4, 2), (128, 64, 64, 4, 3, 2)],
    },
    "decode": {
        "gate_up": [(64, 64, 64, 4, 4), (32, 64, 64, 4, 6), (32, 64, 64, 4, 4, "swap"), (32, 64, 128, 4, 4, "swap"),
                    (32, 128, 64, 4, 4, "swap"), (32, 64, 64, 4, 6, "swap")],
        "down": [(32, 64, 128, 4, 4, 8), (32, 32, 128, 4, 4, 4), (32, 64, 128, 4, 4, 8, "swap"),
                 (32, 64, 128, 4, 4, 4, "swap"), (32, 128, 128, 4, 4, 8, "swap"), (32, 64, 64, 4, 6, 8, "swap")],
    },
    "prefill": {
        "gate_up": [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 8, 3, "p1"),
                    (128, 128, 64, 8, 4, "p1"), (128, 128, 64, 8, 4, "p1", "tma"), (128, 64, 64, 8, 4, "p2"),
                    (128, 128, 64, 8, 4, "p1", "g4"), (128, 128, 64, 8, 4, "p1", "g16"),
                    (128, 128, 64, 8, 4, "p1", "g32"), (128, 128, 64, 8, 4, "p1", "g64")],
        "down": [(128, 256, 64, 8, 3, 1), (128, 128, 64, 8, 3, 1), (128, 128, 64, 8, 4, 1), (128, 64, 128, 4, 3, 1)],
    },
}


def candidate_config(candidate: tuple) -> "gk.GemmConfig":
    """The GemmConfig of a SWEEP entry."""
    bm, bn, bk, warps, stages, *rest = candidate

    def numbered(letter, default):  # "p1" -> 1 for letter "p"
        return next((int(r[1:]) for r in rest if isinstance(r, str) and r.startswith(letter)), default)
    return gk.GemmConfig(bm, bn, bk, warps, stages, group_m=numbered("g", 8),
                            split_k=next((r for r in rest if isinstance(r, int)), 1), swap_ab="swap" in rest,
                            programs_per_sm=numbered("p", 0), tma_store="tma" in rest)


DEPENDENT_LAUNCH_MODES = ("none", "after_stores", "at_start")


def sweep(shape_name, m, d, ff, kinds=("gate_up", "down", "dependent_launch")):
    block, x = make_problem(m, d, ff)
    block = block.to(torch.bfloat16)
    ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps = op_args(block)
    # As inference runs the op: the LayerNorm scale folded into the gate/up weights (unless SK_GEGLU_FOLD_LN=0).
    folded = geglu.folded_gate_up(ln_w, ln_b, wg, bg, wu, bu, x.dtype) if sk.settings.get("geglu_fold_ln") else None
    base_gu, base_down = gk.choose_configs(m, d, ff, "folded" if folded is not None else "prologue")
    gate_up_weights = (wg, wu, None) if folded is None else (folded[0], None, folded[1])

    def run(gu_cfg, down_cfg):
        fwg, fwu, fold = gate_up_weights
        return lambda: gk.forward_kernels(x, ln_w, ln_b, fwg, bg, fwu, bu, wd, bd, eps, "none", False,
                                              (gu_cfg, down_cfg), fold=fold)
    results = {kind: [] for kind in kinds}
    for kind in kinds:
        # (label, config); "dependent_launch": the table's tiles, each way of launching the down kernel
        candidates = ([(mode, dataclasses.replace(base_gu, dependent_launch=mode)) for mode in DEPENDENT_LAUNCH_MODES]
                      if kind == "dependent_launch" else
                      [(cand, candidate_config(cand)) for cand in SWEEP[shape_name][kind]])
        for label, cfg in candidates:
            # Timed as the op would run it: blocks fitted to the problem (M = 32 at decode, say).
            run_cfg = cfg.fitted(m, d, ff) if kind == "down" else cfg.fitted(m, ff, d)
            cfgs = (base_gu, run_cfg) if kind == "down" else (run_cfg, base_down)
            try:
                us = graph_time_us(run(*cfgs), calls_per_replay=CALLS_PER_REPLAY, repeats=15)
            except Exception as e:  # e.g. out of shared memory: report and go on
                us = None
                print(f"  {kind} {label}: failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            results[kind].append({"config": dataclasses.asdict(cfg), "forward_us": us})
            print(f"  [{shape_name}] {kind} {label}: {us}", flush=True)
    return results


def compiled_kernels_report():
    """Registers, spills, shared memory and whether wgmma (Hopper's tensor-core path) is used, per compiled
    specialization of our kernels."""
    lines = []
    try:  # Triton's cache layout is internal: report what it gives, never fail the benchmark over it
        for name in ("gate_up_kernel", "down_kernel"):
            kernel_cache = getattr(gk, name).device_caches[torch.cuda.current_device()][0]
            for compiled in kernel_cache.values():
                compiled._init_handles()
                c = compiled.metadata
                lines.append(f"{name} warps={c.num_warps} stages={c.num_stages} shared={c.shared} "
                             f"regs={compiled.n_regs} spills={compiled.n_spills} "
                             f"wgmma={'wgmma' in compiled.asm['ptx']}")
    except Exception as e:
        lines.append(f"unavailable: {type(e).__name__}: {e}")
    return lines


def captured(step):
    """`step` after the calls that make the op capture its step graphs, so that timing starts with replays."""
    for _ in range(step_graphs.CAPTURE_AFTER + 1):
        step()
    torch.cuda.synchronize()
    return step


def torch_graphed_step_us(block, x, grad):
    """The eager block's step under `torch.cuda.make_graphed_callables` (forward and backward graphs, autocast
    without its weight cache, as torch requires): what graph replay alone does for PyTorch's own kernels."""
    graphed_block = copy.deepcopy(block)
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            graphed = torch.cuda.make_graphed_callables(graphed_block, (x,))

        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                y = graphed(x)
            y.backward(grad)
        return time_eager_us({"run": run}, repeats=20)["run"]
    except Exception as e:  # a peer measurement: reported as missing, not fatal to the run
        print(f"[train seed] torch.cuda.make_graphed_callables failed: {type(e).__name__}: {e}", flush=True)
        return float("nan")


def training_step(model, x, grad):
    """One forward + backward as the training benchmark and the peers file run it."""
    def run():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = model(x)
        y.backward(grad)
    return run


PROFILE_STEPS = 20


def profile_cases(names):
    """{case: profile_per_step(...)}: inference per shape (ours and the bf16 eager block, no grad, launched from
    Python) and the seed-shape training step (ours replayed and not, and eager)."""
    cases = {}
    for name in names:
        block_bf16, x, args = inference_problem(*SHAPES[name])
        with torch.no_grad():
            cases[f"{name}: ours"] = profile_per_step(lambda: sk.ops.fused_pre_norm_geglu(x, *args),
                                                      steps=PROFILE_STEPS)
            cases[f"{name}: eager"] = profile_per_step(lambda: block_bf16(x), steps=PROFILE_STEPS)
    block, x = make_problem(*SHAPES["seed"])
    x.requires_grad_()
    grad = torch.randn_like(x)
    ours = sk.nn.PreNormGEGLUFFN.from_module(block)
    cases["training step, seed: ours"] = profile_per_step(captured(training_step(ours, x, grad)),
                                                          steps=PROFILE_STEPS)
    cases["training step, seed: ours, no replay"] = profile_per_step(
        switched_off(training_step(ours, x, grad), "step_graphs"), steps=PROFILE_STEPS)
    cases["training step, seed: eager"] = profile_per_step(training_step(block, x, grad), steps=PROFILE_STEPS)
    return cases


def profile_markdown(meta, cases):
    lines = [f"# Pre-norm GEGLU block: where the time goes, bf16, {meta['gpu']}", "",
             f"{meta['date']}; torch {meta['torch']}, triton {meta['triton']}. torch.profiler over "
             f"{PROFILE_STEPS} calls launched from Python, per call. Kernels by GPU time; host ops by self CPU time; "
             "Python functions by self time under cProfile (a separate pass: its per-call overhead inflates them, "
             "compare them with each other).", ""]
    for case, p in cases.items():
        lines += [f"## {case}: kernels {p['kernel_us']:.1f} µs, host ops {p['host_us']:.1f} µs", "",
                  "| kernel | µs | launches | | host op | self µs | calls |", "|---|---|---|---|---|---|---|"]
        for i in range(max(len(p["kernels"]), len(p["host_ops"]))):
            k = p["kernels"][i] if i < len(p["kernels"]) else None
            h = p["host_ops"][i] if i < len(p["host_ops"]) else None
            lines.append((f"| `{k['name'][:60]}` | {k['us']:.1f} | {k['launches']:.0f} |" if k else "| | | |")
                         + (f" | `{h['name'][:50]}` | {h['self_us']:.1f} | {h['calls']:.0f} |" if h else " | | | |"))
        lines += ["", f"Python, {p['python_us']:.0f} µs per call under cProfile:", "",
                  "| function | self µs | calls |", "|---|---|---|"]
        lines += [f"| `{f['name'][:90]}` | {f['self_us']:.1f} | {f['calls']:.1f} |" for f in p["python"]]
        lines.append("")
    return "\n".join(lines)


def to_markdown(meta, rows, train):
    lines = [f"# Pre-norm GEGLU block, bf16, {meta['gpu']}", "",
             f"{meta['date']}; torch {meta['torch']}, triton {meta['triton']}. µs per call, median; `graph` = "
             f"{CALLS_PER_REPLAY} calls captured in one CUDA graph; `eager launch` = launched from Python.", "",
             "`ours` runs QuACK's CuTe-DSL GEMMs where the GEMMs column says cute "
             f"(QuACK {meta.get('quack') or 'not installed'}), else Triton's.", "",
             "| M × D → FF | GEMMs | ours (graph) | ours, Triton GEMMs (graph) | ours, LN not folded (graph) "
             "| ours, no PDL (graph) | ours (eager launch) | eager | eager in graph | max-autotune in graph "
             "| best PyTorch / ours | rel. err ours | rel. err ours, Triton GEMMs | rel. err ours, not folded "
             "| rel. err eager bf16 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        maxat = f"{r['maxat_graph_us']:.1f}" if "maxat_graph_us" in r else "not run"
        lines.append(
            f"| {r['M']} × {r['D']} → {r['FF']} | {r['gemms']} | {r['ours_graph_us']:.1f} "
            f"| {r['ours_triton_gemms_graph_us']:.1f} | {r['ours_unfolded_graph_us']:.1f} "
            f"| {r['ours_no_pdl_graph_us']:.1f} | {r['ours_eager_us']:.1f} | {r['eager_us']:.1f} "
            f"| {r['eager_graph_us']:.1f} | {maxat} "
            f"| {r['speedup_vs_best_measured']:.2f}× | {r['rel_err_ours_vs_fp64']:.1e} "
            f"| {r['rel_err_ours_triton_gemms_vs_fp64']:.1e} | {r['rel_err_ours_unfolded_vs_fp64']:.1e} "
            f"| {r['rel_err_eager_bf16_vs_fp64']:.1e} |")
    if train:
        t = train
        lines += ["", "Training step (forward + backward), FP32 masters, bf16 input, CUDA bf16 autocast, µs per step "
                  "(`ours` replays the step from CUDA graphs after two eager calls, `sk_core/ops/_step_graphs.py`, "
                  f"holding {t['step_graph_mib']:.0f} MiB for it; `no replay`: `SK_STEP_GRAPHS=0`):",
                  "",
                  "| M × D → FF | eager | ours | speedup | ours, no replay | speedup "
                  "| eager, masters updated each step | ours, same | speedup "
                  "| eager under torch.cuda.make_graphed_callables |", "|---|---|---|---|---|---|---|---|---|---|",
                  f"| {t['M']} × {t['D']} → {t['FF']} | {t['eager_step_us']:.0f} | {t['ours_step_us']:.0f} "
                  f"| {t['speedup']:.2f}× | {t['ours_no_replay_step_us']:.0f} | {t['speedup_no_replay']:.2f}× "
                  f"| {t['eager_step_with_update_us']:.0f} | {t['ours_step_with_update_us']:.0f} "
                  f"| {t['speedup_with_update']:.2f}× | {t['eager_torch_graphed_step_us']:.0f} |"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile max-autotune (slow)")
    parser.add_argument("--sweep", action="store_true", help="also time candidate tile configs")
    parser.add_argument("--sweep-kinds", default="gate_up,down,dependent_launch",
                        help="what --sweep varies: gate/up tiles, down tiles, the down kernel's dependent launch")
    parser.add_argument("--use-sweep-best", action="store_true",
                        help="benchmark with this run's fastest swept configs (to copy into the op's tables)")
    parser.add_argument("--shapes", default="seed,decode,prefill")
    parser.add_argument("--profile", action="store_true", help="also profile kernels and host ops per call")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_geglu: needs a CUDA GPU")
    os.makedirs(args.out_dir, exist_ok=True)
    meta = environment()
    try:
        meta["quack"] = importlib.metadata.version("quack-kernels")
    except importlib.metadata.PackageNotFoundError:
        meta["quack"] = None
    names = args.shapes.split(",")
    if args.sweep:
        found = {n: sweep(n, *SHAPES[n], kinds=args.sweep_kinds.split(",")) for n in names}
        with open(os.path.join(args.out_dir, "bench_geglu_sweep.json"), "w") as f:
            json.dump({"meta": meta, "sweep": found, "kernels": compiled_kernels_report()}, f, indent=1)
        for name, result in found.items():
            for kind, runs in result.items():
                timed = [r for r in runs if r["forward_us"]]
                if not timed:
                    continue
                best = min(timed, key=lambda r: r["forward_us"])
                print(f"sweep best [{name}] {kind}: {best}", flush=True)
                if args.use_sweep_best:
                    # the table the sweep timed: the folded gate/up kernel's, or (SK_GEGLU_FOLD_LN=0) the prologue's
                    table = (gk.DOWN_CONFIGS if kind == "down" else
                             gk.GATE_UP_CONFIGS if sk.settings.get("geglu_fold_ln") else gk.PROLOGUE_GATE_UP_CONFIGS)
                    cls = gk.shape_class(*SHAPES[name])
                    best_cfg = gk.GemmConfig(**best["config"])
                    # Tiles and launch mode are swept apart: each kind replaces only what it varied.
                    table[cls] = (dataclasses.replace(table[cls], dependent_launch=best_cfg.dependent_launch)
                                  if kind == "dependent_launch" else
                                  dataclasses.replace(best_cfg, dependent_launch=table[cls].dependent_launch))
                    gk.choose_configs.cache_clear()
        meta["configs"] = {"gate_up": {k: dataclasses.asdict(v) for k, v in gk.GATE_UP_CONFIGS.items()},
                           "down": {k: dataclasses.asdict(v) for k, v in gk.DOWN_CONFIGS.items()}}
    def save(rows, train):  # after every step, so that a run cut short still leaves what it measured
        with open(os.path.join(args.out_dir, "bench_geglu.json"), "w") as f:
            json.dump({"meta": meta, "inference": rows, "training": train}, f, indent=1)
        with open(os.path.join(args.out_dir, "bench_geglu.md"), "w") as f:
            f.write(to_markdown(meta, rows, train))

    if args.profile:
        cases = profile_cases(names)
        with open(os.path.join(args.out_dir, "profile_geglu.json"), "w") as f:
            json.dump({"meta": meta, "cases": cases}, f, indent=1)
        with open(os.path.join(args.out_dir, "profile_geglu.md"), "w") as f:
            f.write(profile_markdown(meta, cases))

    rows, train = [], None
    train = bench_training(*SHAPES["seed"])
    save(rows, train)
    # torch.compile's max-autotune takes minutes: every shape is measured without it first.
    for with_compile in (False, True) if not args.no_compile else (False,):
        for i, n in enumerate(names):
            row = bench_inference(n, *SHAPES[n], with_compile=with_compile)
            rows[i:i + 1] = [row]
            save(rows, train)
    print(to_markdown(meta, rows, train))


if __name__ == "__main__":
    main()
