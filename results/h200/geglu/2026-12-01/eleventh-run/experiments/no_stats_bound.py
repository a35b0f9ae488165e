"""Experiment (2026-12-01, H200): how fast the seed forward could be if the gate/up GEMM computed the LayerNorm
statistics itself (from the x tiles its main loop already has in shared memory), i.e. with no statistics kernel.
Bound: the statistics kernel not launched at all (the statistics are left unwritten, so the output is wrong;
timing only), gate/up first, in stream order or launched dependently on the kernel before it (in a graph of
20 calls, the previous call's down GEMM) and waiting before its first load. Beside the op (statistics kernel,
gate/up waiting in its epilogue) and the previous state (gate/up waiting before its first load). The whole
forward in CUDA graphs of 20 calls, replays interleaved, three rounds. Run from the repository root with QuACK
on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/eleventh-run/experiments/no_stats_bound.py OUT"""
import functools
import importlib
import json
import os
import sys

import torch
from quack.activation import gelu_erf
from quack.epilogue.frontend import EpiMod, unpack
from quack.epilogue.ops import ColVecLoad, RowVecLoad

sys.path.insert(0, "benchmarks")
import bench_geglu as b  # noqa: E402
from sk.bench.timing import environment, side_by_side_us  # noqa: E402

geglu = importlib.import_module("sk.ops.fused_pre_norm_geglu")
cute = importlib.import_module("sk.ops.fused_pre_norm_geglu_cute")
OP_GATE_UP, OP_STATS = cute.gate_up, geglu._ln_stats_kernel


@functools.cache
def _stream_order(gemm_cls):
    class GemmInStreamOrder(gemm_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.use_pdl = False
    GemmInStreamOrder.__qualname__ = GemmInStreamOrder.__name__ = f"{gemm_cls.__name__}_InStreamOrder"
    return GemmInStreamOrder


class EpiModInStreamOrder(EpiMod):
    def _mint(self, *key):
        return _stream_order(super()._mint(*key))


def folded_ln_geglu(acc, mean, rstd, colsum, shift):
    gate, up = unpack((acc - colsum * mean) * rstd + shift)
    return {"h": gelu_erf(gate) * up}


def ops():
    return {"mean": ColVecLoad("mean"), "rstd": ColVecLoad("rstd"), "colsum": RowVecLoad("colsum"),
            "shift": RowVecLoad("shift")}


WAITING_BEFORE_LOADS = EpiMod(folded_ln_geglu, outputs=("h",), mode="acc_pair", ops=ops())
IN_STREAM_ORDER = EpiModInStreamOrder(folded_ln_geglu, outputs=("h",), mode="acc_pair", ops=ops())


def gate_up_with(epilogue):
    def gate_up(x, stats, folded, fold, h, approximate, shape_class):
        epilogue(x, folded.T, out={"h": h}, store_d=False, config=cute.GATE_UP_CONFIGS[shape_class], tuned=False,
                 mean=stats[0:1], rstd=stats[1:2], colsum=fold[0:1], shift=fold[1:2])
    return gate_up


class NotLaunched:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def forward(x, args, gate_up, stats_kernel):
    def fn():
        cute.gate_up, geglu._ln_stats_kernel = gate_up, stats_kernel
        try:
            return geglu.fused_pre_norm_geglu(x, *args)
        finally:
            cute.gate_up, geglu._ln_stats_kernel = OP_GATE_UP, OP_STATS
    return fn


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    m, d, ff = b.SHAPES["seed"]
    _, x, args = b.inference_problem(m, d, ff)
    ref = geglu.fused_pre_norm_geglu_reference(x.double(), *[a.double() if torch.is_tensor(a) else a for a in args])
    fns = {"op": forward(x, args, OP_GATE_UP, OP_STATS),
           "op (twin)": forward(x, args, OP_GATE_UP, OP_STATS),
           "statistics kernel, gate/up waiting before its first load": forward(
               x, args, gate_up_with(WAITING_BEFORE_LOADS), OP_STATS),
           "no statistics kernel, gate/up dependent, waiting before its first load": forward(
               x, args, gate_up_with(WAITING_BEFORE_LOADS), NotLaunched()),
           "no statistics kernel, gate/up in stream order": forward(
               x, args, gate_up_with(IN_STREAM_ORDER), NotLaunched())}
    results = {"environment": environment(), "rounds": []}
    with torch.no_grad():
        results["rel_err"] = {n: b.rel_err(f(), ref) for n, f in fns.items()}
        print(results["rel_err"], flush=True)
        for r in range(3):
            times = side_by_side_us(fns, calls_per_replay=20, repeats=50, on_error=lambda n, e: print("ERR", n, e))
            results["rounds"].append(times)
            for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                print(f"seed round {r} {name:72s} {us:8.2f} us", flush=True)
    json.dump(results, open(os.path.join(out_dir, "no_stats_bound.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
