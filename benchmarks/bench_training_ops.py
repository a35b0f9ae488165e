"""Training-side benchmark of the norms and gated activations: forward + backward per call, ours side by side with
Liger-Kernel, QuACK's RMSNorm, torch.compile and PyTorch eager, on one GPU (bf16).

    python benchmarks/bench_training_ops.py --out DIR [--quick] [--no-compile] [--fp32-weights] [--sweep]

Each implementation's call is one forward and one backward (`torch.autograd.grad` of the outputs for fixed
cotangents, with respect to every input: x, the residual and the weight), timed per call inside a CUDA graph the
house way (`sk.bench.timing.side_by_side_us`: 20 calls per replay, median of 50 replays, implementations
interleaved; 4 calls and 20 replays for steps moving >= 256 MiB, where launch overhead is noise). Achieved bandwidth = the bytes the step must move / time, the bytes being each tensor the forward
and the backward must read or write once at the op's width (weights and the per-row statistics excluded, being
< 0.1 %):

    rms_norm, gemma_rms_norm   forward x→y, backward x,dy→dx              5·M·N elements
    fused_add_rms_norm         forward x,r→y,h, backward h,dy,dh→dx        8·M·N (dx = dresidual, one tensor)
    *_and_mul (M × 2d input)   forward x→y (3·M·d), backward x,dy→dx (5·M·d)   8·M·d

and compared with the device-to-device copy bandwidth measured in the same run. The numerics of each
implementation (outputs and gradients, relative norm error against fp64 autograd of the formula) are measured
at one mid size and written beside the times, so that ours can be read against each peer's own bf16 error.

Peers are imported when present and skipped (logged) otherwise:
- Liger-Kernel, pinned `liger-kernel==0.8.5` (Triton kernels; works with triton 3.6 / torch 2.11). On the
  offline GPU host: stage its wheel in `.whl/` (`pip download liger-kernel==0.8.5 --no-deps -d .whl`;
  `ci/gpu/run.sh` installs `.whl/*.whl` with --no-deps into /tmp/sk-peers, or
  `pip install --no-deps --target /tmp/sk-peers .whl/liger_kernel-0.8.5-*.whl` and PYTHONPATH=/tmp/sk-peers).
  Liger is called as its own modules call it: `LigerRMSNormFunction` (in_place=True, its default: dx is written
  into dy's memory), `LigerFusedAddRMSNormFunction`, `LigerSiLUMulFunction` / `LigerGELUMulFunction` (tanh GELU
  only) on separate contiguous gate and up tensors (its API; the bytes are the same).
- QuACK, `quack-kernels==0.6.5` as pinned in ci/gpu/cute.lock.txt (`quack.rmsnorm.RMSNormFunction`, RMSNorm,
  Gemma's 1 + w as its weight_offset, and the residual form; no activations).
- torch.compile of the PyTorch references (default mode, dynamic=True: one compile per op for every M, the
  width static; Inductor generates the backward too).

`--sweep` first times our norm backward alone at the two largest sizes over its launch constants
(`sk.ops.rms_norm.BACKWARD_PROGRAMS_PER_SM` x `BACKWARD_NUM_STAGES` x `BACKWARD_TILE_ELEMENTS` x
`BACKWARD_ELEMENTS_PER_WARP` x `BACKWARD_SUM_COLUMNS`: 24 configurations around the current default and 5
references), then SiLU·mul's backward over `sk.ops.act_and_mul.BACKWARD_BLOCK` x `BACKWARD_NUM_WARPS` (12;
bench_training_ops_sweep.json/.md, a few minutes)
and runs the comparison with the fastest.

Writes DIR/bench_training_ops.json and DIR/bench_training_ops.md (GPU, versions, date). Takes ~4-6 minutes on an
H200 with compile (most of it Inductor compiling), ~2 without; --quick times the two largest sizes only.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import pathlib
import sys
import traceback
from typing import Callable

import torch

import sk
from sk.bench.timing import copy_bandwidth_tbps, environment, side_by_side_us
from sk.ops.act_and_mul import act_and_mul_reference
from sk.ops.rms_norm import fused_add_rms_norm_reference, rms_norm_reference

NORM_ROWS, NORM_WIDTH = (1024, 4096, 16384, 32768), 4096
ACT_ROWS, ACT_WIDTH = (1024, 4096, 16384), 28672  # input width: [gate, up] of 14336 each
ACCURACY_ROWS = {"norm": 4096, "act": 1024}
EPS = 1e-6
OURS = "sk"
LIGER_PIN = "0.8.5"


@dataclasses.dataclass
class Case:
    op: str
    rows: int
    width: int
    nbytes: int
    impls: dict[str, Callable[[], object]]
    accuracy: dict[str, Callable[[], dict]] | None = None


def _peers(log) -> dict:
    found = {}
    try:
        import liger_kernel
        from liger_kernel.ops import fused_add_rms_norm, geglu, rms_norm, swiglu

        found["liger"] = (rms_norm.LigerRMSNormFunction, fused_add_rms_norm.LigerFusedAddRMSNormFunction,
                          swiglu.LigerSiLUMulFunction, geglu.LigerGELUMulFunction)
        version = getattr(liger_kernel, "__version__", None)
        if version is None:
            import importlib.metadata

            version = importlib.metadata.version("liger-kernel")
        if version != LIGER_PIN:
            log(f"note: liger-kernel {version} imported, the pin is {LIGER_PIN}")
        found["liger_version"] = version
    except Exception as e:
        log(f"liger-kernel not importable ({type(e).__name__}: {e}); skipped")
    try:
        import importlib

        # The module: `quack.rmsnorm` as an attribute is the function the package re-exports.
        found["quack"] = importlib.import_module("quack.rmsnorm").RMSNormFunction
    except Exception as e:
        log(f"quack.rmsnorm not importable ({type(e).__name__}: {e}); skipped")
    return found


def _grad_step(forward, inputs, cotangents):
    """One forward + backward: the gradients of forward(*inputs) for `cotangents` w.r.t. every input."""
    def step():
        outputs = forward(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return torch.autograd.grad(outputs, inputs, cotangents)
    return step


def _fp64_norm(x, w, offset, r=None):
    h = x if r is None else x + r
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * (w + offset)
    return (y,) if r is None else (y, h)


def _accuracy(forward, inputs, cotangents, fp64) -> dict:
    """Relative norm errors of outputs and gradients against fp64 autograd of the formula at these inputs."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outputs = forward(*leaves)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    grads = torch.autograd.grad(outputs, leaves, [c.clone() for c in cotangents])
    leaves64 = [t.detach().double().requires_grad_() for t in inputs]
    want = fp64(*leaves64)
    want = want if isinstance(want, tuple) else (want,)
    want_grads = torch.autograd.grad(want, leaves64, [c.double() for c in cotangents])

    def err(a, b):
        return ((a.double() - b).norm() / b.norm().clamp_min(1e-300)).item()
    return {"outputs": max(err(a, b) for a, b in zip(outputs, want)),
            "grads": {f"d{i}": err(a, b) for i, (a, b) in enumerate(zip(grads, want_grads))}}


