"""SiLU·mul at 16384 × 2·14336 bf16, its forward and backward kernels timed apart against Liger-Kernel's (GPU).

    PYTHONPATH=/tmp/sk-peers python3 benchmarks/silu_components.py OUT.json

An experiment, not the op benchmark (that is bench_training_ops.py): the backward is a standalone copy of
sk.ops.act_and_mul's backward kernel with switches (block, in place, cache hints), so that each can be timed
without changing the op. Results: results/h200/ops/README.md (2026-12-03, third pass).
Kept as it ran: its own plain timing loop (graphs taken in a fixed order), not sk.bench.timing.side_by_side_us."""
import json, sys, statistics
import torch, triton, triton.language as tl
import sk

M, N = 16384, 14336
dev = "cuda"


@triton.jit
def bwd_kernel(dy_ptr, x_ptr, dx_ptr, d, BLOCK: tl.constexpr, HINT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    if HINT:
        g = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        u = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_ptr + row * d + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    else:
        g = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * d + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    a = g * s
    da = s * (1.0 + g * (1.0 - s))
    if HINT:
        tl.store(dx_ptr + row * 2 * d + cols, (dy * u * da).to(tl.bfloat16), mask=mask, cache_modifier=".cs")
        tl.store(dx_ptr + row * 2 * d + d + cols, (dy * a).to(tl.bfloat16), mask=mask, cache_modifier=".cs")
    else:
        tl.store(dx_ptr + row * 2 * d + cols, (dy * u * da).to(tl.bfloat16), mask=mask)
        tl.store(dx_ptr + row * 2 * d + d + cols, (dy * a).to(tl.bfloat16), mask=mask)


def bwd(dy, x, dx, block, warps, hint):
    bwd_kernel[(M, triton.cdiv(N, block))](dy, x, dx, N, BLOCK=block, HINT=hint, num_warps=warps)


def graphed(fn, calls=20):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


def main(out):
    torch.manual_seed(0)
    x = torch.randn(M, 2 * N, device=dev, dtype=torch.bfloat16)
    xi = x.clone()
    dy = torch.randn(M, N, device=dev, dtype=torch.bfloat16) * 0.01
    dx = torch.empty_like(x)
    a, b = x[:, :N].contiguous(), x[:, N:].contiguous()
    la, lb = a.clone(), b.clone()
    y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    variants = {
        "ours fwd (sk.ops.silu_and_mul, out=)": lambda: sk.ops.silu_and_mul(x, out=y),
        "ours bwd 8192/16 (as committed)": lambda: bwd(dy, x, dx, 8192, 16, False),
        "ours bwd 2048/8": lambda: bwd(dy, x, dx, 2048, 8, False),
        "ours bwd 16384/16 (one program a row)": lambda: bwd(dy, x, dx, 16384, 16, False),
        "ours bwd 8192/16 evict_first + .cs": lambda: bwd(dy, x, dx, 8192, 16, True),
        "ours bwd 8192/16 in place (dx = x)": lambda: bwd(dy, xi, xi, 8192, 16, False),
        "ours bwd 16384/16 in place": lambda: bwd(dy, xi, xi, 16384, 16, False),
    }
    try:
        from liger_kernel.ops import swiglu as L
        variants |= {
            "liger fwd (a, b)": lambda: L.swiglu_forward(a, b),
            "liger bwd (a, b) in place": lambda: L.swiglu_backward(la, lb, dy),
            "liger fused gate_up fwd": lambda: L.swiglu_fused_gate_up_forward(x),
            "liger fused gate_up bwd, new output": lambda: L.swiglu_fused_gate_up_backward(x, dy, in_place=False),
            "liger fused gate_up bwd, in place": lambda: L.swiglu_fused_gate_up_backward(xi, dy, in_place=True),
        }
    except Exception as e:
        print("liger:", type(e).__name__, e)
    copy_src = torch.empty(M * N * 3 // 2, device=dev, dtype=torch.bfloat16)
    copy_dst = torch.empty_like(copy_src)
    variants["copy (6·M·N bytes moved)"] = lambda: copy_dst.copy_(copy_src)
    graphs = {k: graphed(f) for k, f in variants.items()}
    times = {k: [] for k in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(50):
        for k, g in graphs.items():
            start.record(); g.replay(); end.record(); end.synchronize()
            times[k].append(start.elapsed_time(end) * 1000 / 20)
    res = {k: statistics.median(v) for k, v in times.items()}
    bwd_bytes = 5 * M * N * 2
    fwd_bytes = 3 * M * N * 2
    for k, v in res.items():
        nbytes = fwd_bytes if "fwd" in k else (bwd_bytes if "bwd" in k else 3 * M * N * 2)
        print(f"{k:55s} {v:8.1f} µs  {nbytes / v / 1e6:5.2f} TB/s")
    json.dump({"M": M, "N": N, "median_us": res, "gpu": torch.cuda.get_device_name(),
               "torch": torch.__version__, "triton": triton.__version__}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
