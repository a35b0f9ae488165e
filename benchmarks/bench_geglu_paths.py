"""The Getting Started page's own paths, timed side by side on the GPU: what a user following it gets.

    python benchmarks/bench_geglu_paths.py OUT_DIR [--shapes seed,decode,prefill] [--compile] [--no-training]

Per shape (bf16 input), µs per call:
- in a CUDA graph of 20 calls, all interleaved in one run (`sk.bench.timing.side_by_side_us`), each under
  `no_grad` and under `inference_mode`: the op with BF16 weights (the op's own target), the op with the FP32
  weights of a `.cuda()` block (Method 1), the prebuilt module with FP32 masters (Method 2), the module built
  inside `inference_mode` (inference-tensor parameters), PyTorch eager, and with `--compile`
  `torch.compile(mode="max-autotune-no-cudagraphs")` of the eager block;
- launched from Python, back to back: the op and the module, and `make_graphed_callables(block, (x,))` called
  as the page shows (`graphed(x)`) against its bare `graphed.graph.replay()`: the difference is what the callable
  adds per call (checks, the input copy).
Training (forward + backward, FP32 masters, bf16 input, CUDA bf16 autocast), µs per step launched from Python:
eager, `torch.compile` of the eager block, ours with each training-GEMM route (`SK_GEGLU_TRAIN_GEMMS`), with
and without an update of every master before each step; and a kernel profile of each step.

Writes OUT_DIR/bench_geglu_paths.json and .md (GPU, versions, date).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback

import torch

import sk
from sk.bench.timing import environment, profile_per_step, side_by_side_us
from sk.cuda_graphs import make_graphed_callables
from sk.nn import PreNormGEGLUFFN

sys.path.insert(0, os.path.dirname(__file__))
from bench_geglu import CALLS_PER_REPLAY, SHAPES, EagerBlock, make_problem, op_args, rel_err  # noqa: E402

CONTEXTS = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
FROM_PYTHON_CALLS = 50  # per sample of the Python-launched timings


def in_context(ctx, fn):
    def run():
        with ctx():
            return fn()
    return run


def from_python_us(fns: dict, repeats: int = 20) -> dict:
    """Median µs per call of each fn launched from Python, FROM_PYTHON_CALLS back to back per sample, the fns'
    samples interleaved."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start.record()
            for _ in range(FROM_PYTHON_CALLS):
                fn()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) * 1000 / FROM_PYTHON_CALLS)
    return {name: statistics.median(s) for name, s in samples.items()}


