"""Experiment (2026-11-30, H200): QuACK 0.6.5's CuTe-DSL SM90 GEMMs (clusters with TMA multicast, ping-pong
consumers, any tile width that is a multiple of 16) against cuBLAS and our Triton kernels, for the GEGLU block's
GEMMs, each alone, side by side in CUDA graphs. The question: is there a kernel that runs the seed's down
projection (1024 x 1448 -> 768 with residual and bias) near the ~6.5 us the 20 us seed target needs, or the
prefill GEMMs faster than ours under the power limit?
Run from the repository root with QuACK on the path (eval "$(bash ci/gpu/cute.sh install DIR)"):
    python3 results/h200/geglu/2026-11-30/ninth-run/experiments/quack_exp.py OUT"""
import importlib.util
import json
import os
import sys
import time

import torch

import sk
from sk.bench.timing import environment, side_by_side_us
from quack.gemm_config import GemmConfig as QC
from quack.gemm_interface import gemm_act, gemm_tuned

torch.manual_seed(0)
bf16 = torch.bfloat16
DEV = "cuda"
errors = {}


def rel(a, ref):
    return ((a.double() - ref).norm() / ref.norm()).item()


def qcfg(m, n, pingpong=False, cluster=(1, 1), swap_ab=False):
    return QC(tile_m=m, tile_n=n, pingpong=pingpong, cluster_m=cluster[0], cluster_n=cluster[1], swap_ab=swap_ab,
              is_dynamic_persistent=False, device_capacity=9)


def quack_add(a, b, c, bias, out, cfg):
    """out = a @ b + c + bias through QuACK's kernel at `cfg` (the autotuner bypassed)."""
    return lambda: gemm_tuned.fn(a, b, out, C=c, bias=bias, config=cfg)


def add_candidates(fns, label, make, out, ref, tol):
    """Compile, check against the fp64 reference (bf16 output: rel. error ~2e-3), and keep the ones that run."""
    t0 = time.time()
    try:
        out.fill_(float("nan"))
        fn = make()
        fn()
        torch.cuda.synchronize()
        err = rel(out, ref)
        print(f"{label:48s} compile+run {time.time() - t0:6.1f} s  rel err {err:.2e}", flush=True)
        assert err < tol, f"{label}: error {err}"
        fns[label] = fn
    except Exception as e:  # a config QuACK cannot build here is reported, not fatal
        print(f"{label:48s} FAILED after {time.time() - t0:.1f} s: {type(e).__name__}: {str(e)[:300]}", flush=True)
        errors[label] = f"{type(e).__name__}: {str(e)[:300]}"


