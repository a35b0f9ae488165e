"""SiLU·mul's forward kernel over launch configs (block, warps, evict_first), merged [gate | up] rows and
separate gate and up, against Liger-Kernel's forward and sk.ops.silu_and_mul itself (GPU, bf16).

    PYTHONPATH=/tmp/sk-peers python3 benchmarks/silu_forward_launch.py OUT.json M D

An experiment: the kernel is a standalone copy of sk.ops.act_and_mul's forward with switches. The committed
launch (`launch_config`) came from it: results/h200/ops/README.md (2026-12-03, third pass).
Kept as it ran: its own plain timing loop (graphs taken in a fixed order), not sk.bench.timing.side_by_side_us."""
import json, sys, statistics
import torch, triton, triton.language as tl

from silu_components import graphed  # the script beside this one (run from the repository root)

M, N = int(sys.argv[2]), int(sys.argv[3])


@triton.jit
def fwd_kernel(x_ptr, y_ptr, d, BLOCK: tl.constexpr, HINT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    if HINT:
        g = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        u = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    else:
        g = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * d + cols, (g * tl.sigmoid(g) * u).to(tl.bfloat16), mask=mask)


@triton.jit
def fwd_sep_kernel(a_ptr, b_ptr, y_ptr, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    g = tl.load(a_ptr + row * d + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(b_ptr + row * d + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * d + cols, (g * tl.sigmoid(g) * u).to(tl.bfloat16), mask=mask)


x = torch.randn(M, 2 * N, device="cuda", dtype=torch.bfloat16)
a, b = x[:, :N].contiguous(), x[:, N:].contiguous()
y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
V = {}
for block, warps in [(2048, 8), (2048, 4), (4096, 8), (4096, 16), (8192, 16), (16384, 16), (16384, 32), (1024, 4)]:
    for hint in (False, True):
        V[f"merged {block}/{warps}{' evict_first' if hint else ''}"] = (
            lambda bl=block, w=warps, h=hint: fwd_kernel[(M, triton.cdiv(N, bl))](x, y, N, BLOCK=bl, HINT=h, num_warps=w))
for block, warps in [(2048, 8), (16384, 16)]:
    V[f"separate a, b {block}/{warps}"] = lambda bl=block, w=warps: fwd_sep_kernel[(M, triton.cdiv(N, bl))](a, b, y, N, BLOCK=bl, num_warps=w)
try:
    sys.path.insert(0, "/tmp/sk-peers")
    from liger_kernel.ops import swiglu as L
    V["liger fwd (a, b)"] = lambda: L.swiglu_forward(a, b)
except Exception as e:
    print("liger", e)
import sk
V["sk.ops.silu_and_mul(x, out=y)"] = lambda: sk.ops.silu_and_mul(x, out=y)
G = {k: graphed(f) for k, f in V.items()}
T = {k: [] for k in G}
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for _ in range(40):
    for k, g in G.items():
        s.record(); g.replay(); e.record(); e.synchronize(); T[k].append(s.elapsed_time(e) * 50)
R = {k: statistics.median(v) for k, v in T.items()}
for k, v in R.items():
    print(f"{M}x{N} {k:40s} {v:8.1f} us {3 * M * N * 2 / v / 1e6:5.2f} TB/s")
json.dump(R, open(sys.argv[1], "w"), indent=1)
