"""Experiment (2026-11-30, H200): where the seed gate/up kernel's time goes beyond the plain GEMM: the epilogue
variants of one kernel and the production kernel, each alone, side by side in CUDA graphs. Run from the repository
root: python3 results/h200/geglu/2026-11-30/seventh-run/experiments/epilogue_exp.py OUT (TRITON_INTERPRET=1: a
small check on CPU). "production" is the production kernel at the table's seed entry of that morning (128 × 64
tiles, 2 programs per SM, h stored by TMA)."""
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


@triton.jit
def kern(x_desc, w_desc, wu_desc, stats_ptr, fold_ptr, c_desc, h_desc, n_rows, ff,
         K_BLOCKS: tl.constexpr, EPI: tl.constexpr, TWO_DOTS: tl.constexpr, BLOCKED: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    num_m = tl.cdiv(n_rows, BLOCK_M)
    num_n = tl.cdiv(ff, BLOCK_N)
    pid_m, pid_n = g._tile_coords(tl.program_id(0), num_m, num_n, GROUP_M)
    if TWO_DOTS:
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(K_BLOCKS):
            a = x_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            bg = w_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
            bu = wu_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
            acc_g = tl.dot(a, bg.T, acc_g)
            acc_u = tl.dot(a, bu.T, acc_u)
    else:
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        for k in tl.range(K_BLOCKS):
            a = x_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            b = w_desc.load([pid_n * 2 * BLOCK_N, k * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        if EPI == 0:
            c_desc.store([pid_m * BLOCK_M, pid_n * 2 * BLOCK_N], acc.to(c_desc.dtype))
            return
        if EPI >= 2:
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = offs_m < n_rows
            mean = tl.load(stats_ptr + offs_m, mask=row_ok, other=0.0)[:, None]
            rstd = tl.load(stats_ptr + n_rows + offs_m, mask=row_ok, other=0.0)[:, None]
            cols2 = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)
            cols2_ok = cols2 < 2 * ff
            acc = rstd * (acc - mean * tl.load(fold_ptr + cols2, mask=cols2_ok, other=0.0)[None, :])
            acc += tl.load(fold_ptr + 2 * ff + cols2, mask=cols2_ok, other=0.0)[None, :]
        if BLOCKED:
            acc_g, acc_u = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))
        else:
            acc_g, acc_u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
    if EPI == 4:
        out = acc_g * acc_u
    else:
        act, _ = g._gelu_and_grad(acc_g, EPI == 3)
        out = act * acc_u
    h_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], out.to(h_desc.dtype))


