"""The torch profiler inside a vLLM worker process, injected as vLLM's `worker_extension_cls` by `sk profile`.

`LLM.collective_rpc("sk_profile_start")` starts torch.profiler in the worker (the process that runs the model's
kernels) and counts the engine steps it executes; `sk_profile_stop` stops it and returns the trace's summary
(sk.workflow.kernel_profile), and keeps the trace's device events where asked. CUDA: the device's kernels, CUDA
graph replays included; CPU: the CPU ops.

`sk_graph_replay(batch_size)` times the worker's captured FULL CUDA graph of a decode batch, replayed back to back
with CUDA events: the model's forward on the GPU with neither the host's step loop nor a profiler in it (a
profiler's per-kernel records change the gaps between a graph's kernels, and its host overhead hides what the
step loop costs; results/h200/engines/README.md, 2026-12-06, late evening). `sk_graph_clocks(batch_size)` replays
it for about a second while NVML samples the card's SM clock, power draw and clock-limit reasons: the same GEMMs
running longer beside other kernels (results/h100/engines/README.md, 2026-12-07) may be running at a lower clock.

While profiling, `HostTimes` also records the host's side of the batch in that process: each engine step's
`execute_model` call (the host preparing and launching the step), the garbage collector's pauses, and the writes
of our adapter report (`sk.reports`, a thread that holds the GIL while it builds the report), and what PyTorch's
CUDA caching allocator did in the batch (device allocations and frees, retries after a failed allocation, syncs of
all streams: a `cudaFree` waits for the whole device, a host stall with no GPU time in it): the pauses that make a
step's window longer than its GPU time show up there, whichever code made them.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import time

import torch

from sk.workflow.kernel_profile import rank_path, summarize_trace

GRAPH_REPLAYS = 50
GRAPH_WARMUP_REPLAYS = 5


def decode_graphs(model_runner, batch_size: int) -> list:
    """The FULL CUDA graphs `model_runner` captured for a decode batch of `batch_size` requests (one new token
    each): vLLM's model runner V2 keeps them in `cudagraph_manager.graphs` (its default for dense models), V1 in
    the CUDAGraphWrapper around the model. Empty where none was captured (eager mode, the CPU engine)."""
    manager = getattr(model_runner, "cudagraph_manager", None)
    graphs = getattr(manager, "graphs", None)
    if isinstance(graphs, dict):
        full = [(desc, graph) for desc, graph in graphs.items()
                if desc.cg_mode.name == "FULL" and desc.num_tokens == batch_size and desc.num_reqs == batch_size
                and not getattr(desc, "num_active_loras", 0)]
        decode = [graph for desc, graph in full if desc.uniform_token_count == 1]  # the separate decode routine's
        return decode or [graph for desc, graph in full if desc.uniform_token_count is None]
    wrapper = getattr(getattr(model_runner, "model", None), "cudagraph_wrapper", None)
    if wrapper is None or wrapper.runtime_mode.name != "FULL":
        return []
    return [entry.cudagraph for key, entry in wrapper.concrete_cudagraph_entries.items()
            if key.num_tokens == batch_size and key.num_reqs in (None, batch_size) and key.uniform
            and entry.cudagraph is not None]


def replay_median_us(graph, replays: int = GRAPH_REPLAYS, warmup: int = GRAPH_WARMUP_REPLAYS) -> float:
    """Median µs of one replay of `graph`, each between two CUDA events, back to back on the current stream."""
    for _ in range(warmup):
        graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in events)


# torch.cuda.memory_stats() counters HostTimes reports the change of, by the names its summary gives them.
ALLOCATOR_COUNTERS = {"device_allocs": "num_device_alloc", "device_frees": "num_device_free",
                      "alloc_retries": "num_alloc_retries", "syncs_all_streams": "num_sync_all_streams"}


# NVML's clock-event (throttle) reason bits (nvml.h, nvmlClocksEventReason*), by the names sk profile gives them.
CLOCK_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
                 0x100: "display_clocks"}
CLOCK_SAMPLE_S = 0.01


def _nvml_device():
    """(pynvml, handle) of the current CUDA device, found by its UUID (CUDA_VISIBLE_DEVICES renumbers cards);
    (None, None) without pynvml (nvidia-ml-py, or the copy vLLM carries) or where NVML cannot answer."""
    try:
        import pynvml
    except ImportError:
        try:
            from vllm.third_party import pynvml
        except ImportError:
            return None, None
    uuid = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", ""))
    try:
        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except pynvml.NVMLError:
        return None, None


def clocks_under(graph, seconds: float = 1.0) -> dict | None:
    """The card's state while `graph` replays back to back for about `seconds`, sampled by NVML every
    CLOCK_SAMPLE_S from the host (the replays are queued first): SM clock (MHz, median and lowest), power draw
    (W, median; NVML's own averaging) and every clock-limit reason seen. None where NVML cannot be asked."""
    nvml, handle = _nvml_device()
    if handle is None:
        return None
    replays = max(1, round(seconds * 1e6 / replay_median_us(graph, replays=3, warmup=1)))
    reasons_of = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    torch.cuda.synchronize()
    for _ in range(replays):
        graph.replay()
    done = torch.cuda.Event()
    done.record()
    sm, power, reasons = [], [], 0
    while not done.query():
        sm.append(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        power.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1e3)
        reasons |= reasons_of(handle)
        time.sleep(CLOCK_SAMPLE_S)
    torch.cuda.synchronize()
    if not sm:
        return None
    return {"replays": replays, "samples": len(sm), "sm_mhz_median": statistics.median(sm), "sm_mhz_min": min(sm),
            "power_w_median": statistics.median(power),
            "clock_limits": [name for bit, name in CLOCK_REASONS.items() if reasons & bit]}


class HostTimes:
    """The host's side of a profiled batch (module docstring): `step(seconds)` per engine step, the collector's
    pauses through `gc.callbacks` and the caching allocator's counters (`memory_stats`, default
    `torch.cuda.memory_stats` where CUDA is up, else none) from `start()` to `stop()`, and `summary()`."""

    def __init__(self, memory_stats=None) -> None:
        self.steps_ms: list[float] = []
        self.gc_pauses: list[tuple[int, float]] = []  # (generation, ms)
        self._gc_started: float | None = None
        self.window: tuple[float, float | None] = (time.perf_counter(), None)
        if memory_stats is None and torch.cuda.is_available() and torch.cuda.is_initialized():
            memory_stats = torch.cuda.memory_stats
        self._memory_stats = memory_stats
        self._allocator: list[dict] = []  # the counters at start and at stop

    def _on_gc(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._gc_started = now
        elif self._gc_started is not None:
            self.gc_pauses.append((info.get("generation", -1), (now - self._gc_started) * 1e3))
            self._gc_started = None

    def _count_allocator(self) -> None:
        if self._memory_stats is not None:
            stats = self._memory_stats()
            self._allocator.append({name: stats.get(key, 0) for name, key in ALLOCATOR_COUNTERS.items()})

    def start(self) -> "HostTimes":
        self._count_allocator()
        gc.callbacks.append(self._on_gc)
        return self

    def step(self, seconds: float) -> None:
        self.steps_ms.append(seconds * 1e3)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self.window = (self.window[0], time.perf_counter())
        self._count_allocator()

    def summary(self, writes: list[tuple[float, float]] | None = None) -> dict:
        """ms: each step's host time, the window, the collector's pauses (count, total, longest, per generation)
        and the report writes inside the window (`writes`: (start, seconds) each; default this process's,
        `sk.reports.write_intervals()`); `allocator`: the allocator's counters' change from start to stop (None
        without CUDA, or before stop)."""
        from sk import reports

        start, end = self.window
        end = time.perf_counter() if end is None else end
        writes = reports.write_intervals() if writes is None else writes
        writes = [s * 1e3 for t, s in writes if start <= t <= end]
        generations: dict[str, int] = {}
        for generation, _ in self.gc_pauses:
            generations[str(generation)] = generations.get(str(generation), 0) + 1
        pauses = [ms for _, ms in self.gc_pauses]
        return {"window_ms": (end - start) * 1e3,
                "step_ms": [round(ms, 3) for ms in self.steps_ms],
                "median_step_ms": statistics.median(self.steps_ms) if self.steps_ms else None,
                "gc": {"count": len(pauses), "total_ms": sum(pauses), "max_ms": max(pauses, default=0.0),
                       "generations": generations},
                "report_writes": {"count": len(writes), "total_ms": sum(writes), "max_ms": max(writes, default=0.0)},
                "allocator": ({name: self._allocator[1][name] - self._allocator[0][name] for name in ALLOCATOR_COUNTERS}
                              if len(self._allocator) == 2 else None)}


class StepProfiler:
    """Methods mixed into the vLLM worker, called through LLM.collective_rpc."""

    def sk_profile_start(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CUDA if torch.cuda.is_available()
                      else torch.profiler.ProfilerActivity.CPU]
        self._sk_host = host = HostTimes().start()
        execute_model = type(self).execute_model

        def counted(*args, **kwargs):
            started = time.perf_counter()
            output = execute_model(self, *args, **kwargs)
            scheduled = getattr(args[0] if args else None, "total_num_scheduled_tokens", 1)
            if scheduled:  # steps that ran the model, not empty scheduler ticks
                host.step(time.perf_counter() - started)
            return output

        self.execute_model = counted  # an instance attribute: the executor's calls by name find it first
        self._sk_profiler = torch.profiler.profile(activities=activities)
        self._sk_profiler.__enter__()

    def sk_profile_stop(self, keep: str | None = None) -> dict:
        """The summary; `keep`: a path for the trace's device events, "{rank}" in it this worker's rank."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._sk_profiler.__exit__(None, None, None)
        self._sk_host.stop()
        del self.execute_model
        fd, path = tempfile.mkstemp(prefix="sk-profile-", suffix=".json")
        os.close(fd)
        try:
            self._sk_profiler.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        finally:
            os.unlink(path)
        summary = summarize_trace(trace, steps=len(self._sk_host.steps_ms), device="cuda" if torch.cuda.is_available() else "cpu",
                                  keep=keep and rank_path(keep, getattr(self, "rank", 0)))
        return {**summary, "host": self._sk_host.summary()}

    def _sk_decode_graph(self, batch_size: int):
        """The one FULL CUDA graph of a `batch_size` decode batch (`decode_graphs`), or None."""
        graphs = decode_graphs(getattr(self, "model_runner", None), batch_size) if torch.cuda.is_available() else []
        return graphs[0] if len(graphs) == 1 else None

    def sk_graph_replay(self, batch_size: int, replays: int = GRAPH_REPLAYS) -> float | None:
        """Median µs of one replay of the FULL CUDA graph of a `batch_size` decode batch; None where there is none.
        Call it between batches: a replay reruns the last step's inputs (its KV-cache writes land in slots that
        step held)."""
        graph = self._sk_decode_graph(batch_size)
        if graph is None:
            return None
        torch.cuda.synchronize()
        return replay_median_us(graph, replays)

    def sk_graph_clocks(self, batch_size: int) -> dict | None:
        """`clocks_under` the FULL CUDA graph of a `batch_size` decode batch; None where there is none (as
        `sk_graph_replay`) or no NVML."""
        graph = self._sk_decode_graph(batch_size)
        return None if graph is None else clocks_under(graph)
