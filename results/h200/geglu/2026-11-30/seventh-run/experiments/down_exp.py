"""Experiment (2026-11-30, H200): seed-shape down projection tiles (incl. 64 x (64+32) tiles: 128 tiles for 132
SMs), and the production gate/up kernel at other configs than its table's (one program per 64 x 64 tile with the
TMA store among them); each kernel alone, side by side in CUDA graphs. Run from the repository root with an OUT
folder; TRITON_INTERPRET=1: a small correctness check on CPU."""
import importlib
import json
import os
import sys

import torch
import triton
import triton.language as tl

from sk.bench.timing import side_by_side_us

g = importlib.import_module("sk.ops.fused_pre_norm_geglu")
INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cpu" if INTERP else "cuda"
T = g.TensorDescriptor.from_tensor


@triton.jit
def down(h_desc, w1_desc, w2_desc, x1_desc, x2_desc, y1_desc, y2_desc, n_rows, d,
         K_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_N2: tl.constexpr,
         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    BN: tl.constexpr = BLOCK_N1 + BLOCK_N2
    pid_m, pid_n = g._tile_coords(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.cdiv(d, BN), GROUP_M)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N1), dtype=tl.float32)
    if BLOCK_N2 > 0:
        acc2 = tl.zeros((BLOCK_M, BLOCK_N2), dtype=tl.float32)
    for k in tl.range(K_BLOCKS, loop_unroll_factor=1):
        a = h_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        b1 = w1_desc.load([pid_n * BN, k * BLOCK_K])
        acc1 = tl.dot(a, b1.T, acc1)
        if BLOCK_N2 > 0:
            b2 = w2_desc.load([pid_n * BN + BLOCK_N1, k * BLOCK_K])
            acc2 = tl.dot(a, b2.T, acc2)
    acc1 += x1_desc.load([pid_m * BLOCK_M, pid_n * BN]).to(tl.float32)
    y1_desc.store([pid_m * BLOCK_M, pid_n * BN], acc1.to(y1_desc.dtype))
    if BLOCK_N2 > 0:
        acc2 += x2_desc.load([pid_m * BLOCK_M, pid_n * BN + BLOCK_N1]).to(tl.float32)
        y2_desc.store([pid_m * BLOCK_M, pid_n * BN + BLOCK_N1], acc2.to(y2_desc.dtype))


def down_fn(h, wd, x, y, bm, bn1, bn2, bk, w, s):
    m, ff = h.shape
    d = wd.shape[0]
    args = (T(h, [bm, bk]), T(wd, [bn1, bk]), T(wd, [max(bn2, 8), bk]), T(x, [bm, bn1]), T(x, [bm, max(bn2, 8)]),
            T(y, [bm, bn1]), T(y, [bm, max(bn2, 8)]), m, d)
    grid = (triton.cdiv(m, bm) * triton.cdiv(d, bn1 + bn2),)
    return lambda: down[grid](*args, K_BLOCKS=triton.cdiv(ff, bk), BLOCK_M=bm, BLOCK_N1=bn1, BLOCK_N2=bn2,
                              BLOCK_K=bk, GROUP_M=8, num_warps=w, num_stages=s)


def gate_up_fn(x, stats, folded, fold, h, c):
    m, d = x.shape
    ff = h.shape[1]
    tma = g._descriptor
    w = tma(folded, [2 * c.block_n, c.block_k])
    programs = triton.cdiv(m, c.block_m) * triton.cdiv(ff, c.block_n)
    if c.programs_per_sm:
        programs = min(programs, c.programs_per_sm * g._sm_count(x.device))
    args = (tma(x, [c.block_m, c.block_k]), stats, None, None, w, w, None, None, fold, h,
            tma(h, [c.block_m, c.block_n]) if c.tma_store else h, h, m, d, ff)
    return lambda: g._gate_up_kernel[(programs,)](
        *args, FF_ALIGN=g._align(ff), K_BLOCKS=g._cdiv(d, c.block_k), FOLD_LN=True, HAS_LN_BIAS=False,
        HAS_GATE_BIAS=False, HAS_UP_BIAS=False, STORE_PREACT=False, APPROX_TANH=False, SWAP_AB=False, PDL=False,
        DOWN_AT_START=False, PERSISTENT=c.programs_per_sm > 0, TMA_STORE=c.tma_store, BLOCK_M=c.block_m,
        BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m, num_warps=c.num_warps, num_stages=c.num_stages)


