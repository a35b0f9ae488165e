"""The self-contained Triton module an exported series adds to an engine's tree, generated from our op files.

The kernels, their launch configurations and launch functions are copied out of `sk.ops` by name (their source
text, found with `ast`), so the upstreamed code is the code our tests and benchmarks run; only the thin layer of
torch custom ops around them is written here. The module imports torch and triton and nothing of ours.
"""
from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
import symtable
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSource:
    """Top-level definitions (functions, classes or assignments, by name) copied from one of our op modules, in
    order."""

    module: str
    names: tuple[str, ...]


# The ops `--ops` may name, and the op family each one needs.
OP_FAMILIES = {
    "rms_norm": "rms_norm",
    "gemma_rms_norm": "rms_norm",
    "fused_add_rms_norm": "rms_norm",
    "silu_and_mul": "act_and_mul",
    "gelu_and_mul": "act_and_mul",
    "fused_gated_mlp": "gated_mlp",
}
ALL_OPS = tuple(OP_FAMILIES)
# Families whose code calls another family's (the gated MLP: the activation in its kernels, the RMSNorm and
# act-and-mul launchers above its fused kernels' rows).
REQUIRES = {"gated_mlp": ("rms_norm", "act_and_mul")}

# Shared helpers first, then each family's kernels, launch configurations and launchers.
COMMON = KernelSource("sk.ops._common", ("cdiv", "next_power_of_2", "rows_view"))
FAMILIES: dict[str, tuple[KernelSource, ...]] = {
    # `_launch`'s dependent_launch reads our settings: the template defines it.
    "rms_norm": (KernelSource("sk.ops.rms_norm", ("GEMMA_OFFSET", "_rms_norm_kernel", "_launch_config",
                                                  "_dependent_launch_capable", "_launch")),),
    "act_and_mul": (KernelSource(
        "sk.ops.act_and_mul",
        ("_SQRT_HALF", "_SQRT_2_OVER_PI", "_erf", "activate", "_act_and_mul_kernel", "SMALL_PROBLEM", "LARGE_BLOCK",
         "launch_config", "_launch"),
    ),),
    # `descriptor`'s CHECK_DESCRIPTORS and `forward_kernels`' pdl_on read our settings: the template defines them.
    "gated_mlp": (
        KernelSource("sk.ops.gated_mlp.common",
                     ("TMA_ALIGN", "TileConfig", "_tile_coords", "_tile_product", "_split_k_sum", "align", "sm_count",
                      "tma_ready", "descriptor")),
        KernelSource("sk.ops.gated_mlp.triton_kernels",
                     ("_norm_kernel", "_gate_up_kernel", "_down_kernel", "_down_epilogue", "GemmConfig", "M_CLASSES",
                      "FUSED_MAX_M", "LARGE_MLP", "FUSED_MAX_M_LARGE", "fused_max_m", "_DECODE_SWEEP",
                      "GATE_UP_CONFIGS", "DOWN_CONFIGS", "_TP4_SWEEP", "_M32_SWEEP", "TUNED", "MAX_SPLIT_K",
                      "shape_class", "fit_configs", "fit_split", "choose_configs", "forward_kernels")),
    ),
}
# Names two families define: suffixed with the family in the generated module.
_CLASHING = ("_launch",)
# Imports a family's copied code needs beyond the preamble's.
_IMPORTS = {
    "rms_norm": ("import functools", "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait"),
    "gated_mlp": ("import dataclasses", "import functools", "from typing import Optional",
                  "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait",
                  "from triton.tools.tensor_descriptor import TensorDescriptor"),
}

# The custom ops around the launchers (the engine's op namespace is filled in). Each call counts a launch and
# logs the first one per kernel, so a test (or a user) can see the kernels ran inside the engine's workers.
_PREAMBLE = '''\
{imports}

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

def dependent_launch(device: torch.device) -> bool:
    """The norm kernel launches as a programmatic dependent launch on NVIDIA GPUs from SM90 on (not interpreted:
    no inline PTX there), as the engine's own norm kernels may."""
    if device.type != "cuda" or _INTERPRETED:
        return False
    return _dependent_launch_capable(device.index if device.index is not None else torch.cuda.current_device())


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

# {max_d_model} and {max_d_ff}: the limits of Standard Kernels' Kernel Coverage rows for the family.
_GATED_MLP_OPS = '''