def inference_row(name: str, m: int, d: int, ff: int, with_compile: bool) -> dict:
    eager_fp32, x = make_problem(m, d, ff)  # the page's `MyGEGLUBlock().cuda()`: FP32 weights
    eager_bf16 = EagerBlock(d, ff).cuda().to(torch.bfloat16)
    eager_bf16.load_state_dict(eager_fp32.state_dict())
    module = PreNormGEGLUFFN.from_module(eager_fp32).eval()
    with torch.inference_mode():
        module_inf = PreNormGEGLUFFN(d, ff).cuda().eval()  # parameters are inference tensors
        module_inf.load_state_dict(module.state_dict())
    bf16_args, fp32_args = op_args(eager_bf16), op_args(eager_fp32)
    paths = {
        "op_bf16_weights": lambda: sk.ops.fused_pre_norm_geglu(x, *bf16_args),
        "op_fp32_weights": lambda: sk.ops.fused_pre_norm_geglu(x, *fp32_args),
        "module": lambda: module(x),
        "module_built_in_inference_mode": lambda: module_inf(x),
        "eager": lambda: eager_bf16(x),
    }
    row = {"shape": name, "M": m, "D": d, "FF": ff, "graph_us": {}, "python_us": {}, "errors": {}}
    with torch.no_grad():
        ref = sk.ops.fused_pre_norm_geglu(x, *bf16_args).double()
        for path, fn in paths.items():
            row["errors"][path] = rel_err(fn(), ref)  # every path computes the same block
    fns = {f"{path}, {ctx_name}": in_context(ctx, fn) for path, fn in paths.items()
           for ctx_name, ctx in CONTEXTS.items()}
    if with_compile:
        compiled = torch.compile(eager_bf16, mode="max-autotune-no-cudagraphs")
        t0 = time.time()
        with torch.no_grad():
            compiled(x)
        row["maxat_compile_s"] = time.time() - t0
        fns["max-autotune, no_grad"] = in_context(torch.no_grad, lambda: compiled(x))

    def failed(variant, e):
        print(f"[{name}] {variant}: {''.join(traceback.format_exception(e))}", flush=True)
        row.setdefault("failures", {})[variant] = f"{type(e).__name__}: {e}"
    with sk.coverage.strict():  # a fast path that falls back would raise here, not time the reference
        # Prefill's calls take milliseconds: fewer rounds keep the run inside one device command.
        row["graph_us"] = side_by_side_us(fns, calls_per_replay=CALLS_PER_REPLAY, on_error=failed,
                                          repeats=50 if m * d * ff < 2 ** 32 else 12)
        with torch.inference_mode():
            graphed = make_graphed_callables(module, (x,))
            graph = graphed.graph
            row["python_us"] = from_python_us({
                "op_bf16_weights, inference_mode": paths["op_bf16_weights"],
                "module, inference_mode": paths["module"],
                "graphed_block(x)": lambda: graphed(x),
                "graphed_block.graph.replay()": graph.replay,
            })
    p = row["python_us"]
    row["graphed_call_overhead_us"] = p["graphed_block(x)"] - p["graphed_block.graph.replay()"]
    g = row["graph_us"]
    for ctx_name in CONTEXTS:
        op = g[f"op_bf16_weights, {ctx_name}"]
        for path in ("op_fp32_weights", "module", "module_built_in_inference_mode"):
            v = g[f"{path}, {ctx_name}"]
            row.setdefault("vs_op_bf16", {})[f"{path}, {ctx_name}"] = None if v is None or op is None else v / op
    print(f"[{name}] graph: " + ", ".join(f"{k} {v:.1f}" for k, v in g.items() if v is not None), flush=True)
    print(f"[{name}] from Python: " + ", ".join(f"{k} {v:.1f}" for k, v in p.items())
          + f"; graphed call overhead {row['graphed_call_overhead_us']:.1f} us", flush=True)
    return row


def training_row(name: str, m: int, d: int, ff: int) -> dict:
    block, x = make_problem(m, d, ff)
    x.requires_grad_()
    grad = torch.randn_like(x)
    ours = PreNormGEGLUFFN.from_module(block)
    compiled = torch.compile(block)

    def step(model, setting=None, update=False):
        params = list(model.parameters())
        ctx = (lambda: sk.settings.override(geglu_train_gemms=setting)) if setting else contextlib.nullcontext

        def run():
            if update:  # an optimizer step changes every master in place
                with torch.no_grad():
                    torch._foreach_mul_(params, 1.0)
            with ctx(), torch.autocast("cuda", dtype=torch.bfloat16):
                y = model(x)
            y.backward(grad)
        return run
    variants = {"eager": step(block), "torch.compile": step(compiled), "ours": step(ours),
                "ours, triton GEMMs": step(ours, "triton"), "ours, cuBLAS GEMMs": step(ours, "cublas"),
                "eager, masters updated": step(block, update=True),
                "torch.compile, masters updated": step(compiled, update=True),
                "ours, masters updated": step(ours, update=True)}
    for fn in variants.values():  # compile, capture step graphs (small shapes), warm caches
        for _ in range(4):
            fn()
    torch.cuda.synchronize()
    repeats = 10 if m * d * ff > 2 ** 32 else 30
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = {k: [] for k in variants}
    for _ in range(repeats):
        for k, fn in variants.items():
            start.record()
            for _ in range(5):
                fn()
            end.record()
            end.synchronize()
            samples[k].append(start.elapsed_time(end) * 1000 / 5)
    times = {k: statistics.median(s) for k, s in samples.items()}
    best_peer = min(times["eager"], times["torch.compile"])
    row = {"shape": name, "M": m, "D": d, "FF": ff, "step_us": times,
           "ours_vs_best_peer": best_peer / times["ours"],
           "ours_vs_best_peer_with_update": min(times["eager, masters updated"],
                                                times["torch.compile, masters updated"])
           / times["ours, masters updated"],
           "profile": {k: profile_per_step(variants[k], steps=5)
                       for k in ("eager", "torch.compile", "ours, triton GEMMs", "ours, cuBLAS GEMMs")}}
    print(f"[train {name}] " + ", ".join(f"{k} {v:.0f}" for k, v in times.items())
          + f"; ours vs best peer {row['ours_vs_best_peer']:.3f}x", flush=True)
    return row


