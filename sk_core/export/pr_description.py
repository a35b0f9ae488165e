"""The pull-request description of a series (its cover letter), with the parity and benchmark tables taken from
our committed results under `results/` at export time."""
from __future__ import annotations

import re
from pathlib import Path

_LAYERS = {
    "vllm": {
        "rms_norm": "`RMSNorm` (`vllm.ir.ops.rms_norm`, provider `standard_kernels`)",
        "fused_add_rms_norm": "`RMSNorm` with residual (`vllm.ir.ops.fused_add_rms_norm`, in place)",
        "gemma_rms_norm": "`GemmaRMSNorm` (plain and with residual)",
        "silu_and_mul": "`SiluAndMul`",
        "gelu_and_mul": "`GeluAndMul` (erf and tanh)",
    },
    "sglang": {
        "rms_norm": "`RMSNorm`",
        "fused_add_rms_norm": "`RMSNorm` with residual (in place, as `forward_cuda`)",
        "gemma_rms_norm": "`GemmaRMSNorm` (plain and with residual)",
        "silu_and_mul": "`SiluAndMul`",
        "gelu_and_mul": "`GeluAndMul` (tanh and erf)",
    },
}


def result_tables(results: Path, ops: tuple[str, ...], engine: str) -> list[tuple[str, str]]:
    """(path, text) of each Markdown result that names one of `ops` or sits under a path naming `engine`
    (e.g. the adapter's parity and throughput runs); other results are about other ops and stay out."""
    names = re.compile(r"\b(" + "|".join(map(re.escape, ops)) + r")\b")
    matching = []
    for md in sorted(results.rglob("*.md")) if results.is_dir() else []:
        rel = md.relative_to(results.parent).as_posix()
        text = md.read_text()
        if names.search(text) or engine in rel.lower():
            matching.append((rel, text))
    return matching


def render(engine: str, target: str, ops: tuple[str, ...], switch: str, results: Path, patches: list[str]) -> str:
    rows = "\n".join(f"| `{op}` | {_LAYERS[engine][op]} |" for op in ops)
    matching = result_tables(results, ops, engine)
    if matching:
        tables = "\n\n".join(f"From `{path}`:\n\n{text.strip()}" for path, text in matching)
    else:
        tables = (f"No committed Standard Kernels results cover these ops or {engine} yet. The H200 check in "
                  "Standard Kernels' upstream_patches/README.md produces the parity and throughput numbers for "
                  "this series; re-export afterwards to include them here.")
    return f"""# Standard Kernels' Triton kernels for {engine}: {", ".join(ops)}

Target: {target}

## Motivation

RMSNorm and the gated activations are memory-bound: their time is the time to read and write the activations
once. These kernels do one pass per row (the residual add fused into the norm), compute in fp32 and round once,
and run unchanged under CUDA graphs and torch.compile (they are opaque torch custom ops, with no host
synchronisation and no persistent buffers). They are generated from Standard Kernels' sources, where each op
is tested against an fp64 reference and benchmarked against the engine's own kernels.

Opt-in: `{switch}=1`. Without it the engine runs exactly as before.

## Ops

| op | used by |
|---|---|
{rows}

## Parity and benchmarks

{tables}

## How to reproduce

CPU (Triton interpreter): apply the series to the sources and run the test it adds with `TRITON_INTERPRET=1`;
Standard Kernels' `tests/export/` does that and compares greedy fp32 tokens of the patched engine with stock on
small models. GPU: see the H200 commands in Standard Kernels' `upstream_patches/README.md`.

## Patches

""" + "\n".join(f"- {p}" for p in patches) + "\n"
