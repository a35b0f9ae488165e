"""Compile the gated-MLP kernels for sm90 on any machine (no GPU: Triton's own ptxas) at the table's configs and
report, per kernel (and the down kernel as `sk.ops.linear` launches it, `compile_kernel(linear=True)`), the
shared-memory buffers of each GEMM operand tile (gate/up's three, down's two: each must be num_stages deep: a
shallower one is the pipeliner race the GEGLU op met, see geglu_kernels' docstring), shared memory, and
whether the products became wgmma. Run without TRITON_INTERPRET.

    python benchmarks/compile_report_gated_mlp.py [--json]
"""
from __future__ import annotations

import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sk.ops.gated_mlp import triton_kernels as tk
from sk.ops.gated_mlp.common import align, cdiv

SM90 = GPUTarget("cuda", 90, 32)
SHAPES = [(1, 4096, 14336), (32, 2048, 8192), (128, 4096, 14336), (1024, 3584, 14336), (8192, 4096, 14336)]


def _desc(rows, cols):
    return f"tensordesc<bf16[{rows}, {cols}]>"


def compile_kernel(kind, c, d, ff, *, linear=False):
    """kind "gate_up" or "down" (d outputs, ff deep); `linear`: the down kernel as sk.ops.linear launches it (no
    PDL, the split-K counters re-zeroed by the kernel)."""
    if kind == "gate_up":
        half = c.block_n // 2
        signature = {"n_desc": _desc(c.block_m, c.block_k), "gate_desc": _desc(half, c.block_k),
                     "up_desc": _desc(half, c.block_k), "bias_ptr": "*bf16", "a_ptr": "*bf16", "arrivals_ptr": "*i32",
                     "n_rows": "i32", "ff": "i32", "n_arrivals": "i32"}
        constexprs = dict(FF_ALIGN=align(ff), K_BLOCKS=cdiv(d, c.block_k), HAS_BIAS=True, ACT="silu",
                          SWAP_AB=c.swap_ab, PDL=c.dependent_launch != "none",
                          DOWN_AT_START=c.dependent_launch == "at_start", ARRIVALS_BLOCK=16,
                          BLOCK_M=c.block_m, HALF=half, BLOCK_K=c.block_k, GROUP_M=c.group_m)
        fn = tk.gate_up_kernel
    else:
        signature = {"a_desc": _desc(c.block_m, c.block_k), "wd_desc": _desc(c.block_n, c.block_k), "bd_ptr": "*bf16",
                     "y_desc": _desc(c.block_m, c.block_n), "partial_ptr": "*fp32", "arrivals_ptr": "*i32",
                     "n_rows": "i32", "d": "i32"}
        constexprs = dict(K_BLOCKS_PER_SPLIT=cdiv(cdiv(ff, c.block_k), c.split_k), HAS_BIAS=True,
                          SPLIT_K=c.split_k, SWAP_AB=c.swap_ab, PDL=not linear, RESET_ARRIVALS=linear,
                          BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m)
        fn = tk.down_kernel
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=SM90,
                          options={"num_warps": c.num_warps, "num_stages": c.num_stages})


def tuned_shapes():
    """One problem per `TUNED` entry, at its shape class's most rows."""
    bounds = {name: bound for bound, name in tk.M_CLASSES}
    return [(bounds[cls], d, ff) for cls, d, ff in tk.TUNED]


def report(shapes=None):
    found = {}
    for m, d, ff in shapes or SHAPES + tuned_shapes():
        for kind, c in zip(("gate_up", "down"), tk.choose_configs(m, d, ff, 132)):
            k = compile_kernel(kind, c, d, ff)
            ttgir = k.asm["ttgir"]
            buffers = [int(n) for n in re.findall(r"ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x\d+x\d+x", ttgir)]
            found[f"{kind} {m}x{d}x{ff}"] = {"stages": c.num_stages, "buffers": buffers, "shared": k.metadata.shared,
                                             "wgmma": "wgmma" in k.asm["ptx"]}
    return found


if __name__ == "__main__":
    result = report()
    if "--json" in sys.argv:
        print(json.dumps(result))
    else:
        for name, r in result.items():
            print(name, r)
