"""Where a step's time goes: device kernels from a torch profiler trace, classified by name, summed per class.

Functions on the trace's JSON (Chrome trace format, as `torch.profiler.profile.export_chrome_trace` and SGLang's
profiler write it): `classify(name)` puts a kernel in one of CLASSES by its name, `summarize_trace` sums device
time per class, the idle gaps between kernels, and kernels per engine step, and where asked writes the device
events to a gzipped trace file (`sk profile`'s traces/). On a GPU the events are the device's kernels (category
"kernel"), each counted for the time no earlier kernel runs (`exclusive_us`); on a CPU engine they are the CPU
ops (category "cpu_op"), each counted for its exclusive time, labelled as CPU.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

CLASSES = ("gemm", "attention", "norm", "activation", "rotary/kv-cache", "sampling", "other")

# (class, name fragments), first match wins. The order settles names with two fragments: FlashInfer's norm,
# sampling and rotary kernels say "flashinfer"; FlashAttention-3's say "cutlass"; CUTLASS GEMMs with a fused
# epilogue say "relu"; Inductor's fused kernels say what they fuse ("triton_red_fused_..._rsqrt" is a norm).
_RULES: list[tuple[str, tuple[str, ...]]] = [
    ("rotary/kv-cache", ("rotary", "rope", "reshape_and_cache", "concat_and_cache", "cache_kernel", "store_kv",
                         "set_kv_buffer", "kv_cache_update", "copy_blocks", "swap_blocks")),
    ("norm", ("rms_norm", "rmsnorm", "layernorm", "layer_norm", "norm_kernel", "ln_stats", "rsqrt", "batch_norm",
              "group_norm")),
    ("sampling", ("sampling", "sampler", "gumbel", "multinomial", "top_k", "topk", "top_p", "topp", "min_p",
                  "penalt")),
    ("attention", ("flash::", "flash_fwd", "flash_bwd", "flashattn", "fmha", "attn", "attention", "paged", "mla_",
                   "merge_state", "xformers", "sdpa", "prefill", "withkvcache", "cascade", "_fwd_kernel")),
    ("gemm", ("gemm", "gemv", "matmul", "cutlass", "xmma", "nvjet", "cublas", "wgmma", "sm90_", "sm80_",
              "sm100_", "ampere_", "hopper", "splitk", "aten::mm", "aten::addmm", "aten::bmm", "aten::linear",
              "onednn", "dnnl", "mkl", "brgemm", "triton_tem_", "_mm_", "gate_up_kernel", "down_kernel")),
    ("activation", ("act_and_mul", "silu", "gelu", "swiglu", "geglu", "activation", "relu", "sigmoid", "tanh")),
    ("sampling", ("softmax", "argmax", "argsort", "radixsort", "sort", "cumsum", "exponential")),
]


def classify(name: str) -> str:
    """The class of a kernel (or, on CPU, an op) from its name; "other" when no rule matches."""
    lowered = name.lower()
    for cls, fragments in _RULES:
        if any(f in lowered for f in fragments):
            return cls
    return "other"


def rank_path(template: str, rank: int) -> str:
    """A kept trace's path for one rank: `template` with "{rank}" in it (as `sk profile` names the files)."""
    return template.replace("{rank}", str(rank))


def _write_events(events: list[dict], path: str | Path) -> None:
    """Device events (`device_events`) as a gzipped Chrome trace: what `summarize_trace` reads, small enough to
    keep beside the results, and opened by Perfetto."""
    fields = ("ph", "cat", "name", "ts", "dur", "pid", "tid")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": [{k: e[k] for k in fields if k in e} for e in events]}, f)