def _norm_cases(peers, dtype, rows_list, compile_on, weight_dtype) -> list[Case]:
    cases = []
    compiled = {False: torch.compile(rms_norm_reference, dynamic=True),
                True: torch.compile(fused_add_rms_norm_reference, dynamic=True)}
    for m in rows_list:
        n = NORM_WIDTH
        gen = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen).requires_grad_()
        r = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen).requires_grad_()
        w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(weight_dtype).requires_grad_()
        dy, dh = torch.randn_like(x), torch.randn_like(x)
        size = x.element_size()
        for op, offset in (("rms_norm", 0.0), ("gemma_rms_norm", 1.0)):
            ours = sk.ops.gemma_rms_norm if offset else sk.ops.rms_norm
            fns = {
                OURS: lambda x, w, ours=ours: ours(x, w, EPS),
                "eager": lambda x, w, o=offset: rms_norm_reference(x, w, EPS, o),
            }
            if compile_on:
                fns["compile"] = lambda x, w, o=offset: compiled[False](x, w, EPS, o)
            if "liger" in peers:
                lrms = peers["liger"][0]
                fns["liger"] = lambda x, w, o=offset: lrms.apply(x, w, EPS, o, "gemma" if o else "llama")
                liger_dy = dy.clone()  # Liger writes dx into dy's memory (in_place=True): its own copy
            if "quack" in peers:  # Gemma's 1 + w: QuACK's weight_offset
                qrms = peers["quack"]
                fns["quack"] = lambda x, w, o=offset: qrms.apply(x, w, None, None, None, None, EPS, False, o)
            impls = {k: _grad_step(f, (x, w), (liger_dy if k == "liger" else dy,)) for k, f in fns.items()}
            acc = None
            if m == ACCURACY_ROWS["norm"]:
                acc = {k: (lambda f=f, o=offset: _accuracy(f, (x, w), (dy,), lambda a, b: _fp64_norm(a, b, o)))
                       for k, f in fns.items()}
            cases.append(Case(op, m, n, 5 * m * n * size, impls, acc))
        fns = {
            OURS: lambda x, r, w: sk.ops.fused_add_rms_norm(x, r, w, EPS),
            "eager": lambda x, r, w: fused_add_rms_norm_reference(x, r, w, EPS),
        }
        if compile_on:
            fns["compile"] = lambda x, r, w: compiled[True](x, r, w, EPS)
        if "liger" in peers:
            ladd = peers["liger"][1]
            fns["liger"] = lambda x, r, w: ladd.apply(x, r, w, EPS)
        if "quack" in peers:
            qrms = peers["quack"]
            fns["quack"] = lambda x, r, w: qrms.apply(x, w, None, r, None, None, EPS, True)
        impls = {k: _grad_step(f, (x, r, w), (dy, dh)) for k, f in fns.items()}
        acc = None
        if m == ACCURACY_ROWS["norm"]:
            acc = {k: (lambda f=f: _accuracy(f, (x, r, w), (dy, dh), lambda a, b, c: _fp64_norm(a, c, 0.0, b)))
                   for k, f in fns.items()}
        cases.append(Case("fused_add_rms_norm", m, n, 8 * m * n * size, impls, acc))
    return cases


