"""Decoder layers without attention, compiled by Inductor as vLLM compiles them, with and without our kernels
inside: do cuBLAS's GEMMs run slower beside our norm and activation kernels than beside Inductor's?

vLLM's Qwen3-8B-shaped decode at batch 32 ran 0.97-0.98x stock with any part of our adapter on, while each kernel
of ours was at parity alone (results/h100/engines/README.md, 2026-12-06). This chain reproduces the layer's
sequence outside the engine: LAYERS decoder layers with their own weights (every GEMM streams from HBM), each
add + RMSNorm, QKV projection, output projection (on q's columns: attention left out), add + RMSNorm, gate/up
projection, SiLU-and-mul, down projection, all under `torch.compile(dynamic=False)`. Variants differ only in who
runs the norms and the activation:

  inductor              the ops' PyTorch references, which Inductor generates kernels for (stock vLLM)
  sk norms              our add + RMSNorm (in place, as our vLLM provider calls it), opaque to Inductor
  sk norms, stream order  the same launched without PDL (`SK_NORM_PDL=0`)
  sk activation         our SiLU-and-mul
  sk norms + activation both (our adapter with SK_FUSED_MLP=0)
  sk fused block        the post-attention norm + MLP as one `sk.ops.fused_gated_mlp`, Inductor's input norm (our
                        adapter with SK_NORM_ACT_LAYERS=0)
  sk fused block + norm the same with our input norm (our adapter's default)

Per variant: µs per chain inside a CUDA graph (medians of interleaved replays, `sk.bench.timing.side_by_side_us`),
and the GPU time of the graph's kernels by class (torch.profiler over replays): GEMM, norm/activation, other.

    python benchmarks/bench_decoder_chain.py OUT [--m 1,8,32] [--layers 8] [--shape qwen3-8b]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re

import torch
import torch.nn.functional as F

import sk
from sk.bench.timing import capture, environment, side_by_side_us
from sk.ops.act_and_mul import act_and_mul_reference
from sk.ops.rms_norm import fused_add_rms_norm_reference

EPS = 1e-6
# d_model, QKV width, d_ff
SHAPES = {"qwen3-8b": (4096, 6144, 12288), "llama3-8b": (4096, 6144, 14336), "llama3.2-1b": (2048, 3072, 8192)}
# Kernel classes by name: cuBLAS's GEMMs and our fused gated-MLP kernels (gate/up with the activation, down);
# norms by their ops' names, ours or Inductor's (named after the aten ops it fused: ..._rsqrt_...).
GEMM = re.compile(r"nvjet|gemm|cutlass|xmma|splitK|sm90_|_gate_up_kernel|_down_kernel", re.I)
NORM_ACT = re.compile(r"norm|rsqrt|silu|act_and_mul|rms", re.I)


def _norm_torch(x, r, w):
    return fused_add_rms_norm_reference(x, r, w, EPS)


def _norm_sk(x, r, w):
    sk.ops.fused_add_rms_norm_(x, r, w, EPS)
    return x, r


def _act_torch(gu):
    return act_and_mul_reference(gu, "silu")


def chain(norm, act, fused_block: bool):
    def run(h, res, layers):
        for L in layers:
            n, res = norm(h, res, L["norm1"])
            qkv = F.linear(n, L["qkv"])
            a = F.linear(qkv[:, :L["o"].shape[1]], L["o"])
            if fused_block:
                h, res = sk.ops.fused_gated_mlp(a, L["norm2"], L["gate_up"], L["down"], EPS, residual=res)
            else:
                n, res = norm(a, res, L["norm2"])
                h = F.linear(act(F.linear(n, L["gate_up"])), L["down"])
        return h, res
    return run


VARIANTS = {  # name -> (norm, activation, fused block, SK_NORM_PDL)
    "inductor": (_norm_torch, _act_torch, False, True),
    "sk norms": (_norm_sk, _act_torch, False, True),
    "sk norms, stream order": (_norm_sk, _act_torch, False, False),
    "sk activation": (_norm_torch, sk.ops.silu_and_mul, False, True),
    "sk norms + activation": (_norm_sk, sk.ops.silu_and_mul, False, True),
    "sk fused block": (_norm_torch, _act_torch, True, True),
    "sk fused block + norm": (_norm_sk, _act_torch, True, True),
}


def kernel_classes(graph: torch.cuda.CUDAGraph, replays: int) -> dict:
    """GPU µs per replay by kernel class, and the top kernels, from torch.profiler over `replays` replays."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    classes, kernels = {"gemm": 0.0, "norm/activation": 0.0, "other": 0.0}, {}
    for e in prof.key_averages():
        if e.device_type != torch.autograd.DeviceType.CUDA or e.device_time_total <= 0:
            continue
        us = e.device_time_total / replays
        kind = ("gemm" if GEMM.search(e.key) else
                "norm/activation" if NORM_ACT.search(e.key) else "other")
        classes[kind] += us
        kernels[e.key] = {"us": us, "launches": e.count / replays, "class": kind}
    top = dict(sorted(kernels.items(), key=lambda kv: -kv[1]["us"])[:12])
    return {"classes": classes, "kernels": top}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--m", default="1,8,32")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev, dt = torch.device("cuda"), torch.bfloat16
    d, qkv_w, ff = SHAPES[args.shape]
    gen = torch.Generator(device=dev).manual_seed(0)

    def weight(*shape):
        return torch.randn(*shape, device=dev, dtype=dt, generator=gen) / shape[-1] ** 0.5
    layers = [{"norm1": 1 + 0.1 * weight(d) * d ** 0.5, "qkv": weight(qkv_w, d), "o": weight(d, d),
               "norm2": 1 + 0.1 * weight(d) * d ** 0.5, "gate_up": weight(2 * ff, d), "down": weight(d, ff)}
              for _ in range(args.layers)]
    torch._dynamo.config.recompile_limit = 64  # one compile per variant and M, all of one function
    compiled = {name: torch.compile(chain(norm, act, fused), dynamic=False)
                for name, (norm, act, fused, _) in VARIANTS.items()}
    rows, errors = [], {}
    for m in map(int, args.m.split(",")):
        x0, r0 = weight(m, d) * d ** 0.5, weight(m, d) * d ** 0.5

        def call(name):
            pdl = VARIANTS[name][3]
            x, r = x0.clone(), r0.clone()

            def run():
                # Fresh inputs every call (captured into the graph): the in-place norms would otherwise feed each
                # replay the last one's outputs.
                x.copy_(x0)
                r.copy_(r0)
                with sk.settings.override(norm_pdl=pdl):
                    return compiled[name](x, r, layers)
            return run

        fns = {name: call(name) for name in VARIANTS}
        reference = fns["inductor"]()[0].double()
        agree = {}
        for name, fn in list(fns.items()):
            try:
                got = fn()[0].double()
            except Exception as e:  # reported, and left out of the timing
                errors[f"{name} m={m}"] = repr(e)
                del fns[name]
                continue
            agree[name] = float((got - reference).norm() / reference.norm())
        times = side_by_side_us(fns, calls_per_replay=2, on_error=lambda n, e: errors.setdefault(f"{n} m={m}",
                                                                                                 repr(e)))
        profiles = {}
        for name, fn in fns.items():
            if times.get(name) is None:
                continue
            profiles[name] = kernel_classes(capture(fn, 2), replays=10)
        row = {"m": m, "us_per_layer": {n: None if t is None else t / args.layers for n, t in times.items()},
               "profile_us_per_layer": {n: {k: v / (2 * args.layers) for k, v in p["classes"].items()}
                                        for n, p in profiles.items()},
               "top_kernels_per_replay_of_2_chains": {n: p["kernels"] for n, p in profiles.items()},
               "rel_diff_to_inductor": agree}
        rows.append(row)
        print(f"M={m} {args.shape} ({args.layers} layers): µs per layer, and by class from the profile", flush=True)
        for name in VARIANTS:
            t, p = row["us_per_layer"].get(name), row["profile_us_per_layer"].get(name)
            if t is None:
                print(f"  {name:24s} did not run", flush=True)
                continue
            cls = ", ".join(f"{k} {v:.2f}" for k, v in p.items())
            print(f"  {name:24s} {t:8.2f}  ({cls}; rel. diff {agree[name]:.1e})", flush=True)
    (args.out / "bench_decoder_chain.json").write_text(json.dumps(
        {"environment": environment(), "shape": args.shape, "layers": args.layers, "rows": rows, "errors": errors},
        indent=2))


if __name__ == "__main__":
    main()
