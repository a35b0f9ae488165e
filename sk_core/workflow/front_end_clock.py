"""Where a timed vLLM batch's wall time goes in the process that calls `LLM.generate` (vLLM's front end).

vLLM's engine core runs the model in its own process and streams each step's outputs to the front end, which
processes them (detokenizing, stop checks, output objects) in Python. When the front end falls behind, the GPU
finishes and sits idle while the front end catches up, and that tail lands in the batch's time: on the H200 the
8B throughput batches had 4.4 s of GPU work and 0.9-3.9 s of idle GPU at their end (results/h200/engines/README.md,
2026-12-03). This clock times, per batch: the waits for the engine core's outputs, their processing, Python's
garbage collections, and how long after the engine core sent it the last output was read (`lag_s`).
"""
from __future__ import annotations

import contextlib
import gc
import time


@contextlib.contextmanager
def front_end_clock(llm_engine):
    """Times the front end of `llm_engine` (vLLM's LLMEngine) while the block runs; yields the dict it fills:
    {"steps", "wait_s", "process_s", "gc_s", "gc_collections", "last_output_s", "lag_s"} (seconds from entering
    the block; "last_output_s"/"lag_s" None when no output arrived). An engine without the parts timed here (a
    vLLM that names them otherwise) yields {"unavailable": reason} and is left as it is."""
    core = getattr(llm_engine, "engine_core", None)
    processor = getattr(llm_engine, "output_processor", None)
    if core is None or not hasattr(core, "get_output") or processor is None or not hasattr(processor,
                                                                                            "process_outputs"):
        yield {"unavailable": f"{type(llm_engine).__name__} has no engine_core.get_output/output_processor."
                              "process_outputs"}
        return
    stats = {"steps": 0, "wait_s": 0.0, "process_s": 0.0, "gc_s": 0.0, "gc_collections": 0, "last_output_s": None,
             "lag_s": None}
    start = time.perf_counter()
    get_output, process_outputs = core.get_output, processor.process_outputs
    gc_started = []

    def timed_get_output(*args, **kwargs):
        begun = time.perf_counter()
        outputs = get_output(*args, **kwargs)
        now = time.perf_counter()
        stats["wait_s"] += now - begun
        stats["steps"] += 1
        if getattr(outputs, "outputs", None):
            stats["last_output_s"] = now - start
            sent = getattr(outputs, "timestamp", None)  # the engine core's time.monotonic() when it sent them
            stats["lag_s"] = time.monotonic() - sent if sent else None
        return outputs

    def timed_process_outputs(*args, **kwargs):
        begun = time.perf_counter()
        try:
            return process_outputs(*args, **kwargs)
        finally:
            stats["process_s"] += time.perf_counter() - begun

    def on_gc(phase, info):
        if phase == "start":
            gc_started.append(time.perf_counter())
        elif gc_started:
            stats["gc_s"] += time.perf_counter() - gc_started.pop()
            stats["gc_collections"] += 1

    try:
        core.get_output, processor.process_outputs = timed_get_output, timed_process_outputs
    except AttributeError as error:  # objects with __slots__
        if "get_output" in vars(core):
            del vars(core)["get_output"]
        yield {"unavailable": f"cannot time vLLM's front end: {error}"}
        return
    gc.callbacks.append(on_gc)
    try:
        yield stats
    finally:
        gc.callbacks.remove(on_gc)
        # The instance attributes set above hid the class's methods: removing them restores those.
        for obj, name, original in ((core, "get_output", get_output),
                                    (processor, "process_outputs", process_outputs)):
            if name in vars(obj):
                del vars(obj)[name]
            if getattr(obj, name) != original:
                setattr(obj, name, original)
        for key in ("wait_s", "process_s", "gc_s", "last_output_s", "lag_s"):
            if stats[key] is not None:
                stats[key] = round(stats[key], 4)
