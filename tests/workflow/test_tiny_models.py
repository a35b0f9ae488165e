"""The project's random-weight models (sk.models.tiny): the qwen3 style (q/k norms) loads into transformers'
own Qwen3 class with every weight used; bf16 weight files; the float32 models keep their cache keys."""
import dataclasses
import hashlib
import json

import pytest
import torch

from sk.models import TinyModelSpec, parameter_count, tiny_model
from sk.models.tiny import FORMAT_VERSION, _weights

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")


@pytest.mark.parametrize("style", ["llama", "gemma", "qwen3"])
def test_the_parameter_count_is_what_is_written(style):
    spec = TinyModelSpec(style=style, hidden_size=64, intermediate_size=96, num_layers=2, head_dim=16)
    assert parameter_count(spec) == sum(t.numel() for t in _weights(spec).values())


def test_a_qwen3_model_loads_into_transformers_qwen3(tmp_path):
    transformers = pytest.importorskip("transformers")
    spec = TinyModelSpec(style="qwen3", hidden_size=64, intermediate_size=96, num_layers=2, head_dim=16,
                         weights_dtype="bfloat16")
    folder = tiny_model(spec, cache_dir=tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["torch_dtype"]) == ("qwen3", "bfloat16")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.model.layers[0].self_attn.q_norm.weight.shape == (16,)
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7]])).logits
    assert logits.shape[-1] == spec.vocab_size and torch.isfinite(logits).all()


def test_float32_models_keep_the_keys_they_had_before_weights_dtype():
    spec = TinyModelSpec()
    fields = {k: v for k, v in dataclasses.asdict(spec).items() if k != "weights_dtype"}
    old = hashlib.sha256(json.dumps([FORMAT_VERSION, fields], sort_keys=True).encode()).hexdigest()[:12]
    assert spec.key() == f"llama-{old}"
    assert TinyModelSpec(weights_dtype="bfloat16").key() != spec.key()
    with pytest.raises(ValueError, match="weights_dtype must be one of float32, bfloat16, float16, not 'int8'"):
        TinyModelSpec(weights_dtype="int8")