# What the gated MLP covers: d_model and d_ff (this rank's shard) multiples of TMA_ALIGN (TMA's 16-byte rows), at
# most these; bf16/fp16 activations on NVIDIA Hopper (SM90, where its launch configs were tuned), or fp32 too
# under Triton's interpreter (CPU tests).
GATED_MLP_MAX_D_MODEL = {max_d_model}
GATED_MLP_MAX_D_FF = {max_d_ff}
GATED_MLP_DTYPES = (torch.bfloat16, torch.float16)

# `descriptor` checks what the callers guarantee only where it costs nothing that matters (the interpreter).
CHECK_DESCRIPTORS = _INTERPRETED


def pdl_on() -> bool:
    """Programmatic dependent launches (Hopper) where a config asks; not interpreted (no inline PTX there)."""
    return not _INTERPRETED


def fused_gated_mlp_supported(d_model: int, d_ff: int) -> bool:
    """Whether a block of this shape runs the fused MLP on this machine: Hopper, or Triton's interpreter."""
    if d_model % TMA_ALIGN or d_ff % TMA_ALIGN:
        return False
    if d_model > GATED_MLP_MAX_D_MODEL or d_ff > GATED_MLP_MAX_D_FF:
        return False
    if _INTERPRETED:
        return True
    # ROCm reports some AMD GPUs as (9, 0) too: TMA and PDL are NVIDIA's.
    return (
        torch.version.hip is None
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability() == (9, 0)
    )


def fused_gated_mlp_launchable(x: torch.Tensor) -> bool:
    """Whether activations like x run the fused MLP: bf16/fp16 on CUDA; interpreted, fp32 too."""
    return launchable(x) and (
        x.dtype in GATED_MLP_DTYPES or (_INTERPRETED and x.dtype == torch.float32)
    )


