"""The self-contained Triton module an exported series adds to an engine's tree, generated from our op files.

The kernels, their launch configurations and launch functions are copied out of `sk.ops` by name (their source
text, found with `ast`), so the upstreamed code is the code our tests and benchmarks run; only the thin layer of
torch custom ops around them is written here. The module imports torch and triton and nothing of ours.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSource:
    """Top-level definitions (functions or assignments, by name) copied from one of our op modules, in order."""

    module: str
    names: tuple[str, ...]


# The ops `--ops` may name, and the op family (kernel file) each one needs.
OP_FAMILIES = {
    "rms_norm": "rms_norm",
    "gemma_rms_norm": "rms_norm",
    "fused_add_rms_norm": "rms_norm",
    "silu_and_mul": "act_and_mul",
    "gelu_and_mul": "act_and_mul",
}
ALL_OPS = tuple(OP_FAMILIES)

# Shared helpers first, then each family's kernel, launch configuration and launcher.
COMMON = KernelSource("sk.ops._common", ("rows_view",))
FAMILIES = {
    "rms_norm": KernelSource("sk.ops.rms_norm", ("GEMMA_OFFSET", "_rms_norm_kernel", "_launch_config", "_launch")),
    "act_and_mul": KernelSource(
        "sk.ops.act_and_mul",
        ("_SQRT_HALF", "_SQRT_2_OVER_PI", "_erf", "activate", "_act_and_mul_kernel", "SMALL_PROBLEM", "LARGE_BLOCK",
         "launch_config", "_launch"),
    ),
}
# Names both families define: suffixed with the family in the generated module.
_CLASHING = ("_launch",)

# The custom ops around the launchers (the engine's op namespace is filled in). Each call counts a launch and
# logs the first one per kernel, so a test (or a user) can see the kernels ran inside the engine's workers.
_PREAMBLE = '''\
import collections
import logging
import math
import os

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)

# Kernel launches per op in this process: the test hook that shows the kernels ran.
LAUNCHES: collections.Counter = collections.Counter()


def _count_launch(op: str) -> None:
    if not LAUNCHES[op]:
        logger.info("Standard Kernels: first launch of the %s Triton kernel", op)
    LAUNCHES[op] += 1


# Read once, as Triton does; a constant also keeps `launchable` traceable by torch.compile.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def launchable(x: torch.Tensor) -> bool:
    """Whether these kernels can run on x's device: CUDA, or anywhere under Triton's interpreter (CPU CI)."""
    return x.is_cuda or _INTERPRETED
'''

_NORM_OPS = '''

@torch.library.custom_op("{ns}::standard_kernels_rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, epsilon: float, weight_offset: float) -> torch.Tensor:
    """x / sqrt(mean(x**2) + epsilon) * (weight + weight_offset); weight_offset = GEMMA_OFFSET for Gemma."""
    _count_launch("rms_norm")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch_rms_norm(rows_view(x), weight, y.view(-1, x.shape[-1]), epsilon, weight_offset)
    return y


@rms_norm.register_fake
def _(x, weight, epsilon, weight_offset):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("{ns}::standard_kernels_fused_add_rms_norm", mutates_args=())
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float, weight_offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Functional: returns (rms_norm(x + residual), x + residual), the sum rounded to x's dtype first."""
    _count_launch("fused_add_rms_norm")
    n = x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch_rms_norm(rows_view(x), weight, y.view(-1, n), epsilon, weight_offset, rows_view(residual),
                     residual_out.view(-1, n))
    return y, residual_out


@fused_add_rms_norm.register_fake
def _(x, residual, weight, epsilon, weight_offset):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("{ns}::standard_kernels_fused_add_rms_norm_", mutates_args=("x", "residual"))
def fused_add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float, weight_offset: float
) -> None:
    """In place: residual <- x + residual, then x <- rms_norm(residual)."""
    _count_launch("fused_add_rms_norm")
    x2, r2 = rows_view(x), rows_view(residual)
    # Each program reads its rows before writing them, so the outputs may alias the inputs.
    _launch_rms_norm(x2, weight, x2, epsilon, weight_offset, r2, r2)
    if x2.data_ptr() != x.data_ptr():
        x.copy_(x2.view(x.shape))
    if r2.data_ptr() != residual.data_ptr():
        residual.copy_(r2.view(residual.shape))
'''

_ACT_OPS = '''

@torch.library.custom_op("{ns}::standard_kernels_act_and_mul", mutates_args=())
def act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    """act(x[..., :d]) * x[..., d:], d = x.shape[-1] // 2; activation is "silu", "gelu" (erf) or "gelu_tanh"."""
    _count_launch(activation + "_and_mul")
    y = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    _launch_act_and_mul(rows_view(x), y.view(-1, y.shape[-1]), activation)
    return y


@act_and_mul.register_fake
def _(x, activation):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
'''

_OPS_TEMPLATE = {"rms_norm": _NORM_OPS, "act_and_mul": _ACT_OPS}


def families(ops: tuple[str, ...]) -> list[str]:
    """The kernel families `ops` need, in a fixed order."""
    needed = {OP_FAMILIES[op] for op in ops}
    return [family for family in FAMILIES if family in needed]


def _definitions(source: KernelSource) -> list[str]:
    """Source text of each named top-level definition of `source.module`, with its decorators and the comment
    lines right above it."""
    text = inspect.getsource(importlib.import_module(source.module))
    lines = text.splitlines()
    found = {}
    for node in ast.parse(text).body:
        targets = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [
            t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        for name in targets:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            found[name] = "\n".join(lines[start:node.end_lineno])
    missing = [n for n in source.names if n not in found]
    if missing:
        raise RuntimeError(f"{source.module} no longer defines {', '.join(missing)}: update sk.export.kernel_module")
    return [found[n] for n in source.names]


def _suffix_clashing(code: str, family: str) -> str:
    for name in _CLASHING:
        code = re.sub(rf"\b{re.escape(name)}\b", f"{name}_{family}", code)
    return code


def render(ops: tuple[str, ...], header: str, op_namespace: str) -> str:
    """The module's text: `header` (license line and docstring, the engine's conventions), then the kernels
    of the families `ops` need and their custom ops registered under `op_namespace`."""
    parts = [header.rstrip("\n") + "\n\n" + _PREAMBLE.rstrip("\n"), "\n\n".join(_definitions(COMMON))]
    for family in families(ops):
        body = "\n\n\n".join(_suffix_clashing(code, family) for code in _definitions(FAMILIES[family]))
        parts.append(f"# {'-' * 40} {family} (from Standard Kernels' {FAMILIES[family].module})\n\n{body}")
        parts.append(_OPS_TEMPLATE[family].format(ns=op_namespace).strip("\n"))
    return "\n\n\n".join(parts) + "\n"
