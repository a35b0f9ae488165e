"""The candidate folder: one module per operator, `<folder>/<op>.py`, defining a class with the baseline's
exact class name, constructor signature and forward signature.

The folder is `candidates/` in the working directory unless $SK_CANDIDATE_DIR (or --candidates) says otherwise.
A candidate that does not match is refused with a message that shows both signatures.
"""
from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

from sk import settings
from sk.workflow.errors import WorkflowError
from sk.workflow.operators import Operator

CANDIDATE_DIR_ENV = settings.env_name("candidate_dir")


def default_dir() -> Path:
    return settings.get("candidate_dir")


def candidate_path(directory: Path, op: Operator) -> Path:
    return Path(directory) / f"{op.name}.py"


def _shape_of(fn) -> list[tuple]:
    """What a drop-in must repeat: parameter names, kinds and defaults (annotations are free)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def load_candidate(op: Operator, directory: Path) -> type:
    path = candidate_path(directory, op)
    if not path.exists():
        raise WorkflowError(f"no candidate for {op.name}: {path} does not exist "
                            f"(sk create-stubs writes one to start from)")
    spec = importlib.util.spec_from_file_location(f"sk_candidates.{op.name}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file: report, don't crash
        raise WorkflowError(f"{path} failed to import: {type(e).__name__}: {e}") from None
    cls = getattr(module, op.vllm_class, None)
    if not isinstance(cls, type):
        raise WorkflowError(f"{path} defines no class {op.vllm_class} (the candidate keeps the baseline's class name)")
    for method in ("__init__", "forward"):
        ours, theirs = getattr(op.baseline, method), getattr(cls, method)
        if _shape_of(ours) != _shape_of(theirs):
            raise WorkflowError(f"{path}: {op.vllm_class}.{method}{inspect.signature(theirs)} does not match the "
                                f"baseline's {method}{inspect.signature(ours)}")
    return cls
