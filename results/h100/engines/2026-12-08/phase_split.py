"""Split a throughput batch's kernel trace (`sk profile`'s .trace.json.gz) into its prefill phase (up to the last
cuBLAS GEMM longer than 1 ms) and its decode phase; print each phase's span and busy time, then the decode phase's
kernels by name, stock beside ours.  python phase_split.py PROFILE_DIR  (a folder with stock/ and sk/)"""
import collections
import glob
import gzip
import json
import sys


def kernels(path):
    events = json.load(gzip.open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    return sorted((e["ts"], e["dur"], e["name"]) for e in events if e.get("ph") == "X")


def phases(k):
    last = max(i for i, (_, dur, name) in enumerate(k) if "nvjet" in name and dur > 1000)
    return k[:last + 1], k[last + 1:]


def span(k):
    return (k[-1][0] + k[-1][1] - k[0][0]) / 1e3


folder = sys.argv[1]
by_name = {}
for variant in ("stock", "sk"):
    prefill, decode = phases(kernels(glob.glob(f"{folder}/{variant}/traces/*.trace.json.gz")[0]))
    print(f"{variant:5s} prefill span {span(prefill):7.1f} ms busy {sum(d for _, d, _ in prefill) / 1e3:7.1f} ms | "
          f"decode span {span(decode):7.1f} ms busy {sum(d for _, d, _ in decode) / 1e3:7.1f} ms ({len(decode)} kernels)")
    times, counts = collections.Counter(), collections.Counter()
    for _, dur, name in decode:
        times[name[:90]] += dur
        counts[name[:90]] += 1
    by_name[variant] = times, counts
print("\ndecode phase, per kernel name: stock ms, ours ms, difference, calls stock / ours")
names = set(by_name["stock"][0]) | set(by_name["sk"][0])
for name in sorted(names, key=lambda n: -(by_name["stock"][0][n] + by_name["sk"][0][n])):
    a, b = by_name["stock"][0][name] / 1e3, by_name["sk"][0][name] / 1e3
    print(f"  {a:8.2f} {b:8.2f} {b - a:+7.2f}  {by_name['stock'][1][name]:5d} {by_name['sk'][1][name]:5d}  {name}")