def load_trace(path: str | Path) -> dict:
    """A Chrome trace file (.json or .json.gz)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _events(trace: dict | list) -> list[dict]:
    return trace.get("traceEvents", []) if isinstance(trace, dict) else trace


def device_events(trace: dict | list) -> tuple[str, list[dict]]:
    """("cuda", the GPU kernels, each with "self": its time that no earlier kernel overlaps, `exclusive_us`) when
    the trace has any, else ("cpu", every CPU op with its exclusive time, "self": its duration less its
    children's on the same thread, so that nested ops are not counted twice)."""
    complete = [e for e in _events(trace) if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in complete if e.get("cat") == "kernel"]
    if kernels:
        return "cuda", exclusive_us(kernels)
    ops = sorted((dict(e) for e in complete if e.get("cat") == "cpu_op"),
                 key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    stack: list[dict] = []
    for e in ops:
        e["self"] = e["dur"]
        while stack and ((stack[-1]["pid"], stack[-1]["tid"]) != (e["pid"], e["tid"])
                         or e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]):
            stack.pop()
        if stack:
            stack[-1]["self"] -= e["dur"]
        stack.append(e)
    return "cpu", ops


# A kernel vLLM's model runner V2 launches once per engine step, outside the CUDA graphs (0.25.0).
VLLM_STEP_MARKER = "_compute_slot_mappings_kernel"


def step_windows(trace: dict | list, marker: str = VLLM_STEP_MARKER) -> list[dict]:
    """Per engine step of a kept GPU trace, split where the kernel `marker` (once per step) begins: "window_us"
    (from its start to the next step's), "busy_us" (its kernels' time, overlaps once), "kernels". A step whose
    window exceeds its busy time waited on the host; set two runs' steps side by side to see which steps, not
    only how much, a variant's time grew in (results/h100/engines/README.md, 2026-12-07)."""
    _, kernels = device_events(trace)
    starts = [i for i, e in enumerate(kernels) if e["name"].startswith(marker)]
    steps = []
    for first, following in zip(starts, [*starts[1:], None]):
        span = kernels[first:following]
        end = kernels[following]["ts"] if following is not None else max(e["ts"] + e["dur"] for e in span)
        steps.append({"window_us": end - span[0]["ts"], "busy_us": sum(e["self"] for e in span),
                      "kernels": len(span)})
    return steps


def _in_start_order(events: list[dict]):
    """(event, the latest end of the events before it: the first one's start for the first), the events in start
    order (the longer first where two start together): one sweep for what overlaps (`exclusive_us`) and what is
    idle (`idle_gaps_us`)."""
    ordered = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    end = ordered[0]["ts"] if ordered else 0.0
    for e in ordered:
        yield e, end
        end = max(end, e["ts"] + e["dur"])


def exclusive_us(kernels: list[dict]) -> list[dict]:
    """The kernels in start order, each with "self": the part of its duration when no earlier kernel runs.
    Kernels overlap where a dependent launch (PDL) starts before its predecessor ends and waits for it, or on two
    streams; summed whole they would count that time twice (a step's GPU time above its wall time). Counted this
    way the kernels sum to the time the GPU runs any, and a waiting kernel's wait goes to the one it waits on."""
    return [dict(e, self=max(0.0, e["ts"] + e["dur"] - max(e["ts"], end))) for e, end in _in_start_order(kernels)]


def idle_gaps_us(events: list[dict]) -> float:
    """The time between the first event's start and the last one's end when no event runs."""
    return sum(max(0.0, e["ts"] - end) for e, end in _in_start_order(events))


def summarize_trace(trace: dict | list, *, steps: int | None, device: str | None = None,
                    keep: str | Path | None = None) -> dict:
    """Per class: device time (µs), share of the classified time, event count; plus idle gaps and kernels per
    step. `steps`: engine steps inside the trace (None when unknown). `keep`: a path where the trace's device
    events (the GPU kernels, else the CPU ops) are written as a gzipped Chrome trace, which sums to the same."""
    found, events = device_events(trace)
    if keep:
        _write_events(events, keep)
    classes = {cls: {"us": 0.0, "count": 0} for cls in CLASSES}
    names: dict[str, dict] = {}
    for e in events:
        cls, us = classify(e["name"]), e.get("self", e["dur"])
        classes[cls]["us"] += us
        classes[cls]["count"] += 1
        n = names.setdefault(e["name"], {"class": cls, "us": 0.0, "count": 0})
        n["us"] += us
        n["count"] += 1
    busy = sum(c["us"] for c in classes.values())
    overlapped = sum(e["dur"] for e in events) - busy if found == "cuda" else 0.0
    for c in classes.values():
        c["share"] = c["us"] / busy if busy else 0.0
    window = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) if events else 0.0
    top = sorted(names.items(), key=lambda kv: -kv[1]["us"])[:15]
    return {"device": device or found, "events_from": found, "kernels": len(events), "steps": steps,
            "kernels_per_step": len(events) / steps if steps else None, "busy_us": busy,
            "idle_gap_us": idle_gaps_us(events), "window_us": window, "overlapped_us": overlapped, "classes": classes,
            "top_kernels": [{"name": k[:200], **v} for k, v in top]}
