"""`sk bench --target OP [--self-test]`: the candidate against the baseline on every shape the engine ran.

For each distinct (constructor arguments, forward inputs) in the captures: build both modules with those
arguments (the candidate gets the baseline's parameters), make inputs with the captured shapes, dtypes and
strides, check the candidate's outputs (and any inputs it updates in place) against the baseline's, and time
both. On a GPU each call is timed inside a CUDA graph (sk.bench.timing); on a CPU with torch.utils.benchmark,
and the report says these are CPU timings. Totals weight each shape by how often the engine called it.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from sk.workflow.candidates import load_candidate
from sk.workflow.capture import load_captures
from sk.workflow.errors import WorkflowError
from sk.workflow.operators import Operator, operator

# Elementwise tolerance per output dtype (rtol = atol). Two correct implementations that compute in fp32 and
# round the output once differ by at most one rounding of the output: 2^-8 (bf16), 2^-11 (fp16), with 2x
# headroom. In fp32 they differ by the order of accumulation in reductions: ~1e-6 for rows of a few thousand.
TOLERANCE = {torch.bfloat16: 2 * 2 ** -8, torch.float16: 2 * 2 ** -11, torch.float32: 1e-5, torch.float64: 1e-12}

CPU_ROUNDS, CPU_CALLS_PER_ROUND = 7, 20


@dataclasses.dataclass
class Case:
    init: dict
    inputs: list
    count: int


def collect_cases(captures: list[dict], op: Operator) -> list[Case]:
    """The distinct calls of `op` over all captures, most frequent first."""
    cases: dict[str, Case] = {}
    for capture in captures:
        for entry in capture["operators"]:
            if entry["op"] != op.name:
                continue
            key = json.dumps([entry["init"], entry["inputs"]], sort_keys=True)
            case = cases.setdefault(key, Case(entry["init"], entry["inputs"], 0))
            case.count += entry["count"]
    if not cases:
        seen = sorted({e["op"] for c in captures for e in c["operators"]})
        raise WorkflowError(f"the captures hold no call of {op.name} (they hold: {', '.join(seen)})")
    return sorted(cases.values(), key=lambda c: -c.count)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def make_module(cls: type, init: dict, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """The module built with the captured arguments; its parameters in the inputs' dtype, as the engine has them
    (vLLM builds layers under the model's default dtype)."""
    kwargs = {k: _dtype(v) if k == "dtype" and isinstance(v, str) else v for k, v in init.items()}
    return cls(**kwargs).to(device=device, dtype=dtype)


def make_input(desc, init: dict, device: str, gen: torch.Generator):
    if not isinstance(desc, dict) or "shape" not in desc:
        return desc  # a plain value (None, a number) is passed as captured
    dtype = _dtype(desc["dtype"])
    t = torch.empty_strided(desc["shape"], desc["stride"], dtype=dtype, device=device)
    if dtype.is_floating_point:
        t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32).to(dtype))
    else:  # integer inputs are indices (positions): keep them inside the table the operator owns
        t.copy_(torch.randint(0, init.get("max_position_embeddings", 1024), t.shape, generator=gen))
    return t


def _clone(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device).copy_(value)
    return value


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def max_error(expected, got) -> tuple[bool, float]:
    """(within tolerance, largest error relative to the tolerance's scale) over every tensor of the outputs."""
    expected, got = _tensors(expected), _tensors(got)
    if len(expected) != len(got):
        return False, float("inf")
    ok, worst = True, 0.0
    for e, g in zip(expected, got):
        if e.shape != g.shape or e.dtype != g.dtype:
            return False, float("inf")
        tol = TOLERANCE.get(e.dtype, 0.0)
        diff = (g.double() - e.double()).abs()
        ok &= bool((diff <= tol + tol * e.double().abs()).all())
        worst = max(worst, float((diff / (1 + e.double().abs())).max()) if diff.numel() else 0.0)
    return ok, worst


