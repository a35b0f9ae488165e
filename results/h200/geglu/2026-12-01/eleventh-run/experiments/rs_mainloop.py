"""Experiment (2026-12-01, H200): what QuACK's register-sourced mainloop costs the seed forward. An A-operand
transform (`quack.operand_transform.a_transform`) makes the gate/up GEMM load x from shared memory into
registers itself (ldmatrix) and feed the wgmma from there; a transform that summed each row of x on its way
could give the LayerNorm statistics without their own kernel. Here the transform is the identity: the whole
forward with it against the op's, in CUDA graphs of 20 calls, replays interleaved, three rounds. Run from the
repository root with QuACK on the path (ci/gpu/cute.sh):
    python3 results/h200/geglu/2026-12-01/eleventh-run/experiments/rs_mainloop.py OUT"""
import importlib
import json
import os
import sys

import torch
from quack.operand_transform import a_transform

sys.path.insert(0, "benchmarks")
import bench_geglu as b  # noqa: E402
from sk.bench.timing import environment, side_by_side_us  # noqa: E402

geglu = importlib.import_module("sk.ops.fused_pre_norm_geglu")
cute = importlib.import_module("sk.ops.fused_pre_norm_geglu_cute")
OP_GATE_UP = cute.gate_up


@a_transform(vec_size=8)
def identity(x):
    return x


def gate_up_register_sourced(x, stats, folded, fold, h, approximate, shape_class):
    epilogue = cute.FOLDED_LN_GEGLU_TANH if approximate == "tanh" else cute.FOLDED_LN_GEGLU_ERF
    epilogue(x, folded.T, out={"h": h}, store_d=False, config=cute.GATE_UP_CONFIGS[shape_class], tuned=False,
             transform_a=identity, mean=stats[0:1], rstd=stats[1:2], colsum=fold[0:1], shift=fold[1:2])


def forward(x, args, gate_up):
    def fn():
        cute.gate_up = gate_up
        try:
            return geglu.fused_pre_norm_geglu(x, *args)
        finally:
            cute.gate_up = OP_GATE_UP
    return fn


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    m, d, ff = b.SHAPES["seed"]
    _, x, args = b.inference_problem(m, d, ff)
    ref = geglu.fused_pre_norm_geglu_reference(x.double(), *[a.double() if torch.is_tensor(a) else a for a in args])
    fns = {"op (shared-memory A)": forward(x, args, OP_GATE_UP),
           "op (shared-memory A, twin)": forward(x, args, OP_GATE_UP),
           "register-sourced A, identity transform": forward(x, args, gate_up_register_sourced)}
    results = {"environment": environment(), "rounds": []}
    with torch.no_grad():
        results["rel_err"] = {n: b.rel_err(f(), ref) for n, f in fns.items()}
        print(results["rel_err"], flush=True)
        for r in range(3):
            times = side_by_side_us(fns, calls_per_replay=20, repeats=50, on_error=lambda n, e: print("ERR", n, e))
            results["rounds"].append(times)
            for name, us in sorted(times.items(), key=lambda kv: kv[1] or 1e9):
                print(f"seed round {r} {name:42s} {us:8.2f} us", flush=True)
    json.dump(results, open(os.path.join(out_dir, "rs_mainloop.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
