"""Our memory-bound ops side by side with PyTorch and whatever peer kernels are importable, on one GPU.

Every implementation of a case runs in the same process on the same inputs, timed per call inside a CUDA graph
(`timing.graph_time_us`). Bandwidth counts the bytes an op must move (inputs read once, outputs written once)
and is compared with the device-to-device copy bandwidth measured in the same run.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Callable

import torch

from sk import ops
from sk.bench.timing import copy_bandwidth_tbps, environment, side_by_side_us
from sk.ops.act_and_mul import act_and_mul_reference
from sk.ops.rms_norm import fused_add_rms_norm_reference, rms_norm_reference

NORM_ROWS, NORM_WIDTH = (1, 32, 256, 4096, 32768), 4096
ACT_ROWS, ACT_WIDTH = (1, 32, 256, 4096, 16384), 28672  # input width: [gate, up] of 14336 each
EPS = 1e-6
OURS = "sk"


@dataclasses.dataclass
class Case:
    op: str
    rows: int
    width: int
    nbytes: int
    impls: dict[str, Callable[[], object]]


def peer_modules() -> dict[str, object]:
    """The peer libraries importable here (each optional): "vllm_C" (torch.ops._C once vLLM's kernels are
    loaded), "sgl_kernel", "liger" (its rms_norm, fused_add_rms_norm, swiglu, geglu modules)."""
    found = {}
    try:
        import vllm._custom_ops  # noqa: F401  loads vLLM's kernel libraries, which register torch.ops._C

        found["vllm_C"] = torch.ops._C
    except Exception:
        pass
    try:
        import sgl_kernel

        found["sgl_kernel"] = sgl_kernel
    except Exception:
        pass
    try:
        from liger_kernel.ops import fused_add_rms_norm, geglu, rms_norm, swiglu

        found["liger"] = (rms_norm, fused_add_rms_norm, swiglu, geglu)
    except Exception:
        pass
    return found


def _norm_cases(peers: dict, dtype: torch.dtype) -> list[Case]:
    cases = []
    compiled_norm = torch.compile(rms_norm_reference)
    compiled_add_norm = torch.compile(fused_add_rms_norm_reference)
    for m in NORM_ROWS:
        n = NORM_WIDTH
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        r = torch.randn_like(x)
        w = torch.randn(n, device="cuda", dtype=dtype)
        out = torch.empty_like(x)
        esize = x.element_size()
        norm = {
            OURS: lambda x=x, w=w: ops.rms_norm(x, w, EPS),
            "eager": lambda x=x, w=w: rms_norm_reference(x, w, EPS),
            "compile": lambda x=x, w=w: compiled_norm(x, w, EPS),
            "F.rms_norm": lambda x=x, w=w: torch.nn.functional.rms_norm(x, (n,), w, EPS),
        }
        add_norm = {
            OURS + "(inplace)": lambda x=x, r=r, w=w: ops.fused_add_rms_norm_(x, r, w, EPS),
            OURS: lambda x=x, r=r, w=w: ops.fused_add_rms_norm(x, r, w, EPS),
            "eager": lambda x=x, r=r, w=w: fused_add_rms_norm_reference(x, r, w, EPS),
            "compile": lambda x=x, r=r, w=w: compiled_add_norm(x, r, w, EPS),
        }
        if "vllm_C" in peers:
            c = peers["vllm_C"]
            norm["vllm_C"] = lambda x=x, w=w, out=out: c.rms_norm(out, x, w, EPS)
            add_norm["vllm_C(inplace)"] = lambda x=x, r=r, w=w: c.fused_add_rms_norm(x, r, w, EPS)
        if "sgl_kernel" in peers:
            s = peers["sgl_kernel"]
            norm["sgl_kernel"] = lambda x=x, w=w: s.rmsnorm(x, w, EPS)
            add_norm["sgl_kernel(inplace)"] = lambda x=x, r=r, w=w: s.fused_add_rmsnorm(x, r, w, EPS)
        if "liger" in peers:
            lrms, ladd, _, _ = peers["liger"]
            norm["liger"] = lambda x=x, w=w: lrms.LigerRMSNormFunction.apply(x, w, EPS)
            add_norm["liger"] = lambda x=x, r=r, w=w: ladd.LigerFusedAddRMSNormFunction.apply(x, r, w, EPS)
        cases.append(Case("rms_norm", m, n, (2 * m * n + n) * esize, norm))
        cases.append(Case("fused_add_rms_norm", m, n, (4 * m * n + n) * esize, add_norm))
    return cases


def _act_cases(peers: dict, dtype: torch.dtype) -> list[Case]:
    cases = []
    compiled = torch.compile(act_and_mul_reference)
    for m in ACT_ROWS:
        width, d = ACT_WIDTH, ACT_WIDTH // 2
        x = torch.randn(m, width, device="cuda", dtype=dtype)
        out = torch.empty(m, d, device="cuda", dtype=dtype)
        nbytes = 3 * m * d * x.element_size()
        for op, act, sk_fn in (
            ("silu_and_mul", "silu", lambda x=x, out=out: ops.silu_and_mul(x, out=out)),
            ("gelu_tanh_and_mul", "gelu_tanh", lambda x=x, out=out: ops.gelu_and_mul(x, "tanh", out=out)),
            ("gelu_and_mul", "gelu", lambda x=x, out=out: ops.gelu_and_mul(x, out=out)),
        ):
            impls = {
                OURS: sk_fn,
                "eager": lambda x=x, act=act: act_and_mul_reference(x, act),
                "compile": lambda x=x, act=act: compiled(x, act),
            }
            if "vllm_C" in peers:
                fn = getattr(peers["vllm_C"], op)
                impls["vllm_C"] = lambda x=x, out=out, fn=fn: fn(out, x)
            if "sgl_kernel" in peers:
                fn = getattr(peers["sgl_kernel"], op)
                impls["sgl_kernel"] = lambda x=x, out=out, fn=fn: fn(x, out)
            if "liger" in peers and act != "gelu":
                _, _, swiglu, geglu = peers["liger"]
                fn = swiglu.LigerSiLUMulFunction.apply if act == "silu" else geglu.LigerGELUMulFunction.apply
                impls["liger"] = lambda x=x, fn=fn, d=d: fn(x[:, :d], x[:, d:])
            cases.append(Case(op, m, width, nbytes, impls))
    return cases


def run(out_dir: str | pathlib.Path, dtype: torch.dtype = torch.bfloat16, log: Callable[[str], None] = print) -> dict:
    """Time every case, write `ops_peers.json`, `ops_peers.md` and `ops_peers.png` into `out_dir`."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    peers = peer_modules()
    copy_tbps = copy_bandwidth_tbps()
    log(f"copy bandwidth {copy_tbps:.2f} TB/s; peers importable: {sorted(peers) or 'none'}")
    rows = []
    for case in _norm_cases(peers, dtype) + _act_cases(peers, dtype):
        times = side_by_side_us(
            case.impls, on_error=lambda name, e: log(f"  {case.op} M={case.rows} {name}: {type(e).__name__}: {str(e)[:160]}"))
        ours = {k: v for k, v in times.items() if k.startswith(OURS) and v is not None}
        theirs = {k: v for k, v in times.items() if not k.startswith(OURS) and v is not None}
        if not ours:
            raise RuntimeError(f"{case.op} M={case.rows}: our kernel failed; see the log above")
        best_ours = min(ours.values())
        best_peer_name = min(theirs, key=theirs.get) if theirs else None
        tbps = case.nbytes / (best_ours * 1e-6) / 1e12
        rows.append({
            "op": case.op, "M": case.rows, "N": case.width, "bytes": case.nbytes, "us": times,
            "sk_us": best_ours, "sk_TBps": tbps, "sk_pct_copy": 100 * tbps / copy_tbps,
            "floor_us": case.nbytes / (copy_tbps * 1e12) * 1e6,
            "best_peer": best_peer_name, "best_peer_us": theirs.get(best_peer_name),
            "sk_vs_best_peer": theirs[best_peer_name] / best_ours if theirs else None,
        })
        log(f"{case.op:>20} M={case.rows:<6} sk {best_ours:8.2f} µs {tbps:5.2f} TB/s  best peer "
            f"{best_peer_name} {theirs.get(best_peer_name, float('nan')):8.2f} µs")
    result = {"environment": environment(), "copy_TBps": copy_tbps, "dtype": str(dtype), "rows": rows}
    (out_dir / "ops_peers.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "ops_peers.md").write_text(markdown(result))
    plot(result, out_dir / "ops_peers.png")
    return result


def markdown(result: dict) -> str:
    env = result["environment"]
    impls = sorted({k for r in result["rows"] for k in r["us"]}, key=lambda k: (not k.startswith(OURS), k))
    lines = [
        f"# Memory-bound ops on {env['gpu']} ({env['arch']}), {env['date']}",
        "",
        f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}; {result['dtype']}; µs per call inside a "
        f"CUDA graph (20 calls per replay, median of 50 replays, implementations interleaved). Copy bandwidth measured in the same run: "
        f"{result['copy_TBps']:.2f} TB/s. `vs best peer` > 1 means we are faster.",
        "",
        "| op | M | N | " + " | ".join(impls) + " | sk TB/s | % of copy | floor µs | vs best peer |",
        "|---|---|---|" + "---|" * len(impls) + "---|---|---|---|",
    ]
    for r in result["rows"]:
        cells = [f"{r['us'][k]:.2f}" if r["us"].get(k) is not None else "" for k in impls]
        ratio = f"{r['sk_vs_best_peer']:.2f}× ({r['best_peer']})" if r["best_peer"] else ""
        lines.append(f"| {r['op']} | {r['M']} | {r['N']} | " + " | ".join(cells)
                     + f" | {r['sk_TBps']:.2f} | {r['sk_pct_copy']:.0f}% | {r['floor_us']:.2f} | {ratio} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    op_names = list(dict.fromkeys(r["op"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(op_names), figsize=(5 * len(op_names), 4), squeeze=False)
    for ax, op in zip(axes[0], op_names):
        rows = [r for r in result["rows"] if r["op"] == op]
        for impl in dict.fromkeys(k for r in rows for k in r["us"]):
            pts = [(r["M"], r["bytes"] / (r["us"][impl] * 1e-6) / 1e12) for r in rows if r["us"].get(impl)]
            ax.plot(*zip(*pts), marker="o", label=impl, linewidth=2.5 if impl.startswith(OURS) else 1)
        ax.axhline(result["copy_TBps"], color="gray", linestyle="--", label="copy")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op} (N={rows[0]['N']})")
        ax.set_xlabel("rows M")
        ax.set_ylabel("achieved TB/s")
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['environment']['gpu']}, {result['dtype']}, {result['environment']['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