def time_us(fns: dict, device: str) -> dict[str, float]:
    if device == "cuda":
        from sk.bench.timing import side_by_side_us

        return side_by_side_us(fns)
    from torch.utils.benchmark import Timer

    # Interleaved rounds, best round kept: on a shared CPU, interference only ever adds time.
    timers = {name: Timer("fn()", globals={"fn": fn}) for name, fn in fns.items()}
    best = {name: float("inf") for name in fns}
    for _ in range(CPU_ROUNDS):
        for name, timer in timers.items():
            best[name] = min(best[name], timer.timeit(CPU_CALLS_PER_ROUND).mean * 1e6)
    return best


def run(target: str, capture_dir: Path, candidate_dir: Path, self_test: bool, console: Console,
        max_shapes: int | None = None) -> bool:
    op = operator(target)
    if op.baseline is None:
        raise WorkflowError(f"{op.name} has no baseline operator yet (sk.workflow.baseline_ops): nothing to bench")
    cases = collect_cases(load_captures(capture_dir), op)[:max_shapes]
    candidate_cls = op.baseline if self_test else load_candidate(op, candidate_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    detail = Table(title=f"{op.name}: {'baseline vs itself (self-test)' if self_test else 'baseline vs candidate'}"
                         f" on {len(cases)} captured shapes", title_justify="left")
    for column in ("INPUTS", "CALLS", "CORRECT", "MAX ERR", "BASELINE µs", "CANDIDATE µs", "SPEEDUP"):
        detail.add_column(column, justify="left" if column == "INPUTS" else "right")
    failures, base_total, cand_total = 0, 0.0, 0.0
    for case in cases:
        dtype = next(_dtype(d["dtype"]) for d in case.inputs
                     if isinstance(d, dict) and _dtype(d.get("dtype", "int64")).is_floating_point)
        baseline = make_module(op.baseline, case.init, device, dtype)
        candidate = make_module(candidate_cls, case.init, device, dtype)
        with torch.no_grad():
            for p in baseline.parameters():
                p.copy_(p + 0.1 * torch.randn(p.shape, generator=gen).to(p))  # non-trivial weights
        candidate.load_state_dict(baseline.state_dict())
        inputs = [make_input(d, case.init, device, gen) for d in case.inputs]
        base_args, cand_args = [_clone(a) for a in inputs], [_clone(a) for a in inputs]
        with torch.no_grad():
            expected, got = baseline(*base_args), candidate(*cand_args)
            # In-place updates count as outputs: compare the inputs after the call too.
            ok, err = max_error([expected, base_args], [got, cand_args])
            times = time_us({"baseline": lambda: baseline(*base_args), "candidate": lambda: candidate(*cand_args)},
                            device)
        failures += not ok
        base_total += case.count * times["baseline"]
        cand_total += case.count * times["candidate"]
        shapes = " ".join("x".join(map(str, d["shape"])) + f" {d['dtype']}" if isinstance(d, dict) else repr(d)
                          for d in case.inputs)
        detail.add_row(shapes, str(case.count), "OK" if ok else "[red]FAIL", f"{err:.1e}",
                       f"{times['baseline']:.1f}", f"{times['candidate']:.1f}",
                       f"{times['baseline'] / times['candidate']:.2f}x")
    console.print(detail)
    summary = Table(title="totals weighted by calls in the captures", title_justify="left")
    for column in ("OP", "SHAPES", "CORRECT", "BASELINE µs", "CANDIDATE µs", "SPEEDUP"):
        summary.add_column(column, justify="left" if column == "OP" else "right")
    summary.add_row(op.name, str(len(cases)), "OK" if not failures else f"[red]FAIL ({failures})",
                    f"{base_total:,.0f}", f"{cand_total:,.0f}", f"{base_total / cand_total:.2f}x")
    console.print(summary)
    if device == "cpu":
        console.print("[yellow]CPU timings (no GPU here): they say nothing about GPU kernel times; the correctness "
                      "column is what this run proves.")
    return failures == 0
