"""Two kept `sk profile` traces of one workload, engine step by engine step (sk.workflow.kernel_profile.step_windows):
each trace's step windows and GPU time, and the steps whose windows differ most, i.e. where a variant's extra time
went (the GPU's work, or waits on the host).

    python benchmarks/trace_steps.py BASE.trace.json.gz CANDIDATE.trace.json.gz [--marker KERNEL] [--top N]
"""
from __future__ import annotations

import argparse
import statistics

from sk.workflow.kernel_profile import VLLM_STEP_MARKER, load_trace, step_windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("candidate")
    parser.add_argument("--marker", default=VLLM_STEP_MARKER, help="a kernel launched once per engine step")
    parser.add_argument("--top", type=int, default=6, help="how many of the most different steps to list")
    args = parser.parse_args()
    runs = {label: step_windows(load_trace(path), args.marker)
            for label, path in (("base", args.base), ("candidate", args.candidate))}
    for label, steps in runs.items():
        later = steps[2:] or steps  # past the prefill: the decode steps
        print(f"{label}: {len(steps)} steps, windows {sum(s['window_us'] for s in steps) / 1e3:,.1f} ms in all; "
              f"from step 2 on, median window {statistics.median(s['window_us'] for s in later):,.1f} µs, "
              f"median GPU time {statistics.median(s['busy_us'] for s in later):,.1f} µs")
    base, cand = runs["base"], runs["candidate"]
    if len(base) != len(cand):
        print(f"the traces hold {len(base)} and {len(cand)} steps: not set side by side")
        return
    pairs = sorted(range(len(base)), key=lambda i: base[i]["window_us"] - cand[i]["window_us"])[:args.top]
    print("steps whose windows grew most (step: window, GPU time, base -> candidate, µs):")
    for i in pairs:
        b, c = base[i], cand[i]
        print(f"  {i:4d}: {b['window_us']:9,.1f} -> {c['window_us']:9,.1f} ({c['window_us'] - b['window_us']:+,.1f}); "
              f"GPU {b['busy_us']:9,.1f} -> {c['busy_us']:9,.1f} ({c['busy_us'] - b['busy_us']:+,.1f})")
    print(f"all steps: {sum(c['window_us'] - b['window_us'] for b, c in zip(base, cand)) / 1e3:+,.2f} ms of window, "
          f"{sum(c['busy_us'] - b['busy_us'] for b, c in zip(base, cand)) / 1e3:+,.2f} ms of GPU time")


if __name__ == "__main__":
    main()