def main(out_dir):
    if not INTERP:
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    dtype = torch.float16 if INTERP else torch.bfloat16
    m, d, ff = (200, 96, 176) if INTERP else (1024, 768, 1448)
    torch.manual_seed(0)
    x = torch.randn(m, d, device=DEV, dtype=dtype)
    wg = (torch.randn(ff, d, device=DEV) / d ** 0.5).to(dtype)
    wu = (torch.randn(ff, d, device=DEV) / d ** 0.5).to(dtype)
    inter = torch.stack([wg, wu], 1).reshape(2 * ff, d).contiguous()
    stats = torch.stack([x.float().mean(1), torch.rsqrt(x.float().var(1, unbiased=False) + 1e-5)]).contiguous()
    fold = torch.zeros(2, 2 * ff, device=DEV)
    ref_h = (torch.nn.functional.gelu(x.double() @ wg.double().T) * (x.double() @ wu.double().T))
    results = {}
    fns = {}
    for bm, bn, w, s in ((128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3)):
        bk = 64 if not INTERP else 32
        bnn = bn if not INTERP else 32
        # blocked layout: per tile, BN gate rows then BN up rows (ff padded to a multiple of BN)
        ffp = triton.cdiv(ff, bnn) * bnn
        gp = torch.zeros(ffp, d, device=DEV, dtype=dtype)
        up = torch.zeros(ffp, d, device=DEV, dtype=dtype)
        gp[:ff], up[:ff] = wg, wu
        blocked = torch.stack([gp.reshape(-1, bnn, d), up.reshape(-1, bnn, d)], 1).reshape(2 * ffp, d).contiguous()
        T = g.TensorDescriptor.from_tensor
        c = torch.empty(m, 2 * ff, device=DEV, dtype=dtype)
        for label, epi, two, blk in (("plain", 0, False, False), ("split+gelu", 1, False, False),
                                     ("split+fold+gelu", 2, False, False), ("split+fold+tanh", 3, False, False),
                                     ("split+mul", 4, False, False), ("blocked split+gelu", 1, False, True),
                                     ("two dots+gelu", 1, True, False)):
            h = torch.full((m, ff), float("nan"), device=DEV, dtype=dtype)
            wdesc = T(blocked if blk else wg if two else inter, [bnn if two else 2 * bnn, bk])
            args = (T(x, [bm, bk]), wdesc, T(wu, [bnn, bk]), stats, fold, T(c, [bm, 2 * bnn]), T(h, [bm, bnn]),
                    m, ff)
            grid = (triton.cdiv(m, bm) * triton.cdiv(ff, bnn),)
            fn = (lambda args=args, epi=epi, two=two, blk=blk, bm=bm, bnn=bnn, bk=bk, w=w, s=s, grid=grid:
                  kern[grid](*args, K_BLOCKS=triton.cdiv(d, bk), EPI=epi, TWO_DOTS=two, BLOCKED=blk, BLOCK_M=bm,
                             BLOCK_N=bnn, BLOCK_K=bk, GROUP_M=8, num_warps=w, num_stages=s))
            fn()
            if epi in (1,):
                err = ((h.double() - ref_h).norm() / ref_h.norm()).item()
                print(bm, bn, w, s, label, "rel err", err, flush=True)
                assert err < 1e-2
            fns[f"{bm}x{bn} w{w} s{s} {label}"] = fn
        if INTERP:
            break
    if INTERP:
        return
    c = g.GemmConfig(128, 64, 64, 4, 3, programs_per_sm=2, tma_store=True)  # the seed entry then
    folded, fold_p = g._fold(torch.ones(d, device=DEV), None, wg.float(), None, wu.float(), None, dtype)
    hp = torch.empty(m, ff, device=DEV, dtype=dtype)
    tma = g._descriptor
    wdp = tma(folded, [2 * c.block_n, c.block_k])
    programs = min(triton.cdiv(m, c.block_m) * triton.cdiv(ff, c.block_n), 2 * g._sm_count(x.device))
    fns["production"] = lambda: g._gate_up_kernel[(programs,)](
        tma(x, [c.block_m, c.block_k]), stats, None, None, wdp, wdp, None, None, fold_p, hp,
        tma(hp, [c.block_m, c.block_n]), hp, m, d, ff, FF_ALIGN=g._align(ff), K_BLOCKS=g._cdiv(d, c.block_k),
        FOLD_LN=True, HAS_LN_BIAS=False, HAS_GATE_BIAS=False, HAS_UP_BIAS=False, STORE_PREACT=False,
        APPROX_TANH=False, SWAP_AB=False, PDL=False, DOWN_AT_START=False, PERSISTENT=True, TMA_STORE=True,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m, num_warps=c.num_warps,
        num_stages=c.num_stages)
    fns["production"]()
    torch.cuda.synchronize()
    print("production rel err", ((hp.double() - ref_h).norm() / ref_h.norm()).item(), flush=True)
    results = side_by_side_us(fns, calls_per_replay=50, repeats=60, on_error=lambda n, e: print("ERR", n, e))
    for label, us in sorted(results.items(), key=lambda kv: kv[1] or 1e9):
        print(f"{label:40s} {us:8.2f} us", flush=True)
    os.makedirs(out_dir, exist_ok=True)
    json.dump(results, open(os.path.join(out_dir, "epilogue.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
