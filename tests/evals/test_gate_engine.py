"""`sk gate` in the vLLM CPU engine (fp32): passes with our kernels, fails with a deliberately broken one."""
import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

BROKEN_KERNEL = Path(__file__).resolve().parent / "broken_kernel"

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(find_spec("vllm") is None or find_spec("lm_eval") is None,
                       reason="needs vLLM and lm-eval (the ci/envs/vllm_cpu.sh venv)"),
]


def _scenario(tmp_path: Path, style: str) -> Path:
    path = tmp_path / f"{style}.yaml"
    path.write_text(f"""scenarios:
  - model: sk-trained/{style}
    engine: vllm
    dtype: float32
    max_model_len: 256
    kv_cache_memory_bytes: 268435456
    workloads: [LLM.single_request]
""")
    return path


def _gate(*args: str) -> subprocess.CompletedProcess:
    # Our ops take their PyTorch path in the CPU engine: Triton's interpreter (set by tests/conftest.py) is too slow
    # for 300 items in vLLM's 5-minute step timeout; the adapter's parity tests cover the interpreted kernels.
    env = {k: v for k, v in os.environ.items()
           if k not in ("SK_ADAPTERS", "SK_STRICT", "SK_REPORT_DIR", "TRITON_INTERPRET")}
    return subprocess.run([sys.executable, "-m", "sk.evals.gate", *args], capture_output=True, text=True,
                          env=env, timeout=3600)


@pytest.mark.parametrize("style", ["llama", "gemma"])
def test_gate_passes_with_our_kernels(style, tmp_path):
    done = _gate(str(_scenario(tmp_path, style)), "--enforce-eager", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-4000:]
    (result,) = json.loads((tmp_path / "out" / "gate.json").read_text())
    norms = {"llama": {"rms_norm", "fused_add_rms_norm"}, "gemma": {"gemma_rms_norm", "gemma_fused_add_rms_norm"}}
    # The decoder layers' norm + MLP (the activation inside) run as one fused_gated_mlp call, the default.
    fused = {"llama": "fused_gated_mlp/rms", "gemma": "fused_gated_mlp/gemma_rms"}[style]
    assert {op for op, n in result["activity"]["op_calls"].items() if n} >= {fused}
    assert any(op.startswith(tuple(norms[style])) for op in result["activity"]["op_calls"])
    assert "gate: PASS" in done.stdout


@pytest.mark.parametrize("style, bug", [("llama", "dropped_residual"), ("gemma", "wrong_epsilon")])
def test_gate_fails_on_a_broken_kernel(style, bug, tmp_path):
    pythonpath = os.pathsep.join(p for p in (str(BROKEN_KERNEL), os.environ.get("PYTHONPATH")) if p)
    done = _gate(str(_scenario(tmp_path, style)), "--enforce-eager", "--limit", "60", "--out", str(tmp_path / "out"),
                 "--candidate-env", f"PYTHONPATH={pythonpath}", "--candidate-env", f"SK_TEST_BROKEN_KERNEL={bug}")
    assert done.returncode == 1, done.stdout[-8000:] + done.stderr[-4000:]
    assert "gate: FAIL" in done.stdout and "answered differently (FAIL)" in done.stdout
    (result,) = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert not result["passed"]
    assert sum(len(t["disagreements"]) for t in result["tasks"].values()) > 0.1 * 2 * 60
