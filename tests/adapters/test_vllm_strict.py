"""Strict mode inside vLLM: a fallback in the engine's worker becomes an error that reaches the user.

On CPU without TRITON_INTERPRET every op call is a recorded fallback to the PyTorch reference, so with
SK_STRICT=1 the worker's first model step raises sk.CoverageError; vLLM fails the request (EngineDeadError
for an offline `LLM`) and prints the worker's error, our message included, instead of generating quietly.
"""
import subprocess
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("test_vllm_parity.py")


@pytest.mark.vllm
def test_strict_fallback_in_worker_fails_the_engine(vllm_python, engine_env, tmp_path):
    env = {**engine_env, "SK_ADAPTERS": "vllm", "SK_STRICT": "1"}
    done = subprocess.run([vllm_python, str(DRIVER), "--style", "llama", "--mode", "eager",
                           "--out", str(tmp_path / "tokens.json")],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert done.returncode != 0
    assert not (tmp_path / "tokens.json").exists()
    assert "sk.coverage.CoverageError: sk.ops.rms_norm: no kernel covers this call" in done.stdout, \
        done.stdout[-4000:]
    assert "Strict mode forbids the PyTorch fallback" in done.stdout


@pytest.mark.vllm
def test_strict_uncovered_decoder_layer_fails_naming_it(vllm_python, engine_env, tmp_path):
    # vLLM's LoRA support wraps the linears after loading: the fused block cannot stand in for them, so each
    # decoder layer keeps vLLM's norm + MLP, which strict mode refuses at load, naming the first layer.
    env = {**engine_env, "SK_ADAPTERS": "vllm", "SK_STRICT": "1"}
    done = subprocess.run([vllm_python, str(DRIVER), "--style", "llama", "--mode", "eager", "--enable-lora",
                           "--out", str(tmp_path / "tokens.json")],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert done.returncode != 0
    assert not (tmp_path / "tokens.json").exists()
    assert ("UncoveredLayerError: standardkernels (strict): decoder layer model.layers.0 (LlamaDecoderLayer) "
            "keeps vLLM's own norm + MLP, not sk.ops.fused_gated_mlp: LoRA is enabled") in done.stdout, \
        done.stdout[-4000:]
