"""The operator catalog: vLLM's replaceable operators (by the op name vLLM registers them under, which is
what `sk capture` records and `sk bench --target` takes), which Standard Kernels op covers each, the baseline
module a candidate must match, and which operators each architecture uses: read from the installed vLLM's own
model class (sk.workflow.engine_map) for any architecture it registers, or, where vLLM is not installed, from
the built-in list below.
"""
from __future__ import annotations

import dataclasses

from sk.workflow import baseline_ops
from sk.workflow.errors import WorkflowError


@dataclasses.dataclass(frozen=True)
class Operator:
    name: str
    vllm_class: str
    # Standard Kernels ops that implement it inside vLLM through our adapter; empty: not covered.
    sk_ops: tuple[str, ...] = ()
    # Forward body a new candidate starts from: our op where we cover it, else the baseline's forward.
    starting_body: str | None = None
    # Where vLLM defines the class (for `sk eval --candidates`); None where candidates cannot replace it yet.
    vllm_module: str | None = None

    @property
    def baseline(self) -> type | None:
        """The baseline module (vLLM's class name and signatures), None where the bench has none yet."""
        return getattr(baseline_ops, self.vllm_class, None)


_NORM_BODY = """\
        if residual is None:
            return sk.ops.{op}(x, self.weight, self.variance_epsilon)
        return sk.ops.{fused}(x, residual, self.weight, self.variance_epsilon)"""

_LAYERNORM, _ACTIVATION = "vllm.model_executor.layers.layernorm", "vllm.model_executor.layers.activation"

OPERATORS = {op.name: op for op in [
    Operator("rms_norm", "RMSNorm", ("rms_norm", "fused_add_rms_norm"),
             _NORM_BODY.format(op="rms_norm", fused="fused_add_rms_norm"), _LAYERNORM),
    Operator("gemma_rms_norm", "GemmaRMSNorm", ("gemma_rms_norm", "gemma_fused_add_rms_norm"),
             _NORM_BODY.format(op="gemma_rms_norm", fused="gemma_fused_add_rms_norm"), _LAYERNORM),
    Operator("silu_and_mul", "SiluAndMul", ("silu_and_mul",), "        return sk.ops.silu_and_mul(x)", _ACTIVATION),
    Operator("gelu_and_mul", "GeluAndMul", ("gelu_and_mul",),
             "        return sk.ops.gelu_and_mul(x, approximate=self.approximate)", _ACTIVATION),
    Operator("rotary_embedding", "RotaryEmbedding", vllm_module="vllm.model_executor.layers.rotary_embedding"),
    Operator("vocab_parallel_embedding", "VocabParallelEmbedding"),
    Operator("column_parallel_linear", "QKVParallelLinear, MergedColumnParallelLinear"),
    Operator("row_parallel_linear", "RowParallelLinear"),
    Operator("logits_processor", "LogitsProcessor"),
]}

_DECODER_COMMON = ["rotary_embedding", "vocab_parallel_embedding", "column_parallel_linear", "row_parallel_linear",
                   "logits_processor"]
# Architecture (Hugging Face model_type) -> the replaceable operators its vLLM model executes, as captured
# from the project's small models (sk capture scenarios/tiny.yaml).
ARCHITECTURES: dict[str, list[str]] = {
    "llama": ["rms_norm", "silu_and_mul", *_DECODER_COMMON],
    "mistral": ["rms_norm", "silu_and_mul", *_DECODER_COMMON],
    "qwen2": ["rms_norm", "silu_and_mul", *_DECODER_COMMON],
    "gemma": ["gemma_rms_norm", "gelu_and_mul", *_DECODER_COMMON],
}


def operator(name: str) -> Operator:
    if name not in OPERATORS:
        raise WorkflowError(f"unknown operator {name!r}; known: {', '.join(OPERATORS)}")
    return OPERATORS[name]


def operators_of_layers(layers: list[dict]) -> list[Operator]:
    """The catalog's operator for each distinct op of an engine model's layers (sk.workflow.engine_map); an op
    the catalog lacks becomes an uncovered operator named as the engine names it, with its classes."""
    classes: dict[str, list[str]] = {}
    for layer in layers:
        classes.setdefault(layer["op"], []).append(layer["class"])
    return [OPERATORS.get(op) or Operator(op, ", ".join(names)) for op, names in classes.items()]


def architecture(name: str) -> list[Operator]:
    """The operators architecture `name` runs in the installed vLLM (the built-in list without vLLM)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        from sk.workflow.engine_map import architecture_layers

        return operators_of_layers(list(architecture_layers(name)[2]))
    if name not in ARCHITECTURES:
        raise WorkflowError(f"unknown architecture {name!r}; vLLM is not installed here, and the built-in list "
                            f"knows: {', '.join(ARCHITECTURES)}")
    return [OPERATORS[op] for op in ARCHITECTURES[name]]