def ours_down():
    """The seventh run's down-kernel experiment (our production down kernel's code path and table entry)."""
    path = "results/h200/geglu/2026-11-30/seventh-run/experiments/down_exp.py"
    spec = importlib.util.spec_from_file_location("down_exp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.down_fn


def seed(out_dir):
    m, d, ff = 1024, 768, 1448
    x = torch.randn(m, d, device=DEV, dtype=bf16)
    h = torch.randn(m, ff, device=DEV, dtype=bf16)
    wd = (torch.randn(d, ff, device=DEV) / ff ** 0.5).to(bf16)
    bd = torch.randn(d, device=DEV, dtype=bf16)
    ref = x.double() + h.double() @ wd.double().T + bd.double()
    ref_nobias = x.double() + h.double() @ wd.double().T
    fns = {}
    y = torch.empty(m, d, device=DEV, dtype=bf16)
    # bf16 output rounding alone is 2^-9 relative per element: 1e-2 flags only a wrong kernel.
    add_candidates(fns, "cuBLAS addmm (x + h W^T, no bias)", lambda: (lambda: torch.addmm(x, h, wd.T, out=y)),
                   y, ref_nobias, 1e-2)
    try:
        down_fn = ours_down()
        y2 = torch.empty(m, d, device=DEV, dtype=bf16)
        add_candidates(fns, "ours Triton down 64x128x64 w4 s3 (no bias)",
                       lambda: down_fn(h, wd, x, y2, 64, 128, 0, 64, 4, 3), y2, ref_nobias, 1e-2)
    except Exception as e:
        print("ours down unavailable:", e)
    b = wd.T  # (K, N), K-major: the layout the weights are stored in
    for tm, tn, pp, cl, sw in [(64, 96, False, (1, 2), False), (64, 96, False, (2, 1), False),
                               (64, 96, False, (1, 1), False), (64, 96, True, (1, 2), False),
                               (128, 48, False, (1, 2), False), (64, 128, False, (2, 1), False),
                               (64, 128, False, (1, 2), False), (128, 96, False, (2, 1), False),
                               (64, 192, False, (2, 1), False), (128, 64, False, (1, 2), True)]:
        out = torch.empty(m, d, device=DEV, dtype=bf16)
        cfg = qcfg(tm, tn, pp, cl, sw)
        label = f"QuACK {tm}x{tn} {'pp' if pp else 'coop'} cl{cl[0]}x{cl[1]}{' swapAB' if sw else ''} (+bias)"
        add_candidates(fns, label, lambda: quack_add(h, b, x, bd, out, cfg), out, ref, 1e-2)
    res = side_by_side_us(fns, calls_per_replay=50, repeats=60, on_error=lambda n, e: print("ERR", n, e))
    return res


def prefill(out_dir):
    m, d, ff = 8192, 2048, 16384
    x = torch.randn(m, d, device=DEV, dtype=bf16)
    w = (torch.randn(2 * ff, d, device=DEV) / d ** 0.5).to(bf16)  # gate rows then up rows
    h = torch.randn(m, ff, device=DEV, dtype=bf16)
    wd = (torch.randn(d, ff, device=DEV) / ff ** 0.5).to(bf16)
    bd = torch.randn(d, device=DEV, dtype=bf16)
    fns = {}
    # References in fp32 on the GPU (fp64 at this size would take minutes): its own error is ~1e-6.
    gu_ref = (x.float() @ w.float().T).double()
    gu = torch.empty(m, 2 * ff, device=DEV, dtype=bf16)
    add_candidates(fns, "gate/up cuBLAS mm", lambda: (lambda: torch.mm(x, w.T, out=gu)), gu, gu_ref, 1e-2)
    for tm, tn, pp, cl in [(128, 208, True, (2, 1)), (128, 192, True, (2, 1)), (128, 256, False, (2, 1)),
                           (256, 128, False, (2, 1)), (256, 192, False, (2, 1))]:
        out = torch.empty(m, 2 * ff, device=DEV, dtype=bf16)
        cfg = qcfg(tm, tn, pp, cl)
        add_candidates(fns, f"gate/up QuACK {tm}x{tn} {'pp' if pp else 'coop'} cl{cl[0]}x{cl[1]}",
                       lambda: quack_add(x, w.T, None, None, out, cfg), out, gu_ref, 1e-2)
    del gu_ref
    # Fused GEGLU (tanh: QuACK's only GELU for gated epilogues) on interleaved gate/up rows.
    wi = torch.stack([w[:ff], w[ff:]], 1).reshape(2 * ff, d)
    pre = (x.float() @ w.float().T)
    act_ref = (torch.nn.functional.gelu(pre[:, :ff], approximate="tanh") * pre[:, ff:]).double()
    del pre
    post = torch.empty(m, ff, device=DEV, dtype=bf16)
    for tm, tn, pp, cl in [(128, 192, True, (2, 1)), (128, 256, False, (2, 1))]:
        cfg = qcfg(tm, tn, pp, cl)
        add_candidates(fns, f"gate/up+GEGLU(tanh) QuACK {tm}x{tn} {'pp' if pp else 'coop'} cl{cl[0]}x{cl[1]}",
                       lambda: (lambda: gemm_act(x, wi.T, activation="geglu", store_preact=False, postact_out=post,
                                                 config=cfg, tuned=False)), post, act_ref, 2e-2)
    del act_ref
    ref = (x.float() + h.float() @ wd.float().T).double()
    y = torch.empty(m, d, device=DEV, dtype=bf16)
    add_candidates(fns, "down cuBLAS addmm (no bias)", lambda: (lambda: torch.addmm(x, h, wd.T, out=y)), y, ref, 1e-2)
    ref = ref + bd.double()
    for tm, tn, pp, cl in [(128, 256, False, (2, 1)), (128, 192, True, (2, 1)), (128, 128, True, (2, 1)),
                           (256, 128, False, (2, 1))]:
        out = torch.empty(m, d, device=DEV, dtype=bf16)
        cfg = qcfg(tm, tn, pp, cl)
        add_candidates(fns, f"down QuACK {tm}x{tn} {'pp' if pp else 'coop'} cl{cl[0]}x{cl[1]} (+bias)",
                       lambda: quack_add(h, wd.T, x, bd, out, cfg), out, ref, 1e-2)
    del ref
    return side_by_side_us(fns, calls_per_replay=5, repeats=25, on_error=lambda n, e: print("ERR", n, e))


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    import quack
    env = environment() | {"quack": getattr(quack, "__version__", "?")}
    print(env, flush=True)
    results = {"environment": env}
    for name, part in [("seed", seed), ("prefill", prefill)]:
        t0 = time.time()
        res = part(out_dir)
        results[name] = res
        print(f"== {name} ({time.time() - t0:.0f} s)")
        for label, us in sorted(res.items(), key=lambda kv: kv[1] or 1e9):
            print(f"{label:60s} {us:9.2f} us" if us else f"{label:60s}   failed", flush=True)
        results["errors"] = errors
        json.dump(results, open(os.path.join(out_dir, "quack.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
