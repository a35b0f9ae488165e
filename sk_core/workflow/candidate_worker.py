"""The user's candidates inside a vLLM worker process, injected as vLLM's `worker_extension_cls`.

`sk eval --candidates DIR` starts the candidate engine with
`worker_extension_cls="sk.workflow.candidate_worker.CandidateLayers"` and SK_CANDIDATE_DIR=DIR. vLLM imports
this module in every worker before the model is built; importing it registers, for each candidate module in
the folder, an out-of-tree replacement of the vLLM layer of the same class name: a subclass of vLLM's layer
(so constructor, weights and weight loading stay vLLM's) whose every forward path runs the candidate's
forward on it. The candidate's forward may use what the baseline and vLLM's layer share (the constructor's
attributes: `weight`, `variance_epsilon`, `approximate`, `cos_sin_cache`, `head_size`, ...) and the
baseline's own methods, which are copied onto the replacement.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import torch

from sk import settings, vllm_oot
from sk.workflow.candidates import candidate_path, load_candidate
from sk.workflow.operators import OPERATORS


def _replacement(vllm_cls: type, candidate: type) -> type:
    methods = {}
    own_classes = [k for k in candidate.__mro__ if k not in torch.nn.Module.__mro__]  # candidate, baseline
    for klass in reversed(own_classes):
        methods.update({k: v for k, v in vars(klass).items() if callable(v) and not k.startswith("__")})
    forward = methods.pop("forward")
    return vllm_oot.replacement(vllm_cls, forward, methods, module=candidate.__module__)


def _register_candidates(directory: Path) -> dict[str, str]:
    replaced = {}
    for op in OPERATORS.values():
        if op.baseline is None or op.vllm_module is None or not candidate_path(directory, op).exists():
            continue
        vllm_cls = getattr(importlib.import_module(op.vllm_module), op.vllm_class)
        ours = _replacement(vllm_cls, load_candidate(op, directory))
        vllm_oot.register(vllm_cls, ours, f"the candidate {candidate_path(directory, op)} (unset SK_ADAPTERS)")
        replaced[vllm_cls.__name__] = str(candidate_path(directory, op))
    return replaced


_replaced = _register_candidates(settings.get("candidate_dir"))


class CandidateLayers:
    """Methods mixed into the vLLM worker, called through LLM.collective_rpc."""

    def sk_candidates_replaced(self) -> dict[str, str]:
        return _replaced
