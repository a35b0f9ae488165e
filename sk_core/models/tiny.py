"""Small random-weight decoder models in Hugging Face layout, made here with a fixed seed (no hub).

Three styles cover the layers our engine adapters replace:
  - "llama": RMSNorm + SwiGLU (SiluAndMul);
  - "gemma": GemmaRMSNorm (scales by 1 + weight) + GEGLU with tanh GELU (untied lm_head unless asked);
  - "qwen3": Llama's layers plus an RMSNorm over each head of q and k (q_norm, k_norm; width head_dim).
The weights are scaled so that logits are peaked (greedy decoding is then stable against rounding-level
differences between kernels), and head_dim is 64, which every vLLM attention backend (CPU included) accepts.
Writing needs `safetensors` and `tokenizers` (both come with vLLM).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from sk import settings
from sk.models.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE, write_byte_tokenizer

# Bump when the files written for the same parameters change, so caches are rebuilt.
FORMAT_VERSION = 1
STYLES = ("llama", "gemma", "qwen3")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass(frozen=True)
class TinyModelSpec:
    style: str = "llama"
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    vocab_size: int = 512
    # Standard deviation of the logits at initialisation: large enough that the top token stands out.
    logit_scale: float = 8.0
    # vLLM 0.25's Gemma accepts only tied embeddings; untied ones give a tiny Gemma more varied tokens.
    tie_word_embeddings: bool = False
    seed: int = 0
    # The dtype of the weight file: bfloat16 halves a full-depth model's file and the time to write it.
    weights_dtype: str = "float32"

    def __post_init__(self):
        if self.style not in STYLES:
            raise ValueError(f"unknown model style {self.style!r}; known: {', '.join(STYLES)}")
        if self.weights_dtype not in _DTYPES:
            raise ValueError(f"weights_dtype must be one of {', '.join(_DTYPES)}, not {self.weights_dtype!r}")
        if self.vocab_size < VOCAB_SIZE:
            raise ValueError(f"vocab_size must hold the byte tokenizer's {VOCAB_SIZE} tokens")

    def key(self) -> str:
        fields = dataclasses.asdict(self)
        if fields["weights_dtype"] == "float32":  # the models written before the field existed keep their keys
            del fields["weights_dtype"]
        text = json.dumps([FORMAT_VERSION, fields], sort_keys=True)
        return f"{self.style}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def parameter_count(spec: TinyModelSpec) -> int:
    """The number of weights `spec`'s model has (what `_weights` writes)."""
    h, q, kv = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * spec.intermediate_size + 2 * h
    per_layer += 2 * spec.head_dim if spec.style == "qwen3" else 0
    head = 0 if spec.tie_word_embeddings else spec.vocab_size * h
    return spec.vocab_size * h + spec.num_layers * per_layer + h + head


def default_cache_dir() -> Path:
    return settings.get("cache_dir") / "models"


def tiny_model(spec: TinyModelSpec = TinyModelSpec(), cache_dir: Path | None = None) -> Path:
    """Directory of the model for `spec`, written on first use (atomically, so concurrent callers are safe)."""
    target = Path(cache_dir or default_cache_dir()) / spec.key()
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.key()}-", dir=target.parent))
    try:
        _write(spec, staging)
        os.rename(staging, target)
    except OSError:
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _config(spec: TinyModelSpec) -> dict:
    common = {
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": spec.weights_dtype,
        "pad_token_id": SPECIAL_TOKENS.index("<pad>"),
        "bos_token_id": SPECIAL_TOKENS.index("<bos>"),
        "eos_token_id": SPECIAL_TOKENS.index("<eos>"),
    }
    if spec.style == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", **common}
    if spec.style == "qwen3":
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
                "attention_bias": False, **common}
    return {"architectures": ["GemmaForCausalLM"], "model_type": "gemma",
            "hidden_activation": "gelu_pytorch_tanh", **common}


def _weights(spec: TinyModelSpec) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(spec.seed)
    h, q, kv = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim

    dtype = _DTYPES[spec.weights_dtype]

    def linear(out_features, in_features, gain=1.0):
        # Rounded as made: a full-depth model's matrices are never all held in fp32 at once.
        return (torch.randn(out_features, in_features, generator=gen) * (gain / in_features ** 0.5)).to(dtype)

    def norm():
        # Gemma stores the offset from 1; both styles end up with scales near 1 that differ per channel.
        offset = torch.randn(h, generator=gen) * 0.1
        return offset if spec.style == "gemma" else 1.0 + offset

    # Tied, the embeddings are the lm_head: scaled for the logits. Untied, they start the residual stream at
    # unit scale (Gemma multiplies them by sqrt(hidden_size)).
    if spec.tie_word_embeddings:
        embed_std = spec.logit_scale * h ** -0.5
    else:
        embed_std = h ** -0.5 if spec.style == "gemma" else 1.0
    weights = {"model.embed_tokens.weight": torch.randn(spec.vocab_size, h, generator=gen) * embed_std}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        weights.update({
            p + "input_layernorm.weight": norm(),
            p + "self_attn.q_proj.weight": linear(q, h),
            p + "self_attn.k_proj.weight": linear(kv, h),
            p + "self_attn.v_proj.weight": linear(kv, h),
            p + "self_attn.o_proj.weight": linear(h, q),
            p + "post_attention_layernorm.weight": norm(),
            p + "mlp.gate_proj.weight": linear(spec.intermediate_size, h),
            p + "mlp.up_proj.weight": linear(spec.intermediate_size, h),
            p + "mlp.down_proj.weight": linear(h, spec.intermediate_size),
        })
        if spec.style == "qwen3":
            weights[p + "self_attn.q_norm.weight"] = 1.0 + torch.randn(spec.head_dim, generator=gen) * 0.1
            weights[p + "self_attn.k_norm.weight"] = 1.0 + torch.randn(spec.head_dim, generator=gen) * 0.1
    weights["model.norm.weight"] = norm()
    if not spec.tie_word_embeddings:
        weights["lm_head.weight"] = linear(spec.vocab_size, h, gain=spec.logit_scale)
    return {name: t.contiguous() for name, t in weights.items()}


def _cast(spec: TinyModelSpec, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    dtype = _DTYPES[spec.weights_dtype]
    return {name: t.to(dtype) for name, t in weights.items()}


def _write(spec: TinyModelSpec, out_dir: Path) -> None:
    from safetensors.torch import save_file

    save_file(_cast(spec, _weights(spec)), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(_config(spec), indent=2) + "\n")
    generation = {k: v for k, v in _config(spec).items() if k.endswith("_token_id")}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    write_byte_tokenizer(out_dir)
