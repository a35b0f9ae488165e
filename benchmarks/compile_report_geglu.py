"""Compile the GEGLU GEMM kernels for sm90 on any machine (no GPU needed) and report what the compiler did:
shared memory, registers, spill stack, and whether the matrix products became wgmma.

    python benchmarks/compile_report_geglu.py [--sweep]

Uses the ptxas and cuobjdump that ship inside Triton's wheel. Without --sweep it reports the configs the op
chooses for the benchmark shapes (the gate/up kernel in both variants: folded for inference, normalizing in
its prologue for training); with --sweep, every candidate of bench_geglu.py's sweep (a spilling candidate is
not worth device time).
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(__file__))
from bench_geglu import SHAPES, SWEEP, candidate_config  # noqa: E402

gk = importlib.import_module("sk.ops.gated_mlp.geglu_kernels")
common = importlib.import_module("sk.ops.gated_mlp.common")
SM90 = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def _desc(rows, cols):
    return f"tensordesc<bf16[{rows}, {cols}]>"


def compile_kernel(kind: str, c: "gk.GemmConfig", d: int, ff: int, fold: bool = False):
    """The compiled sm90 kernel (`.asm` holds its TTGIR, PTX, cubin). `fold`: the gate/up kernel's inference
    variant (LayerNorm scale folded into the weights, a plain GEMM)."""
    if kind == "gate_up":
        fn = gk.gate_up_kernel
        weight_rows = 2 * c.block_n if fold else c.block_n  # folded: gate and up rows interleaved in one tile
        signature = {"x_desc": _desc(c.block_m, c.block_k), "stats_ptr": "*fp32", "ln_w_ptr": "*fp32",
                     "ln_b_ptr": "*fp32", "wg_desc": _desc(weight_rows, c.block_k),
                     "wu_desc": _desc(weight_rows, c.block_k), "bg_ptr": "*fp32", "bu_ptr": "*fp32",
                     "fold_ptr": "*fp32", "h_ptr": "*bf16",
                     "h_desc": _desc(c.block_m, c.block_n) if c.tma_store else "*bf16", "gu_ptr": "*bf16",
                     "n_rows": "i32", "d": "i32", "ff": "i32"}
        constexprs = dict(FF_ALIGN=common.align(ff), K_BLOCKS=common.cdiv(d, c.block_k), FOLD_LN=fold,
                          HAS_LN_BIAS=True, HAS_GATE_BIAS=True, HAS_UP_BIAS=True, STORE_PREACT=not fold,
                          APPROX_TANH=False, SWAP_AB=c.swap_ab and fold, PDL=c.dependent_launch != "none",
                          DOWN_AT_START=c.dependent_launch == "at_start", PERSISTENT=c.programs_per_sm > 0,
                          TMA_STORE=c.tma_store)
    else:
        fn = gk.down_kernel
        signature = {"h_desc": _desc(c.block_m, c.block_k), "wd_desc": _desc(c.block_n, c.block_k),
                     "bd_ptr": "*fp32", "x_desc": _desc(c.block_m, c.block_n), "y_desc": _desc(c.block_m, c.block_n),
                     "partial_ptr": "*fp32", "arrivals_ptr": "*i32", "n_rows": "i32", "d": "i32"}
        constexprs = dict(K_BLOCKS_PER_SPLIT=common.cdiv(common.cdiv(ff, c.block_k), c.split_k), HAS_BIAS=True,
                          SPLIT_K=c.split_k, SWAP_AB=c.swap_ab,
                          PDL=True)  # as after a dependent-launch gate/up (decode's, and training's but at prefill)
    constexprs.update(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m)
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=SM90,
                          options={"num_warps": c.num_warps, "num_stages": c.num_stages})


def resource_usage(kernel) -> str:
    """Registers and spill stack of a compiled kernel, as cuobjdump reads them from its cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return " ".join(re.findall(r"(REG:\d+|STACK:\d+)", usage))


def compile_report(kind: str, c: "gk.GemmConfig", d: int, ff: int, fold: bool = False) -> str:
    kernel = compile_kernel(kind, c, d, ff, fold)
    ptx = kernel.asm["ptx"]
    return (f"shared={kernel.metadata.shared} {resource_usage(kernel)} wgmma={'wgmma' in ptx} "
            f"griddepcontrol.wait={'griddepcontrol.wait' in ptx} warps={kernel.metadata.num_warps}")


def ln_backward_report(m: int, d: int) -> str:
    """The LayerNorm backward kernel (training) as the op launches it for m rows of d_model d."""
    signature = {"dxn_ptr": "*bf16", "x_ptr": "*bf16", "dy_ptr": "*bf16", "stats_ptr": "*fp32", "ln_w_ptr": "*fp32",
                 "dx_ptr": "*bf16", "partial_ptr": "*fp32", "n_rows": "i32", "d": "i32"}
    _, meta = gk.ln_backward_launch(m, d)
    num_warps = meta.pop("num_warps")
    kernel = triton.compile(ASTSource(fn=gk.ln_backward_kernel, signature=signature, constexprs=meta),
                            target=SM90, options={"num_warps": num_warps})
    return f"warps={num_warps} shared={kernel.metadata.shared} {resource_usage(kernel)}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="report every sweep candidate too")
    args = parser.parse_args(argv)
    for name, (m, d, ff) in SHAPES.items():
        print(f"[{name}] ln_backward: {ln_backward_report(m, d)}", flush=True)
    print(f"[d_model 8192, the covered maximum] ln_backward: {ln_backward_report(1024, 8192)}", flush=True)
    for name, (m, d, ff) in SHAPES.items():
        # (kind, variant, whether the gate/up kernel is the folded inference one, configs to compile)
        gate_up, down = gk.choose_configs(m, d, ff)
        runs = [("gate_up", " inference (folded)", True, [gate_up]),
                ("gate_up", " training", False, [gk.choose_configs(m, d, ff, "training")[0]]),
                ("down", "", False, [down])]
        for kind, variant, fold, candidates in runs:
            if args.sweep and variant != " training":  # the sweep times inference
                candidates += [candidate_config(c).fitted(
                    m, ff if kind == "gate_up" else d, d if kind == "gate_up" else ff) for c in SWEEP[name][kind]]
            for c in candidates:
                try:
                    report = compile_report(kind, c, d, ff, fold)
                except RuntimeError as e:  # a candidate the compiler rejects is not worth device time either
                    report = f"does not compile ({str(e).splitlines()[-1][:100]})"
                markers = (" swap" * c.swap_ab + (f" p{c.programs_per_sm}" if c.programs_per_sm else "")
                           + " tma" * c.tma_store + (f" g{c.group_m}" if c.group_m != 8 else ""))
                print(f"[{name}] {kind}{variant} {c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} "
                      f"s{c.num_stages} split{c.split_k}{markers}: {report}", flush=True)


if __name__ == "__main__":
    main()
