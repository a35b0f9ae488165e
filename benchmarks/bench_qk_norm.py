"""Qwen3's per-head q/k norms as vLLM runs them under Inductor, against the same with `sk.ops.rms_norm` inside.

The question: what our op costs where Inductor would fuse the norm with its neighbours (the vLLM adapter leaves
per-head norms to vLLM: results/h100/engines/README.md, 2026-12-05). The block timed is the attention side between
the QKV GEMM and attention: split the QKV output, RMSNorm each head of q and of k (on strided views), rotary
embedding (NeoX halves) on both, under torch.compile as vLLM compiles it; variant "sk" calls our op (opaque to
Inductor) for the two norms, variant "inductor" the op's PyTorch reference, which Inductor fuses with the split
and rotary.

    python benchmarks/bench_qk_norm.py OUT [--m 1,8,32,128]

µs per call inside a CUDA graph (medians of interleaved replays, `sk.bench.timing.side_by_side_us`), bf16.
"""
from __future__ import annotations

import argparse
import json
import pathlib

import torch

import sk
from sk.bench.timing import environment, side_by_side_us
from sk.ops.rms_norm import rms_norm_reference

HEADS, KV_HEADS, HEAD_DIM, EPS = 32, 8, 128, 1e-6  # Qwen3-8B


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def block(norm):
    def run(qkv, wq, wk, cos, sin):
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        q = norm(q.view(q.shape[0], HEADS, HEAD_DIM), wq)
        k = norm(k.view(k.shape[0], KV_HEADS, HEAD_DIM), wk)
        c, s = cos[:, None, :], sin[:, None, :]
        return _rotary(q, c, s).flatten(1), _rotary(k, c, s).flatten(1), v
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--m", default="1,8,32,128")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev, dt = torch.device("cuda"), torch.bfloat16
    variants = {"inductor": torch.compile(block(lambda x, w: rms_norm_reference(x, w, EPS)), dynamic=False),
                "sk": torch.compile(block(lambda x, w: sk.ops.rms_norm(x, w, EPS)), dynamic=False)}
    rows = []
    for m in map(int, args.m.split(",")):
        qkv = torch.randn(m, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=dev, dtype=dt)
        wq, wk = (torch.randn(HEAD_DIM, device=dev, dtype=dt) for _ in range(2))
        angles = torch.rand(m, HEAD_DIM // 2, device=dev) * 6.28
        inputs = (qkv, wq, wk, angles.cos(), angles.sin())
        ref = variants["inductor"](*inputs)
        got = variants["sk"](*inputs)  # also compiles it, outside the capture
        err = max(float((g.double() - r.double()).norm() / r.double().norm()) for g, r in zip(got, ref))
        us = side_by_side_us({name: (lambda f=f: f(*inputs)) for name, f in variants.items()})
        rows.append({"m": m, "us": us, "sk_over_inductor": us["sk"] / us["inductor"], "rel_err": err})
        print(f"M={m}: inductor {us['inductor']:.2f} µs, sk {us['sk']:.2f} µs "
              f"(sk takes {us['sk'] / us['inductor']:.2f}x the time), rel. error {err:.1e}", flush=True)
    (args.out / "bench_qk_norm.json").write_text(json.dumps({"environment": environment(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
