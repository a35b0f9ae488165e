"""Experiment (2026-11-30, H200): stream-K against one program per tile for the seed shape's two GEMMs (plain
products, bf16 out), each kernel alone, side by side in CUDA graphs. Run from the repository root with an OUT folder;
TRITON_INTERPRET=1: a small correctness check on CPU."""
import importlib
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

g = importlib.import_module("sk.ops.fused_pre_norm_geglu")

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cpu" if INTERP else "cuda"
NUM_SMS = 4 if INTERP else torch.cuda.get_device_properties(0).multi_processor_count


@triton.jit
def gemm(a_desc, b_desc, c_desc, partial_ptr, arrivals_ptr, M, N,
         K_BLOCKS: tl.constexpr, STREAM_K: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    if STREAM_K:
        programs = tl.num_programs(0)
        p = tl.program_id(0)
        total = num_m * num_n * K_BLOCKS
        per = tl.cdiv(total, programs)
        start = p * per
        end = min(start + per, total)
        u = start
        while u < end:
            tile = u // K_BLOCKS
            k0 = u - tile * K_BLOCKS
            k1 = min(K_BLOCKS, k0 + end - u)
            pid_m, pid_n = g._tile_coords(tile, num_m, num_n, GROUP_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in tl.range(k0, k1):
                a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
                b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
                acc = tl.dot(a, b.T, acc)
            if k0 == 0 and k1 == K_BLOCKS:
                c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
            else:
                tile_elems = BLOCK_M * BLOCK_N
                offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                slot = tl.where(u == start, 0, 1)
                tl.store(partial_ptr + (p * 2 + slot).to(tl.int64) * tile_elems + offs, acc)
                tl.debug_barrier()
                first_q = (tile * K_BLOCKS) // per
                last_q = ((tile + 1) * K_BLOCKS - 1) // per
                arrived = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel")
                if arrived == last_q - first_q:
                    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                    for q in range(first_q, last_q + 1):
                        q_slot = tl.where((q * per) // K_BLOCKS == tile, 0, 1)
                        acc += tl.load(partial_ptr + (q * 2 + q_slot).to(tl.int64) * tile_elems + offs,
                                       cache_modifier=".cg")
                    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
            u += k1 - k0
    else:
        pid_m, pid_n = g._tile_coords(tl.program_id(0), num_m, num_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(K_BLOCKS):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


def make(a, b, bm, bn, bk, warps, stages, programs):
    """programs: 0 = one per tile; else a stream-K grid of that many."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    partial = torch.empty(max(programs, 1) * 2 * bm * bn, device=a.device, dtype=torch.float32)
    arrivals = torch.zeros(tiles, device=a.device, dtype=torch.int32)
    ad = TensorDescriptor.from_tensor(a, [bm, bk])
    bd = TensorDescriptor.from_tensor(b, [bn, bk])
    cd = TensorDescriptor.from_tensor(c, [bm, bn])

    def run():
        if programs:
            arrivals.zero_()
        gemm[(programs or tiles,)](ad, bd, cd, partial, arrivals, m, n, K_BLOCKS=triton.cdiv(k, bk),
                                   STREAM_K=bool(programs), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                                   num_warps=warps, num_stages=stages)
        return c
    return run


def main(out_dir):
    if not INTERP:
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    dtype = torch.float16 if INTERP else torch.bfloat16
    shapes = {"down": (1024, 768, 1448), "gate_up": (1024, 2896, 768)} if not INTERP else {"t": (200, 96, 176)}
    configs = {
        "down": [(64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 64, 64, 4, 3), (64, 64, 64, 4, 3)],
        "gate_up": [(128, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3)],
        "t": [(32, 32, 32, 4, 2), (64, 32, 32, 4, 2)],
    }
    result = {}
    for name, (m, n, k) in shapes.items():
        torch.manual_seed(0)
        a = torch.randn(m, k, device=DEV, dtype=dtype)
        b = torch.randn(n, k, device=DEV, dtype=dtype) / k ** 0.5
        ref = (a.double() @ b.double().T)
        fns = {"torch.mm": lambda a=a, b=b: a @ b.T}
        for bm, bn, bk, w, s in configs[name]:
            grids = [0, NUM_SMS, 50] if INTERP else [0, NUM_SMS, 2 * NUM_SMS]
            for programs in grids:
                fn = make(a, b, bm, bn, bk, w, s, programs)
                got = fn().double()
                err = ((got - ref).norm() / ref.norm()).item()
                label = f"{bm}x{bn}x{bk} w{w} s{s} " + (f"streamk P={programs}" if programs else "tile/program")
                print(name, label, "rel err", err, flush=True)
                assert err < 1e-2, (label, err)
                fns[label] = fn
        if INTERP:
            continue
        from sk.bench.timing import side_by_side_us
        result[name] = side_by_side_us(fns, calls_per_replay=50, repeats=60)
        for label, us in sorted(result[name].items(), key=lambda kv: kv[1] or 1e9):
            print(f"{name:8s} {label:40s} {us:8.2f} us", flush=True)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        json.dump(result, open(os.path.join(out_dir, "streamk.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
