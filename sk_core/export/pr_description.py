"""The pull-request description of a series (its cover letter), with the parity and benchmark tables taken from
named files of our committed results under `results/` at export time (`RESULT_FILES`)."""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

_LAYERS = {
    "vllm": {
        "rms_norm": "`RMSNorm` (`vllm.ir.ops.rms_norm`, provider `standard_kernels`)",
        "fused_add_rms_norm": "`RMSNorm` with residual (`vllm.ir.ops.fused_add_rms_norm`, in place)",
        "gemma_rms_norm": "`GemmaRMSNorm` (plain and with residual)",
        "silu_and_mul": "`SiluAndMul`",
        "gelu_and_mul": "`GeluAndMul` (erf and tanh)",
        "fused_gated_mlp": "`LlamaDecoderLayer`: post-attention `RMSNorm` + `LlamaMLP` in one call",
    },
    "sglang": {
        "rms_norm": "`RMSNorm`",
        "fused_add_rms_norm": "`RMSNorm` with residual (in place, as `forward_cuda`)",
        "gemma_rms_norm": "`GemmaRMSNorm` (plain and with residual)",
        "silu_and_mul": "`SiluAndMul`",
        "gelu_and_mul": "`GeluAndMul` (tanh and erf)",
        "fused_gated_mlp": "`LlamaDecoderLayer`: post-attention `RMSNorm` + `LlamaMLP` in one call",
    },
}


# The committed results each engine's description quotes, in this order, as paths under the results folder:
# the engines area's summary, then the engine's own parity and throughput tables (newest first), then the
# per-op benchmarks of the exported ops (the gated MLP's, then the norms' and activations'). Named, not globbed: a note added under results/ changes no export,
# and a file named here that has moved stops the export until this list follows it.
_OPS_RESULTS = ("h200/gated_mlp/README.md", "h200/ops/README.md", "h200/ops/ops_peers.md")
RESULT_FILES: dict[str, tuple[str, ...]] = {
    "vllm": (
        "h200/engines/README.md",
        "h200/engines/2026-12-05/vllm-export-fused/export_check.md",
        "h200/engines/2026-11-30/second-run/vllm_tp2_trained_llama.md",
        "h200/engines/2026-11-30/second-run/vllm_trained.md",
        "h200/engines/2026-11-30/second-run/vllm_llama.md",
        "h200/engines/2026-11-30/second-run/vllm_llama_export.md",
        "h200/engines/2026-11-30/tp2_vllm_check.md",
        "h200/engines/vllm_llama.md",
        "h200/engines/vllm_gemma.md",
        *_OPS_RESULTS,
    ),
    "sglang": (
        "h200/engines/README.md",
        "h200/engines/2026-12-05/sglang-export-fused/export_check.md",
        "h200/engines/2026-11-30/second-run/sglang_trained.md",
        "h200/engines/2026-11-30/second-run/sglang_llama.md",
        "h200/engines/2026-11-30/sglang_export_check.md",
        "h200/engines/2026-11-30/sglang_check.md",
        "h200/engines/sglang_check.md",
        *_OPS_RESULTS,
    ),
}


def result_tables(results: Path, engine: str) -> list[tuple[str, str]]:
    """(path as quoted, text) of each file `RESULT_FILES` names for `engine` (none for an engine it does not list),
    read from the `results` folder; FileNotFoundError names the first one missing there."""
    tables = []
    for name in RESULT_FILES.get(engine, ()):
        path = results / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: sk.export.pr_description.RESULT_FILES names it for the "
                                    f"{engine} description (moved? update the list)")
        tables.append((f"{results.name}/{name}", _rooted_links(path.read_text(), f"{results.name}/{name}")))
    return tables


_RELATIVE_LINK = re.compile(r"\]\((?![a-z]+:|#|/)([^)\s]+)\)")


def _rooted_links(text: str, quoted_path: str) -> str:
    """`text`'s relative Markdown links (relative to the quoted file, `quoted_path`) as paths from Standard Kernels'
    repository root, which is what a reader of the pull request can follow."""
    folder = posixpath.dirname(quoted_path)
    return _RELATIVE_LINK.sub(lambda m: f"]({posixpath.normpath(posixpath.join(folder, m.group(1)))})", text)


_FUSED_MLP_MOTIVATION = """

The fused gated MLP (`fused_gated_mlp`) takes a Llama decoder layer's post-attention RMSNorm (with the residual
add), gate/up projection, SiLU-and-mul and down projection. At decode sizes (up to 32 tokens; 8 for blocks larger
than d_model · d_ff = 2048 · 16384) it runs three Triton kernels instead of four: the add + RMSNorm; the gate/up
GEMM on the layer's merged weight as loaded (each tile reads the gate rows and the matching up rows), with the
activation in its epilogue; and the down GEMM with K split across programs, its kernels launched as programmatic
dependent launches on Hopper. The activation kernel, its launch and the intermediate's round trip go away. No
weight is copied: the engine's memory and KV cache are what they are without the series, and weights reloaded in
place are used as they are. Above decode sizes it runs the RMSNorm and act-and-mul kernels around the same torch
GEMMs the engine runs. The numbers below for the fused block were measured through Standard Kernels' adapter,
which runs these kernels at the same place in the decoder layer."""


def render(engine: str, target: str, ops: tuple[str, ...], switch: str, results: Path, patches: list[str]) -> str:
    rows = "\n".join(f"| `{op}` | {_LAYERS[engine][op]} |" for op in ops)
    fused_mlp = _FUSED_MLP_MOTIVATION if "fused_gated_mlp" in ops else ""
    quoted = result_tables(results, engine)
    if quoted:
        tables = "\n\n".join(f"From `{path}`:\n\n{text.strip()}" for path, text in quoted)
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
is tested against an fp64 reference and benchmarked against the engine's own kernels.{fused_mlp}

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