def _fp64_act(x, activation):
    from sk.ops.act_and_mul import act_and_mul_reference as ref
    return ref(x, activation)  # the reference computes in fp64 for fp64 inputs


def _act_cases(peers, dtype, rows_list, compile_on) -> list[Case]:
    cases = []
    compiled = torch.compile(act_and_mul_reference, dynamic=True)
    for m in rows_list:
        width, d = ACT_WIDTH, ACT_WIDTH // 2
        gen = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, width, device="cuda", dtype=dtype, generator=gen).requires_grad_()
        gate, up = (x.detach()[:, :d].clone().requires_grad_(), x.detach()[:, d:].clone().requires_grad_())
        dy = torch.randn(m, d, device="cuda", dtype=dtype, generator=gen)
        for op, act in (("silu_and_mul", "silu"), ("gelu_tanh_and_mul", "gelu_tanh"), ("gelu_and_mul", "gelu")):
            ours = {"silu": lambda x: sk.ops.silu_and_mul(x),
                    "gelu_tanh": lambda x: sk.ops.gelu_and_mul(x, approximate="tanh"),
                    "gelu": lambda x: sk.ops.gelu_and_mul(x)}[act]
            fns = {OURS: ours, "eager": lambda x, act=act: act_and_mul_reference(x, act)}
            if compile_on:
                fns["compile"] = lambda x, act=act: compiled(x, act)
            impls = {k: _grad_step(f, (x,), (dy,)) for k, f in fns.items()}
            acc_fns = dict(fns)
            if "liger" in peers and act != "gelu":  # Liger's GEGLU is the tanh approximation only
                lfn = peers["liger"][2 if act == "silu" else 3]
                impls["liger"] = _grad_step(lambda a, b, lfn=lfn: lfn.apply(a, b), (gate, up), (dy,))
                # For its accuracy, the same [gate | up] input split into its two arguments.
                acc_fns["liger"] = lambda x, lfn=lfn, d=d: lfn.apply(x[:, :d].contiguous(), x[:, d:].contiguous())
            acc = None
            if m == ACCURACY_ROWS["act"]:
                acc = {k: (lambda f=f, act=act: _accuracy(f, (x,), (dy,), lambda a: _fp64_act(a, act)))
                       for k, f in acc_fns.items()}
            cases.append(Case(op, m, width, 8 * m * d * x.element_size(), impls, acc))
    return cases