def main(out_dir):
    if not INTERP:
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    dtype = torch.float16 if INTERP else torch.bfloat16
    m, d, ff = (200, 96, 176) if INTERP else (1024, 768, 1448)
    torch.manual_seed(0)
    x = torch.randn(m, d, device=DEV, dtype=dtype)
    h = torch.randn(m, ff, device=DEV, dtype=dtype)
    wd = (torch.randn(d, ff, device=DEV) / ff ** 0.5).to(dtype)
    ref = x.double() + h.double() @ wd.double().T
    fns = {}
    down_cfgs = ([(32, 32, 16, 32, 4, 2), (32, 32, 0, 32, 4, 2)] if INTERP else
                 [(64, 128, 0, 64, 4, 3), (64, 128, 0, 128, 4, 3), (64, 128, 0, 128, 4, 2), (64, 128, 0, 64, 4, 4),
                  (64, 64, 32, 64, 4, 3), (64, 64, 32, 64, 4, 4), (64, 64, 32, 128, 4, 3), (64, 64, 32, 64, 8, 3),
                  (128, 64, 32, 64, 8, 3)])
    for bm, bn1, bn2, bk, w, s in down_cfgs:
        y = torch.full((m, d), float("nan"), device=DEV, dtype=dtype)
        fn = down_fn(h, wd, x, y, bm, bn1, bn2, bk, w, s)
        fn()
        err = ((y.double() - ref).norm() / ref.norm()).item()
        label = f"down {bm}x{bn1}+{bn2}x{bk} w{w} s{s}"
        print(label, "rel err", err, flush=True)
        assert err < 1e-2, label
        fns[label] = fn
    fns["down torch"] = lambda: torch.addmm(x, h, wd.T)
    # gate/up, production kernel, configs
    ln_w = torch.rand(d, device=DEV) + 0.5
    wg = torch.randn(ff, d, device=DEV) / d ** 0.5
    wu = torch.randn(ff, d, device=DEV) / d ** 0.5
    folded, fold = g._fold(ln_w, None, wg, None, wu, None, dtype)
    stats = torch.stack([x.float().mean(1), torch.rsqrt(x.float().var(1, unbiased=False) + 1e-5)]).contiguous()
    xn = torch.nn.functional.layer_norm(x.double(), (d,), ln_w.double(), None, 1e-5)
    ref_h = torch.nn.functional.gelu(xn @ wg.double().T) * (xn @ wu.double().T)
    C = g.GemmConfig
    gu_cfgs = ([C(32, 32, 32, 4, 2, tma_store=True), C(32, 32, 32, 4, 2)] if INTERP else
               [C(128, 64, 64, 4, 3, programs_per_sm=2, tma_store=True),  # the seed entry then
                C(64, 64, 64, 4, 3, tma_store=True), C(64, 64, 64, 4, 4, tma_store=True),
                C(64, 64, 128, 4, 2, tma_store=True), C(64, 64, 128, 4, 3, tma_store=True),
                C(64, 64, 64, 4, 3), C(64, 128, 64, 8, 3, tma_store=True), C(128, 64, 64, 4, 3, tma_store=True)])
    for c in gu_cfgs:
        c = c.fitted(m, ff, d)
        hh = torch.full((m, ff), float("nan"), device=DEV, dtype=dtype)
        fn = gate_up_fn(x, stats, folded, fold, hh, c)
        fn()
        err = ((hh.double() - ref_h).norm() / ref_h.norm()).item()
        label = (f"gate_up {c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages} "
                 f"pps{c.programs_per_sm} tma{int(c.tma_store)}")
        print(label, "rel err", err, flush=True)
        assert err < 1e-2, label
        fns[label] = fn
    if INTERP:
        return
    results = side_by_side_us(fns, calls_per_replay=50, repeats=60, on_error=lambda n, e: print("ERR", n, e))
    for label, us in sorted(results.items(), key=lambda kv: (kv[0].split()[0], kv[1] or 1e9)):
        print(f"{label:45s} {us:8.2f} us", flush=True)
    os.makedirs(out_dir, exist_ok=True)
    json.dump(results, open(os.path.join(out_dir, "down_gate_up.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