def to_markdown(meta: dict, rows: list, train: list) -> str:
    out = [f"# The Getting Started page's paths, bf16, {meta['gpu']}", "",
           f"{meta['date']}; torch {meta['torch']}, triton {meta['triton']}, QuACK {meta.get('quack')}. "
           f"µs per call, medians. Graph: {CALLS_PER_REPLAY} calls in one CUDA graph, all paths interleaved in one "
           "run. From Python: calls launched back to back.", ""]
    for r in rows:
        g, p, v = r["graph_us"], r["python_us"], r["vs_op_bf16"]
        out += [f"## {r['shape']}: {r['M']} × {r['D']} → {r['FF']}", "",
                "| path | no_grad (graph) | ÷ op, bf16 weights | inference_mode (graph) | ÷ op, bf16 weights "
                "| rel. err vs op |", "|---|---|---|---|---|---|"]
        for path in ("op_bf16_weights", "op_fp32_weights", "module", "module_built_in_inference_mode", "eager"):
            cells = []
            for ctx in CONTEXTS:
                t = g.get(f"{path}, {ctx}")
                ratio = v.get(f"{path}, {ctx}")
                cells += [f"{t:.1f}" if t is not None else "failed",
                          f"{ratio:.3f}" if ratio is not None else ("1" if path == "op_bf16_weights" else "")]
            out.append(f"| {path} | " + " | ".join(cells) + f" | {r['errors'][path]:.1e} |")
        if "max-autotune, no_grad" in g and g["max-autotune, no_grad"] is not None:
            out.append(f"| max-autotune | {g['max-autotune, no_grad']:.1f} | | | | |")
        out += ["", "| from Python | µs per call |", "|---|---|"]
        out += [f"| `{k}` | {t:.1f} |" for k, t in p.items()]
        out += [f"| graphed call − bare replay | **{r['graphed_call_overhead_us']:.1f}** |", ""]
    for t in train:
        out += [f"## Training step {t['shape']}: {t['M']} × {t['D']} → {t['FF']} (forward + backward, FP32 masters, "
                "bf16 autocast)", "", "| variant | µs per step |", "|---|---|"]
        out += [f"| {k} | {s:.0f} |" for k, s in t["step_us"].items()]
        out += ["", f"Ours vs the best of eager and torch.compile: **{t['ours_vs_best_peer']:.3f}×** "
                f"({t['ours_vs_best_peer_with_update']:.3f}× with the masters updated before each step).", ""]
        for k, prof in t["profile"].items():
            out += [f"Kernels, {k} (µs per step, top): " + "; ".join(
                f"`{e['name'][:48]}` {e['us']:.0f}" for e in prof["kernels"][:8]), ""]
    return "\n".join(out) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--shapes", default="seed,decode,prefill")
    parser.add_argument("--training-shapes", default="seed,prefill")
    parser.add_argument("--compile", action="store_true", help="also max-autotune in the graph table (minutes)")
    parser.add_argument("--no-training", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_geglu_paths: needs a CUDA GPU")
    os.makedirs(args.out_dir, exist_ok=True)
    meta = environment()
    try:
        import importlib.metadata
        meta["quack"] = importlib.metadata.version("quack-kernels")
    except Exception:
        meta["quack"] = None
    rows, train = [], []

    def save():
        with open(os.path.join(args.out_dir, "bench_geglu_paths.json"), "w") as f:
            json.dump({"meta": meta, "inference": rows, "training": train}, f, indent=1)
        with open(os.path.join(args.out_dir, "bench_geglu_paths.md"), "w") as f:
            f.write(to_markdown(meta, rows, train))
    for name in args.shapes.split(","):
        rows.append(inference_row(name, *SHAPES[name], with_compile=args.compile))
        save()
    if not args.no_training:
        for name in args.training_shapes.split(","):
            train.append(training_row(name, *SHAPES[name]))
            save()
    print(to_markdown(meta, rows, train))


if __name__ == "__main__":
    main()