def run(out_dir: pathlib.Path, *, quick: bool, compile_on: bool, weight_dtype: torch.dtype, log=print) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16
    peers = _peers(log)
    copy_tbps = copy_bandwidth_tbps()
    log(f"copy bandwidth {copy_tbps:.2f} TB/s; peers: {[k for k in ('liger', 'quack') if k in peers] or 'none'}")
    sk.warmup(hidden_sizes=[NORM_WIDTH], intermediate_sizes=[ACT_WIDTH // 2], dtypes=[dtype], training=True)
    norm_rows = NORM_ROWS[-2:] if quick else NORM_ROWS
    act_rows = ACT_ROWS[-2:] if quick else ACT_ROWS
    rows, accuracy = [], []
    for case in (_norm_cases(peers, dtype, norm_rows, compile_on, weight_dtype)
                 + _act_cases(peers, dtype, act_rows, compile_on)):
        # Past ~100 µs a call launch overhead is noise: fewer calls per replay and replays keep the run short.
        big = case.nbytes >= 256 << 20
        with sk.coverage.strict():  # ours must run its kernels, forward and backward
            times = side_by_side_us(case.impls, calls_per_replay=4 if big else 20, repeats=20 if big else 50,
                                    on_error=lambda name, e: log(
                f"  {case.op} M={case.rows} {name}: {type(e).__name__}: {str(e)[:200]}"))
        if times.get(OURS) is None:
            raise RuntimeError(f"{case.op} M={case.rows}: our kernels failed; see the log above")
        theirs = {k: v for k, v in times.items() if k != OURS and v is not None}
        best_peer = min(theirs, key=theirs.get) if theirs else None
        tbps = case.nbytes / (times[OURS] * 1e-6) / 1e12
        row = {"op": case.op, "M": case.rows, "N": case.width, "bytes": case.nbytes, "us": times,
               "sk_TBps": tbps, "sk_pct_copy": 100 * tbps / copy_tbps,
               "TBps": {k: case.nbytes / (v * 1e-6) / 1e12 for k, v in times.items() if v is not None},
               "best_peer": best_peer, "sk_vs_best_peer": theirs[best_peer] / times[OURS] if best_peer else None}
        rows.append(row)
        log(f"{case.op:>20} M={case.rows:<6} sk {times[OURS]:9.2f} µs {tbps:5.2f} TB/s ({row['sk_pct_copy']:.0f}% "
            f"of copy)  best peer {best_peer} {theirs.get(best_peer, float('nan')):9.2f} µs")
        if case.accuracy:
            for name, fn in case.accuracy.items():
                try:
                    accuracy.append({"op": case.op, "M": case.rows, "impl": name, **fn()})
                except Exception as e:
                    log(f"  accuracy {case.op} {name}: {type(e).__name__}: {str(e)[:200]}")
        torch.cuda.empty_cache()
    result = {"environment": environment(), "copy_TBps": copy_tbps, "dtype": str(dtype),
              "weight_dtype": str(weight_dtype), "liger_kernel": peers.get("liger_version"),
              "compile": compile_on, "rows": rows, "accuracy": accuracy,
              "command": " ".join(sys.argv)}
    (out_dir / "bench_training_ops.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "bench_training_ops.md").write_text(markdown(result))
    return result


def markdown(result: dict) -> str:
    env = result["environment"]
    impls = sorted({k for r in result["rows"] for k in r["us"]}, key=lambda k: (k != OURS, k))
    lines = [
        f"# Training ops (forward + backward) on {env['gpu']} ({env['arch']}), {env['date']}",
        "",
        f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, liger-kernel {result['liger_kernel']}; "
        f"{result['dtype']} activations, {result['weight_dtype']} weights. µs per forward + backward call inside "
        f"a CUDA graph (20 calls per replay, median of 50 replays; 4 and 20 from 256 MiB moved; implementations "
        f"interleaved); bandwidth = bytes "
        f"the step must move / time. Copy bandwidth in the same run: {result['copy_TBps']:.2f} TB/s. "
        f"`vs best peer` > 1: ours is faster. Command: `{result['command']}`",
        "",
        "| op | M | N | " + " | ".join(f"{k} µs" for k in impls) + " | sk TB/s | % of copy | vs best peer |",
        "|---|---|---|" + "---|" * len(impls) + "---|---|---|",
    ]
    for r in result["rows"]:
        cells = [f"{r['us'][k]:.1f}" if r["us"].get(k) is not None else "" for k in impls]
        ratio = f"{r['sk_vs_best_peer']:.2f}× ({r['best_peer']})" if r["best_peer"] else ""
        lines.append(f"| {r['op']} | {r['M']} | {r['N']} | " + " | ".join(cells)
                     + f" | {r['sk_TBps']:.2f} | {r['sk_pct_copy']:.0f}% | {ratio} |")
    if result["accuracy"]:
        lines += ["", "Relative norm error against fp64 autograd of the formula (worst output; each gradient):", "",
                  "| op | M | impl | outputs | gradients |", "|---|---|---|---|---|"]
        for a in result["accuracy"]:
            grads = ", ".join(f"{k} {v:.1e}" for k, v in a["grads"].items())
            lines.append(f"| {a['op']} | {a['M']} | {a['impl']} | {a['outputs']:.1e} | {grads} |")
    return "\n".join(lines) + "\n"


SWEEP_CONSTANTS = ("BACKWARD_PROGRAMS_PER_SM", "BACKWARD_NUM_STAGES", "BACKWARD_TILE_ELEMENTS",
                   "BACKWARD_ELEMENTS_PER_WARP", "BACKWARD_SUM_COLUMNS")
# Each constant's alternatives, around the launch the first sweep chose (2, 2, 2048, 512; results/h200/ops/README.md,
# 2026-12-03: 8192-element tiles were slower there). That sweep summed the weight gradient's partial rows in 4
# programs, a cost that grew with the programs per SM, so 3 and 4 are timed again with the wide sum. Beside the
# grid, as references: that launch with the old sum (1024 columns a program) and with narrower and wider sums,
# Liger-Kernel's launch at 4096 wide (a program per SM, 8 warps) and the default before the first sweep.
SWEEP_VALUES = ((2, 3, 4), (2, 3), (2048, 4096), (512, 1024), (64,))
SWEEP_REFERENCES = ((2, 2, 2048, 512, 1024), (2, 2, 2048, 512, 16), (2, 2, 2048, 512, 256), (1, 1, 2048, 512, 64),
                    (4, 1, 2048, 256, 1024))


# The activation backward's block and warps (`sk.ops.act_and_mul`, above its small-problem size), timed on
# SiLU·mul at the two largest sizes; SiLU and tanh GELU take the fastest (erf GELU keeps the forward's launch).
ACT_SWEEP_CONSTANTS = ("BACKWARD_BLOCK", "BACKWARD_NUM_WARPS")
ACT_SWEEP_VALUES = ((1024, 2048, 4096, 8192), (4, 8, 16))


def _label(names, config) -> str:
    return ",".join(f"{name.removeprefix('BACKWARD_').lower()}={value}" for name, value in zip(names, config))


def _sweep_module(module, names, configs, cases, log) -> tuple[str, list[dict]]:
    """Time each launch config (module constants `names`) on each case (label, bytes, call); set the fastest
    (summed over the cases) and return (its label, the rows)."""
    def apply(config):
        for name, value in zip(names, config):
            setattr(module, name, value)

    by_label = {_label(names, c): c for c in configs}
    results = []
    for case, nbytes, call in cases:
        fns = {}
        for label, config in by_label.items():
            def fn(config=config):
                apply(config)
                return call()
            fns[label] = fn
        # Each call sets its constants before launching: captured graphs keep each config's launch.
        times = side_by_side_us(fns, on_error=lambda name, e: log(f"  sweep {name}: {type(e).__name__}: {e}"))
        for label, us in times.items():
            results.append({**case, "config": label, "us": us,
                            "TBps": nbytes / (us * 1e-6) / 1e12 if us else None})
            log(f"  sweep {case} {label}: {us if us is None else round(us, 2)} µs")
    totals = {}
    for row in results:
        if row["us"] is not None:
            totals[row["config"]] = totals.get(row["config"], 0.0) + row["us"]
    best = min(totals, key=totals.get)
    apply(by_label[best])
    return best, results


def sweep(out_dir: pathlib.Path, log=print) -> dict:
    """Time our norm backward (rms_norm / fused_add_rms_norm) and SiLU·mul backward alone (fixed saved inputs and
    cotangents) over their launch constants at the two largest sizes; set the fastest of each and return the
    tables."""
    norm = importlib.import_module("sk.ops.rms_norm")
    act = importlib.import_module("sk.ops.act_and_mul")
    norm_default = _label(SWEEP_CONSTANTS, tuple(getattr(norm, name) for name in SWEEP_CONSTANTS))
    act_default = _label(ACT_SWEEP_CONSTANTS, tuple(getattr(act, name) for name in ACT_SWEEP_CONSTANTS))
    norm_cases, act_cases = [], []
    for m in NORM_ROWS[-2:]:
        n = NORM_WIDTH
        x, dy, dh = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16)
        for fused in (False, True):
            norm_cases.append(({"op": "rms_norm", "M": m, "N": n, "fused": fused}, (4 if fused else 3) * m * n * 2,
                               lambda x=x, dy=dy, dh=dh, w=w, fused=fused: torch.ops.sk.rms_norm_backward(
                                   dy, x, w, dh if fused else None, EPS, 0.0, fused, True)))
    for m in ACT_ROWS[-2:]:
        x = torch.randn(m, ACT_WIDTH, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, ACT_WIDTH // 2, device="cuda", dtype=torch.bfloat16)
        # x and dy read, dx written (as wide as x).
        act_cases.append(({"op": "silu_and_mul", "M": m, "N": ACT_WIDTH}, (2 * x.numel() + dy.numel()) * 2,
                          lambda x=x, dy=dy: torch.ops.sk.act_and_mul_backward(dy, x, "silu")))
    norm_configs = list(dict.fromkeys([*itertools.product(*SWEEP_VALUES), *SWEEP_REFERENCES]))
    norm_best, norm_rows = _sweep_module(norm, SWEEP_CONSTANTS, norm_configs, norm_cases, log)
    act_best, act_rows = _sweep_module(act, ACT_SWEEP_CONSTANTS, list(itertools.product(*ACT_SWEEP_VALUES)),
                                       act_cases, log)
    table = {"norm": {"default": norm_default, "best": norm_best, "rows": norm_rows},
             "act": {"default": act_default, "best": act_best, "rows": act_rows}}
    (out_dir / "bench_training_ops_sweep.json").write_text(json.dumps(table, indent=2) + "\n")

    def md(rows, keys):
        lines = ["| " + " | ".join(keys) + " | config | µs | TB/s |", "|" + "---|" * (len(keys) + 3)]
        lines += ["| " + " | ".join(str(r[k]) for k in keys) + f" | {r['config']} | {r['us'] or float('nan'):.1f} | "
                  f"{r['TBps'] or float('nan'):.2f} |" for r in rows]
        return "\n".join(lines)

    (out_dir / "bench_training_ops_sweep.md").write_text(
        f"Norm backward launch sweep (bytes: x, dy[, dh] read, dx written); best overall: {norm_best}; the "
        f"default is {norm_default}.\n\n" + md(norm_rows, ("M", "fused")) + "\n\n"
        f"SiLU·mul backward launch sweep (bytes: x, dy read, dx written); best overall: {act_best}; the default "
        f"is {act_default}.\n\n" + md(act_rows, ("M",)) + "\n")
    log(f"sweep: norm best {norm_best} (default {norm_default}); act best {act_best} (default {act_default})")
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--quick", action="store_true", help="only the two largest sizes of each op")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out (saves its compile time)")
    parser.add_argument("--fp32-weights", action="store_true", help="FP32 norm weights (masters) instead of bf16")
    parser.add_argument("--sweep", action="store_true", help="first sweep the norm backward's launch constants")
    args = parser.parse_args(argv)
    try:
        if args.sweep:
            args.out.mkdir(parents=True, exist_ok=True)
            sweep(args.out)
        run(args.out, quick=args.quick, compile_on=not args.no_compile,
            weight_dtype=torch.float32 if args.fp32_weights else torch.bfloat16)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
