"""Our RMSNorm kernels launched as programmatic dependent launches (PDL, `SK_NORM_PDL`) against plain stream order,
and against the engines' own norm kernels, where the launch matters: chained inside one CUDA graph.

Two chains, bf16, µs per link (medians of interleaved graph replays, `sk.bench.timing.side_by_side_us`):
  norms   LINKS in-place add + RMSNorms back to back (`fused_add_rms_norm_`): each reads the one before's
          outputs, as a dependent launch after a dependent launch would. Peers where importable: sgl_kernel's
          `fused_add_rmsnorm` with and without its `enable_pdl`, vLLM's `_C.fused_add_rms_norm`.
  layer   a decoder layer without attention at Llama-3-8B's shapes: add + RMSNorm (the norm compared), the QKV
          and output projections (cuBLAS), then `sk.ops.fused_gated_mlp` with its residual (its own kernels launch
          as PDL), as the engines run a layer with our fused blocks on. One set of weights, streamed from memory
          every layer (435 MB, far beyond L2).

    python benchmarks/bench_norm_pdl.py OUT [--m 1,8,32,128,1024] [--width 4096]
"""
from __future__ import annotations

import argparse
import inspect
import json
import pathlib

import torch

import sk
from sk.bench.peers import peer_modules
from sk.bench.timing import environment, side_by_side_us

EPS = 1e-6
LINKS = 16
D_FF, QKV = 14336, 6144  # Llama-3-8B: d_ff, and q + k + v widths


def _ours(pdl: bool):
    def norm(x, r, w):
        with sk.settings.override(norm_pdl=pdl):
            sk.ops.fused_add_rms_norm_(x, r, w, EPS)
    return norm


def norm_impls(peers: dict) -> dict:
    """name -> in-place add + RMSNorm (x, residual, weight)."""
    impls = {"ours (PDL)": _ours(True), "ours (stream order)": _ours(False)}
    if "sgl_kernel" in peers:
        fn = peers["sgl_kernel"].fused_add_rmsnorm
        if "enable_pdl" in inspect.signature(fn).parameters:
            impls["sgl_kernel (PDL)"] = lambda x, r, w: fn(x, r, w, EPS, enable_pdl=True)
            impls["sgl_kernel (stream order)"] = lambda x, r, w: fn(x, r, w, EPS, enable_pdl=False)
        else:
            impls["sgl_kernel"] = lambda x, r, w: fn(x, r, w, EPS)
    if "vllm_C" in peers:
        impls["vllm _C"] = lambda x, r, w: peers["vllm_C"].fused_add_rms_norm(x, r, w, EPS)
    return impls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--m", default="1,8,32,128,1024")
    parser.add_argument("--width", type=int, default=4096)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev, dt, d = torch.device("cuda"), torch.bfloat16, args.width
    impls = norm_impls(peer_modules())
    w_norm = 1 + 0.1 * torch.randn(d, device=dev, dtype=dt)
    w_qkv = torch.randn(QKV, d, device=dev, dtype=dt) / d ** 0.5
    w_o = torch.randn(d, d, device=dev, dtype=dt) / d ** 0.5
    mlp_norm = 1 + 0.1 * torch.randn(d, device=dev, dtype=dt)
    gate_up = torch.randn(2 * D_FF, d, device=dev, dtype=dt) / d ** 0.5
    down = torch.randn(d, D_FF, device=dev, dtype=dt) / D_FF ** 0.5
    rows, errors = [], {}

    def failed(name, e):
        errors[name] = repr(e)
        print(f"  {name} did not run: {e!r}", flush=True)

    for m in map(int, args.m.split(",")):
        x0, r0 = torch.randn(m, d, device=dev, dtype=dt), torch.randn(m, d, device=dev, dtype=dt)
        # The same answer from each implementation first (one link on fresh copies), then the chains timed.
        answers = {}
        for name, norm in impls.items():
            x, r = x0.clone(), r0.clone()
            norm(x, r, w_norm)
            answers[name] = (x, r)
        base = answers["ours (stream order)"]
        agree = {name: max(float((a.double() - b.double()).norm() / b.double().norm()) for a, b in zip(got, base))
                 for name, got in answers.items()}

        def norm_chain(norm):
            x, r = x0.clone(), r0.clone()
            return lambda: [norm(x, r, w_norm) for _ in range(LINKS)]

        def layer_chain(norm):
            x, r = x0.clone(), r0.clone()

            def run():
                h, res = x, r
                for _ in range(LINKS // 4):
                    norm(h, res, w_norm)
                    qkv = h @ w_qkv.t()
                    attn = qkv[:, :d] @ w_o.t()
                    h, res = sk.ops.fused_gated_mlp(attn, mlp_norm, gate_up, down, EPS, residual=res)
                return h
            return run

        norms = side_by_side_us({n: norm_chain(f) for n, f in impls.items()}, calls_per_replay=4, on_error=failed)
        layer_impls = {n: f for n, f in impls.items() if n != "vllm _C"}  # the layer as SGLang runs it, or ours
        layers = side_by_side_us({n: layer_chain(f) for n, f in layer_impls.items()}, calls_per_replay=2,
                                 on_error=failed)
        row = {"m": m, "width": d, "rel_diff_to_ours": agree,
               "norm_us_per_link": {n: None if t is None else t / LINKS for n, t in norms.items()},
               "layer_us_per_layer": {n: None if t is None else t / (LINKS // 4) for n, t in layers.items()}}
        rows.append(row)
        print(f"M={m} d={d}", flush=True)
        for kind in ("norm_us_per_link", "layer_us_per_layer"):
            print(f"  {kind}: " + ", ".join(f"{n} {t:.2f}" for n, t in row[kind].items() if t is not None), flush=True)
        print("  rel. difference to ours: " + ", ".join(f"{n} {e:.1e}" for n, e in agree.items()), flush=True)
    (args.out / "bench_norm_pdl.json").write_text(json.dumps(
        {"environment": environment(), "links": LINKS, "rows": rows, "errors": errors}, indent=2))


if __name__ == "__main__":
    main()