@torch.library.custom_op("{ns}::standard_kernels_fused_gated_mlp", mutates_args=())
def fused_gated_mlp(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    epsilon: float,
    norm: str,
    activation: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder layer's pre-MLP RMSNorm (with the residual add) and gated MLP in one call; returns (out, h):

        h = x + residual (rounded to x's dtype)    n = h / rms(h) * w    (norm "gemma_rms": * (1 + w))
        [g; u] = n @ gate_up_weight.T              out = (act(g) * u) @ down_weight.T

    gate_up_weight [2 * d_ff, d_model] (gate rows first) and down_weight [d_model, d_ff] in x's dtype;
    activation "silu", "gelu" (erf) or "gelu_tanh". Up to `fused_max_m` rows (decode): three kernels, the
    add + norm, gate/up on the weight as given with the activation in its epilogue, and down with K split across
    programs. Above: the RMSNorm and act-and-mul kernels around torch's GEMMs. No weight is copied.
    """
    _count_launch("fused_gated_mlp")
    d = x.shape[-1]
    ff = gate_up_weight.shape[0] // 2
    expected = {{"gate_up_weight": (2 * ff, d), "down_weight": (d, ff), "norm_weight": (d,)}}
    for name, weight in (
        ("gate_up_weight", gate_up_weight),
        ("down_weight", down_weight),
        ("norm_weight", norm_weight),
    ):
        if tuple(weight.shape) != expected[name] or weight.dtype != x.dtype:
            raise ValueError(
                f"fused_gated_mlp: {{name}} is {{tuple(weight.shape)}} {{weight.dtype}}; with x "
                f"{{tuple(x.shape)}} {{x.dtype}} it must be {{expected[name]}} in x's dtype"
            )
    if residual.shape != x.shape:
        raise ValueError(
            f"fused_gated_mlp: residual is {{tuple(residual.shape)}}; it must have x's shape {{tuple(x.shape)}}"
        )
    x2, r2 = rows_view(x).contiguous(), rows_view(residual).contiguous()
    if x2.shape[0] <= fused_max_m(d, ff):
        out, h = forward_kernels(
            tma_ready(x2), tma_ready(r2), norm_weight.contiguous(), None,
            tma_ready(gate_up_weight.contiguous()), None,
            tma_ready(down_weight.contiguous()), None, epsilon, norm, activation,
        )
    else:
        n = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        h = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        offset = GEMMA_OFFSET if norm == "gemma_rms" else 0.0
        _launch_rms_norm(x2, norm_weight, n, epsilon, offset, r2, h)
        gate_up = torch.nn.functional.linear(n, gate_up_weight)
        a = torch.empty((x2.shape[0], ff), dtype=x.dtype, device=x.device)
        _launch_act_and_mul(gate_up, a, activation)
        out = torch.nn.functional.linear(a, down_weight)
    return out.view(x.shape), h.view(x.shape)


@fused_gated_mlp.register_fake
def _(x, residual, norm_weight, gate_up_weight, down_weight, epsilon, norm, activation):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty(x.shape, dtype=x.dtype, device=x.device)
'''

_OPS_TEMPLATE = {"rms_norm": _NORM_OPS, "act_and_mul": _ACT_OPS, "gated_mlp": _GATED_MLP_OPS}


def families(ops: tuple[str, ...]) -> list[str]:
    """The kernel families `ops` need (with those they call), in a fixed order."""
    needed = {OP_FAMILIES[op] for op in ops}
    needed |= {required for family in needed for required in REQUIRES.get(family, ())}
    return [family for family in FAMILIES if family in needed]


def _defined_names(node: ast.stmt) -> list[str]:
    """The names a top-level statement defines: a function's or class's, an assignment's plain targets."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.AnnAssign):
        return [node.target.id] if isinstance(node.target, ast.Name) else []
    return [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]


def _definitions(source: KernelSource) -> list[str]:
    """Source text of each named top-level definition of `source.module`, with its decorators and the comment
    lines right above it."""
    text = inspect.getsource(importlib.import_module(source.module))
    lines = text.splitlines()
    found = {}
    for node in ast.parse(text).body:
        for name in _defined_names(node):
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


def _imports(families_: list[str]) -> str:
    """The module's imports: the standard library's, then torch's and triton's, each plain imports first."""
    lines = {"import collections", "import logging", "import math", "import os", "import torch", "import triton",
             "import triton.language as tl"}
    lines.update(line for family in families_ for line in _IMPORTS.get(family, ()))

    def third_party(line: str) -> bool:
        return line.split()[1].split(".")[0] in ("torch", "triton")

    def ordered(group: list[str]) -> list[str]:
        return sorted(group, key=lambda line: (line.startswith("from "), line.split()[1]))
    return "\n".join(ordered([line for line in lines if not third_party(line)])) + "\n\n" + "\n".join(
        ordered([line for line in lines if third_party(line)]))


def render(ops: tuple[str, ...], header: str, op_namespace: str) -> str:
    """The module's text: `header` (license line and docstring, the engine's conventions), then the kernels
    of the families `ops` need and their custom ops registered under `op_namespace`."""
    from sk import coverage

    needed = families(ops)
    limits = coverage.table()["fused_gated_mlp/rms"].limits
    values = {"ns": op_namespace, "max_d_model": limits["max_d_model"], "max_d_ff": limits["max_d_ff"]}
    parts = [header.rstrip("\n") + "\n\n" + _PREAMBLE.format(imports=_imports(needed)).rstrip("\n"),
             "\n\n".join(_definitions(COMMON))]
    for family in needed:
        sources = FAMILIES[family]
        body = "\n\n\n".join(_suffix_clashing(code, family) for source in sources for code in _definitions(source))
        packages = {source.module.rpartition(".")[0] for source in sources}
        modules = (f"{packages.pop()}: {', '.join(source.module.rpartition('.')[2] for source in sources)}"
                   if len(sources) > 1 and len(packages) == 1 else ", ".join(source.module for source in sources))
        parts.append(f"# {'-' * 40} {family} (from Standard Kernels' {modules})\n\n{body}")
        parts.append(_OPS_TEMPLATE[family].format(**values).strip("\n"))
    text = "\n\n\n".join(parts) + "\n"
    _check_unique(text)
    _check_defined(text)
    return text


def _check_defined(text: str) -> None:
    """A name the copied code reads but the module does not define would only fail in the engine (NameError)."""
    module = symtable.symtable(text, "kernel_module", "exec")
    defined = {sym.get_name() for sym in module.get_symbols() if sym.is_assigned() or sym.is_imported()}

    def read_globals(table: symtable.SymbolTable) -> set[str]:
        names = {sym.get_name() for sym in table.get_symbols() if sym.is_referenced()
                 and (table is module or sym.is_global())}
        return names.union(*(read_globals(child) for child in table.get_children()))
    undefined = sorted(read_globals(module) - defined - set(dir(builtins)))
    if undefined:
        raise RuntimeError(f"the generated kernel module reads {', '.join(undefined)} without defining them: add "
                           f"them to sk.export.kernel_module.FAMILIES")


def _check_unique(text: str) -> None:
    """Two top-level definitions of one name would silently shadow each other in the generated module."""
    names = [name for node in ast.parse(text).body for name in _defined_names(node)
             if name != "_"]  # "_": the ops' fakes
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise RuntimeError(f"the generated kernel module defines {', '.join(duplicated)} twice: add them to "
                           f"sk.export.kernel_module._CLASHING")
