"""`sk create-stubs --architecture ARCH`: a candidate module per operator of the architecture that has a
baseline, to edit and then measure with `sk bench --target OP`. Existing files are kept unless forced.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from sk.workflow.candidates import candidate_path
from sk.workflow.operators import Operator, architecture

_TEMPLATE = '''\
"""Candidate for vLLM's {cls} (operator {op}), created by `sk create-stubs --architecture {arch}`.

Keep the class name and the signatures of __init__ and forward: `sk bench --target {op}` checks them, loads
the baseline's parameters into this module and compares it with the baseline on every captured shape;
`sk eval --candidates DIR` runs this forward inside vLLM on vLLM's own layer, so use only the attributes the
baseline sets in __init__ (vLLM's layer has them too) and the baseline's methods.
{start}
"""
import torch

import sk
from sk.workflow.baseline_ops import {cls} as Baseline


class {cls}(Baseline):
    def forward{signature}:
{body}
'''


def stub_source(op: Operator, arch: str) -> str:
    forward = inspect.signature(op.baseline.forward)
    arguments = ", ".join(p for p in list(forward.parameters)[1:])
    start = ("It starts as Standard Kernels' op: make it faster, or replace it with your kernel." if op.starting_body
             else "It starts as the baseline itself (~1.0x): replace the body with your kernel.")
    # Baseline.forward(self, ...) rather than super(): in the engine the method runs on vLLM's own layer.
    body = op.starting_body or f"        return Baseline.forward(self, {arguments})"
    return _TEMPLATE.format(cls=op.vllm_class, op=op.name, arch=arch, start=start, signature=forward, body=body)


def create(arch: str, directory: Path, force: bool) -> dict[str, str]:
    """Operator -> what happened ("created", "kept (exists)", "no baseline yet")."""
    outcome = {}
    operators = architecture(arch)  # an unknown architecture is refused before the folder exists
    directory.mkdir(parents=True, exist_ok=True)
    for op in operators:
        path = candidate_path(directory, op)
        if op.baseline is None:
            outcome[op.name] = "skipped: no baseline operator yet"
        elif path.exists() and not force:
            outcome[op.name] = f"kept: {path} exists (--force overwrites)"
        else:
            path.write_text(stub_source(op, arch))
            outcome[op.name] = f"created {path}"
    return outcome
