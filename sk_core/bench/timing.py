"""Per-call GPU time of a callable, measured the way small ops must be: many calls inside one CUDA graph.

Launch overhead from Python would dominate a 2 µs kernel, so `calls_per_replay` calls are captured into one
graph, the graph is replayed `repeats` times between CUDA events, and the median per-call time is reported.
Implementations compared side by side have their replays interleaved. A weight-streaming op whose weights fit
the GPU's L2 cycles through copies of them (`l2_cold_copies`), as a decode step reads every layer's weights from
HBM.
"""
from __future__ import annotations

import itertools
import math
import random
import statistics
import time
from typing import Callable, Iterator

import torch


def capture(fn: Callable[[], object], calls_per_replay: int, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls_per_replay` calls of `fn`, after warm-up calls that compile and allocate."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_replay):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def side_by_side_us(
    fns: dict[str, Callable[[], object]], *, calls_per_replay: int = 20, repeats: int = 50,
    on_error: Callable[[str, Exception], None] = lambda name, e: None,
) -> dict[str, float | None]:
    """Median µs per call of each fn, their replays interleaved so that clock or thermal drift hits all alike.

    Under the H200's power limit a GEMM-bound graph timed right after a lighter one ran up to 12 % faster than
    back to back with its peers (results/h200/geglu/2026-11-30/sixth-run/prefill-spread/): so each timed replay
    follows an untimed one of the same graph, and every round takes them in a fresh (seeded) random order, so
    that each fn follows each other about equally often.
    A fn that fails to run or capture gets None (and `on_error` is told why).
    """
    graphs = {}
    for name, fn in fns.items():
        try:
            graphs[name] = capture(fn, calls_per_replay)
        except Exception as e:  # a peer that cannot run here is reported by the caller, not fatal
            on_error(name, e)
    times = {name: [] for name in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    order, shuffle = list(graphs.items()), random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name, graph in order:
            graph.replay()
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1000 / calls_per_replay)
    return {name: statistics.median(times[name]) if name in times else None for name in fns}


def host_us_per_call(fn: Callable[[], object], *, calls: int, repeats: int, warmup_calls: int = 1) -> float:
    """Median over `repeats` timed loops of `calls` calls (after `warmup_calls` untimed ones) of the host's µs per
    call: the Python and dispatch cost of `fn`, for CPU measurements with the kernels stubbed out."""
    for _ in range(warmup_calls):
        fn()
    loops = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        loops.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(loops)


def l2_cold_copies(tensors: dict[str, torch.Tensor], *, l2_multiple: float = 3.0) -> Iterator[dict[str, torch.Tensor]]:
    """An endless cycle of copies of `tensors` (name -> tensor; the originals first), as many as stream
    `l2_multiple` times the GPU's L2 between two reads of one copy. A fn that takes `next()` of it at each call,
    captured `calls_per_replay` times, reads its weights from HBM as an engine's decode step does (the whole model
    streams between two calls of a layer), not from L2 as one set called back to back would (a 32 MB projection
    fits a 50 MB L2). One copy where the tensors are not on a GPU."""
    first = next(iter(tensors.values()))
    l2 = torch.cuda.get_device_properties(first.device).L2_cache_size if first.is_cuda else 0
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    copies = max(1, math.ceil(l2_multiple * l2 / max(1, nbytes)))
    return itertools.cycle([dict(tensors)] + [{k: t.clone() for k, t in tensors.items()} for _ in range(copies - 1)])


def graph_time_us(fn: Callable[[], object], *, calls_per_replay: int = 20, repeats: int = 50) -> float:
    """Median µs per call of `fn` (no arguments; it closes over static inputs), replayed from a CUDA graph."""
    def fail(name, e):
        raise e
    return side_by_side_us({"fn": fn}, calls_per_replay=calls_per_replay, repeats=repeats, on_error=fail)["fn"]


def environment() -> dict:
    """GPU, versions and date, for committing next to any result."""
    import datetime
    import platform

    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "date": datetime.date.today().isoformat(),
        "gpu": props.name,
        "arch": f"sm{props.major}{props.minor}",
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def copy_bandwidth_tbps(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), the ceiling for memory-bound ops."""
    src = torch.empty(nbytes // 8, dtype=torch.float32, device="cuda")  # 4-byte elements: vectorized copy
    dst = torch.empty_like(src)
    # Timed outside a graph: a captured copy becomes a copy-engine memcpy node, slower than the SM copy kernel
    # eager mode launches; at gigabytes the launch overhead is negligible.
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e12


def profile_per_step(fn: Callable[[], object], *, steps: int = 20, top: int = 12) -> dict:
    """Where one call of `fn` spends its time, from torch.profiler over `steps` calls launched from Python:
    the GPU kernels (µs and launches per call, by total time) and the host-side ops (self CPU µs and calls per
    call, by self time); then, from cProfile over another `steps` calls, the Python functions by self time
    (what the host ops' own Python costs: argument handling, autograd.Function bodies, Triton's launcher).
    For a host-bound call (a training step at a small shape) the last two lists say what to remove; for a
    GPU-bound one the first says which kernel to work on."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    fn()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0]
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.self_cpu_time_total > 0]
    gpu.sort(key=lambda e: -e.device_time_total)
    host.sort(key=lambda e: -e.self_cpu_time_total)

    python = cProfile.Profile()
    python.enable()
    for _ in range(steps):
        fn()
    python.disable()
    if cuda:
        torch.cuda.synchronize()
    functions = pstats.Stats(python).stats  # {(file, line, name): (primitive calls, calls, self s, total s, ...)}
    by_self = sorted(functions.items(), key=lambda kv: -kv[1][2])
    return {
        "kernels": [{"name": e.key, "us": e.device_time_total / steps, "launches": e.count / steps}
                    for e in gpu[:top]],
        "kernel_us": sum(e.device_time_total for e in gpu) / steps,
        "host_ops": [{"name": e.key, "self_us": e.self_cpu_time_total / steps, "calls": e.count / steps}
                     for e in host[:top]],
        "host_us": sum(e.self_cpu_time_total for e in host) / steps,
        "python": [{"name": f"{name} ({'/'.join(file.rsplit('/', 2)[-2:]) if file != '~' else 'builtin'}:{line})",
                    "self_us": v[2] * 1e6 / steps, "calls": v[1] / steps}
                   for (file, line, name), v in by_self[:top]],
        "python_us": sum(v[2] for v in functions.values()) * 1e6 / steps,
    }
