"""Two kept `sk profile` traces of one throughput batch (stock, then ours), each split into its prefill phase (up to
the last GEMM longer than --long-gemm-us) and its decode phase: each phase's window and GPU time (overlapping
kernels counted once, `sk.workflow.kernel_profile.device_events`), then the decode phase's kernels by name side by
side (time with overlaps counted in full, calls).

    python benchmarks/trace_phases.py BASE.trace.json.gz CANDIDATE.trace.json.gz [--long-gemm-us 1000]
"""
from __future__ import annotations

import argparse
import collections

from sk.workflow.kernel_profile import classify, device_events, load_trace


def phases(kernels: list[dict], long_gemm_us: float) -> tuple[list[dict], list[dict]]:
    last = max(i for i, e in enumerate(kernels) if e["dur"] > long_gemm_us and classify(e["name"]) == "gemm")
    return kernels[:last + 1], kernels[last + 1:]


def window_ms(kernels: list[dict]) -> float:
    return (max(e["ts"] + e["dur"] for e in kernels) - kernels[0]["ts"]) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("candidate")
    parser.add_argument("--long-gemm-us", type=float, default=1000.0,
                        help="a GEMM this long belongs to a prefill step (the decode steps' are far shorter)")
    args = parser.parse_args()
    by_name = {}
    for label, path in (("base", args.base), ("candidate", args.candidate)):
        _, kernels = device_events(load_trace(path))
        prefill, decode = phases(kernels, args.long_gemm_us)
        gpu_ms = sum(e["self"] for e in prefill) / 1e3
        print(f"{label:9s} prefill window {window_ms(prefill):8.1f} ms, GPU {gpu_ms:7.1f} "
              f"ms | decode window {window_ms(decode):7.1f} ms, GPU {sum(e['self'] for e in decode) / 1e3:7.1f} ms "
              f"({len(decode)} kernels)")
        times, calls = collections.Counter(), collections.Counter()
        for e in decode:
            times[e["name"][:90]] += e["dur"]
            calls[e["name"][:90]] += 1
        by_name[label] = times, calls
    print("\ndecode phase, per kernel: base ms, candidate ms, difference, calls base / candidate")
    (bt, bc), (ct, cc) = by_name["base"], by_name["candidate"]
    for name in sorted(set(bt) | set(ct), key=lambda n: -(bt[n] + ct[n])):
        print(f"  {bt[name] / 1e3:8.2f} {ct[name] / 1e3:8.2f} {(ct[name] - bt[name]) / 1e3:+7.2f}  "
              f"{bc[name]:5d} {cc[name]:5d}  {name}")


if __name__ == "__main__":
    main()
