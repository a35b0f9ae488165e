"""The committed SGLang 0.5.17 series stands alone at the layer level (SGLang's engine needs a GPU): applied to a
copy of the installed sglang package, its own test builds SGLang's RMSNorm, GemmaRMSNorm, SiluAndMul and
GeluAndMul with the switch on and matches their forward_native, and Llama's MLP with its post-attention RMSNorm as
one fused_gated_mlp call against fp64 math (both of its routes; weights reloaded in place), with the exported
kernels launched (interpreted on CPU), in an interpreter where our package cannot be imported.
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

import isolated_python

REPO = Path(__file__).resolve().parents[2]
SERIES = REPO / "upstream_patches" / "sglang" / "0.5.17"

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> dict:
    done = subprocess.run(["bash", str(REPO / "ci/envs/sglang.sh")], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"no SGLang venv (ci/envs/sglang.sh failed): {done.stderr[-500:]}")
    venv = Path(done.stdout.strip().splitlines()[-1])
    site_packages = next((venv / "lib").glob("python*/site-packages"))
    # SGLang's repository layout: python/sglang, test/srt.
    repo = tmp_path_factory.mktemp("sglang-patched")
    isolated_python.copy_package(site_packages, "sglang", repo / "python")
    patches = sorted(str(p) for p in SERIES.glob("*.patch"))
    check = subprocess.run(["git", "apply", "--check", *patches], cwd=repo, capture_output=True, text=True)
    subprocess.run(["git", "apply", *patches], cwd=repo, check=True)
    # The venv's python makes the isolated one (its site-packages, not this process's).
    venv_python = venv / "bin" / "python"
    work = tmp_path_factory.mktemp("sglang-isolated")
    subprocess.run([str(venv_python), "-c", "import sys; sys.path.insert(0, sys.argv[1]); import isolated_python, "
                    "pathlib; print(isolated_python.make(*map(pathlib.Path, sys.argv[2:])))",
                    str(Path(__file__).parent), str(site_packages), str(repo / "python"), str(work)],
                   check=True, capture_output=True, text=True)
    return {"repo": repo, "python": work / "venv" / "bin" / "python", "check": check}


def test_series_applies_to_pristine_sources(patched):
    assert patched["check"].returncode == 0, patched["check"].stderr


def test_series_own_layer_test_passes_without_us(patched):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_USE_STANDARD_KERNELS")}
    code = ("import importlib.util, sys, unittest; assert importlib.util.find_spec('sk') is None, 'sk importable'; "
            "sys.exit(unittest.main(module=None, argv=['x', 'discover', '-s', 'test/srt', "
            "'-p', 'test_standard_kernels.py', '-v']))")
    done = subprocess.run([str(patched["python"]), "-c", code], cwd=patched["repo"],
                          env={**env, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-6000:]
    for test in ("rms_norm", "gemma_rms_norm", "silu_and_mul", "gelu_and_mul", "fused_gated_mlp"):
        # "test_x (module.Class.test_x)", log lines perhaps, then "... ok" before the next test's line.
        ran = re.search(rf"^test_{test} \([^\n]*(?:\n(?!test_)[^\n]*)*?\.\.\. ok$", done.stderr, re.MULTILINE)
        assert ran, (test, done.stderr[-3000:])
