"""Host time of one call of each of our ops on the GPU, as an engine's eagerly run step calls them.

An engine runs its prefill above its largest captured CUDA graph eagerly (vLLM: the compiled graph, its wrapper
calling each custom op from Python), and there the host's time per op adds to the step wherever the host is
slower than the GPU (results/h100/engines/README.md, 2026-12-07: ours' prefill step +7.4 ms of window for
+0.14 ms of GPU time). This times, for each of the calls a decoder layer makes, the host's µs per call with the
GPU kept ahead of it (a small layer: d_model 512, d_ff 1024, so that each kernel takes a few µs), on inference
tensors under `torch.inference_mode` as the engines' forwards run:

- `torch.ops.sk.<op>.default`, what compiled code calls, and the public `sk.ops.<op>`, with its argument checks;
- the fused block at 8 rows (the fused kernels) and at 1,024 rows (our norm and activation kernels around
  cuBLAS's two GEMMs);
- a Triton kernel of the same arity as our norm's, launched through Triton's JIT as ours are: Triton's part;
  and the same compiled kernel launched through its compiled launcher (`CompiledKernel[grid](*args)`, as
  Inductor's generated code does): what skipping the JIT's argument binding and cache lookup would save;
- beside them, what a stock layer's host runs for the same work: `F.linear` alone, and vLLM's `_C` norm and
  activation between the two GEMMs where vLLM is installed (else PyTorch's eager ops).

With `--out`, `op_host_path.cprofile.txt` lists where the host's time goes in 2,000 calls of each of our ops'
cases (cProfile, by own time): the functions, Triton's launch and the CUDA calls behind a call's host cost; and
`op_host_path.N.pstats` holds case N's whole profile (`python -m pstats FILE` reads it: callers, callees).

"GPU µs" is the same call's kernels alone: 20 calls captured in a CUDA graph, replayed between CUDA events, per
call. Where the host's µs exceed it, an eager step of such calls waits on the host (as every case here does on
purpose); the difference is what the host adds per call.

    python benchmarks/op_host_path.py [--out DIR] [--calls N]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import sk
from sk import settings
from sk.bench.timing import host_us_per_call

D_MODEL, D_FF = 512, 1024


@triton.jit
def _row_scale_kernel(x_ptr, x_stride, r_ptr, r_stride, w_ptr, y_ptr, y_stride, o_ptr, o_stride, n_rows, n_cols,
                      eps, offset, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """A norm-sized launch (our RMSNorm kernel's 13 arguments) that does little: Triton's own launch cost."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask)
    tl.store(y_ptr + row * y_stride + cols, x * (eps + offset), mask=mask)


def graph_us(fn, calls: int = 20, replays: int = 20) -> float:
    """The GPU's µs per call with no host in it: `calls` calls captured in one CUDA graph, replayed `replays`
    times between two CUDA events."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (calls * replays)


def cprofiled(name: str, fn, calls: int = 2000, top: int = 25, dump: Path | None = None) -> str:
    """`calls` calls of `fn` under cProfile: its `top` functions by own time, as text; the whole profile written
    to `dump` (pstats' format, for `python -m pstats`) where given."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    if dump is not None:
        profiler.dump_stats(dump)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return f"=== {name}: {calls} calls\n{text.getvalue()}"


def stock_sequence():
    """A stock layer's norm + MLP calls at 1,024 rows: vLLM's `_C` ops where vLLM is installed, else PyTorch's."""
    try:
        import vllm._custom_ops  # noqa: F401  (loads torch.ops._C)
        norm, act = torch.ops._C.fused_add_rms_norm.default, torch.ops._C.silu_and_mul.default

        def run(x, r, w, gu, down, eps):
            norm(x, r, w, eps)
            a = torch.empty(x.shape[0], gu.shape[0] // 2, dtype=x.dtype, device=x.device)
            act(a, F.linear(x, gu))
            return F.linear(a, down)
        return "vLLM _C norm + 2 F.linear + _C silu_and_mul", run
    except ImportError:
        def run(x, r, w, gu, down, eps):
            h = x + r
            n = F.rms_norm(h, (h.shape[-1],), w, eps)
            g, u = F.linear(n, gu).chunk(2, dim=-1)
            return F.linear(F.silu(g) * u, down)
        return "PyTorch eager: add, rms_norm, 2 F.linear, silu, mul (no vLLM here)", run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("op_host_path: needs a CUDA GPU")
    dt, dev = torch.bfloat16, "cuda"
    torch.manual_seed(0)
    with torch.inference_mode():
        w = torch.ones(D_MODEL, dtype=dt, device=dev)
        gu = torch.randn(2 * D_FF, D_MODEL, dtype=dt, device=dev) / D_MODEL ** 0.5
        down = torch.randn(D_MODEL, D_FF, dtype=dt, device=dev) / D_FF ** 0.5
        rows = {m: (torch.randn(m, D_MODEL, dtype=dt, device=dev), torch.randn(m, D_MODEL, dtype=dt, device=dev))
                for m in (8, 1024)}
        x, r = rows[1024]
        a2 = torch.randn(1024, 2 * D_FF, dtype=dt, device=dev)
        op = torch.ops.sk
        stock_name, stock = stock_sequence()
        y = torch.empty_like(x)

        def triton_launch(pdl=False):  # returns the compiled kernel it launched
            return _row_scale_kernel[(x.shape[0],)](x, x.stride(0), r, r.stride(0), w, y, y.stride(0), y,
                                                    y.stride(0), x.shape[0], x.shape[1], 1e-6, 0.0,
                                                    HAS_RESIDUAL=True, BLOCK_N=512, launch_pdl=pdl)
        launcher = triton_launch()[(x.shape[0], 1, 1)]

        def compiled_launch():
            launcher(x, x.stride(0), r, r.stride(0), w, y, y.stride(0), y, y.stride(0), x.shape[0], x.shape[1],
                     1e-6, 0.0, True, 512)
        cases = {
            "a Triton kernel with 13 arguments, launched as ours are (JIT)": triton_launch,
            "the same kernel through its compiled launcher": compiled_launch,
            "the same kernel as a dependent launch (JIT, launch_pdl=True)": lambda: triton_launch(pdl=True),
            "F.linear, 1024 rows (one cuBLAS GEMM)": lambda: F.linear(x, gu),
            "torch.ops.sk.rms_norm": lambda: op.rms_norm.default(x, w, 1e-6, 0.0),
            "sk.ops.rms_norm": lambda: sk.ops.rms_norm(x, w, 1e-6),
            "torch.ops.sk.fused_add_rms_norm_ (in place)": lambda: op.fused_add_rms_norm_.default(x, r, w, 1e-6, 0.0),
            "sk.ops.fused_add_rms_norm_ (in place)": lambda: sk.ops.fused_add_rms_norm_(x, r, w, 1e-6),
            "sk.ops.fused_add_rms_norm": lambda: sk.ops.fused_add_rms_norm(x, r, w, 1e-6),
            "sk.ops.silu_and_mul": lambda: sk.ops.silu_and_mul(a2),
        }
        for m, (xm, rm) in rows.items():
            path = "fused kernels" if m == 8 else "our norm + activation around cuBLAS"
            cases[f"torch.ops.sk.fused_gated_mlp, {m} rows ({path})"] = (
                lambda xm=xm, rm=rm: op.fused_gated_mlp.default(xm, rm, w, None, gu, None, down, None, 1e-6, "rms",
                                                                "silu"))
            cases[f"sk.ops.fused_gated_mlp, {m} rows"] = (
                lambda xm=xm, rm=rm: sk.ops.fused_gated_mlp(xm, w, gu, down, 1e-6, residual=rm))
        cases[f"stock, 1024 rows: {stock_name}"] = lambda: stock(x, r, w, gu, down, 1e-6)
        # The same calls with our kernels in plain stream order (no dependent launches): what PDL costs the host.
        overrides = {}  # case -> the settings it runs under
        for name in ("torch.ops.sk.rms_norm", "torch.ops.sk.fused_add_rms_norm_ (in place)",
                     "torch.ops.sk.fused_gated_mlp, 8 rows (fused kernels)"):
            no_pdl = f"{name}, SK_NORM_PDL=0 SK_GATED_MLP_PDL=0"
            cases[no_pdl], overrides[no_pdl] = cases[name], {"norm_pdl": False, "gated_mlp_pdl": False}
        results, profiles = [], []
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
        with sk.coverage.strict():  # every call of ours takes its kernels, never the reference
            for i, (name, fn) in enumerate(cases.items()):
                with settings.override(**overrides.get(name, {})):
                    # Its warm-up calls compile every Triton specialization before the capture.
                    host = host_us_per_call(fn, calls=args.calls, repeats=5, warmup_calls=args.calls // 10 + 1)
                    results.append({"case": name, "host_us": host, "gpu_us": graph_us(fn)})
                    if args.out and "sk." in name:
                        profiles.append(cprofiled(name, fn, dump=args.out / f"op_host_path.{i}.pstats"))
    environment = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "python": platform.python_version(),
                   "cpu": platform.processor() or platform.machine(), "d_model": D_MODEL, "d_ff": D_FF,
                   "calls": args.calls, "date": time.strftime("%Y-%m-%d", time.gmtime())}
    width = max(len(r["case"]) for r in results)
    lines = [f"{environment['gpu']}, torch {environment['torch']}, triton {environment['triton']}, "
             f"Python {environment['python']}; d_model {D_MODEL}, d_ff {D_FF}, bf16, inference tensors",
             f"{'CALL'.ljust(width)}  HOST µs  GPU µs"]
    lines += [f"{r['case'].ljust(width)}  {r['host_us']:7.1f}  {r['gpu_us']:6.1f}" for r in results]
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "op_host_path.json").write_text(json.dumps({"environment": environment, "results": results},
                                                               indent=2) + "\n")
        (args.out / "op_host_path.txt").write_text("\n".join(lines) + "\n")
        (args.out / "op_host_path.cprofile.txt").write_text("\n".join(profiles))


if __name__ == "__main__":
    main()
