"""Compile checks for sm90 on any machine: a script run without Triton's interpreter (Triton's own ptxas, no GPU)."""
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_compile_check(script: str) -> dict:
    """Run `script` (which prints one JSON line last) from the repository root without TRITON_INTERPRET; its JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])
