"""H200 check of the exported vLLM series: the patched vLLM, side by side with stock vLLM and with our adapter.

    python3 ci/gpu/export_check.py OUTDIR [--series upstream_patches/vllm/0.25.0] [--tp 2] [--styles llama gemma]

1. Copies the installed vllm package to a temporary folder and applies the series there (`git apply --check`
   first).
2. Runs the series' own kernel test from the patched tree on the GPU.
3. Runs ci/gpu/vllm_check.py's comparison with a third variant, "patched": the engine imported from the patched
   copy with VLLM_USE_STANDARD_KERNELS=1 and our adapter off (bf16, compile + CUDA graphs; tokens, throughput,
   decode latency).
4. Writes OUTDIR/export_check.md: that table, plus the exported kernels' first-launch lines from each patched
   engine's log (the adapter's per-worker counts do not apply to the patched engine).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))

import vllm_check  # noqa: E402  (the stock/adapter comparison this extends)


def patch_installed_vllm(series: Path, root: Path) -> Path:
    import vllm

    shutil.copytree(Path(vllm.__path__[0]), root / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    patches = sorted(str(p) for p in series.glob("*.patch"))
    subprocess.run(["git", "apply", "--check", *patches], cwd=root, check=True)
    subprocess.run(["git", "apply", *patches], cwd=root, check=True)
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--series", type=Path, default=REPO / "upstream_patches" / "vllm" / "0.25.0")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--styles", nargs="+", default=list(vllm_check.MODEL_SPECS), choices=vllm_check.STYLES)
    args = parser.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    root = patch_installed_vllm(args.series, Path(tempfile.mkdtemp(prefix="vllm-patched-")))
    pythonpath = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(root / "tests" / "kernels" / "core" / "test_standard_kernels.py")],
                          cwd=root, env={**os.environ, "PYTHONPATH": pythonpath}, capture_output=True, text=True)
    (args.outdir / "series_test.log").write_text(test.stdout + test.stderr)

    vllm_check.VARIANT_ENV["patched"] = {"PYTHONPATH": pythonpath, "VLLM_USE_STANDARD_KERNELS": "1"}
    sys.argv = [vllm_check.__file__, str(args.outdir), "--tp", str(args.tp), "--styles", *args.styles,
                "--variants", "stock", "sk", "patched"]
    status = vllm_check.main()

    launches = sorted({line.split("] ", 1)[-1].strip() for log in args.outdir.glob("vllm-check-*/*-patched.log")
                       for line in log.read_text().splitlines() if "Standard Kernels: first launch" in line})
    report = ((args.outdir / "vllm_check.md").read_text()
              + f"\nSeries: `{args.series}`; its own test on the GPU: "
              + (test.stdout.strip().splitlines() or ["no output"])[-1] + "\n\nExported kernels launched in the "
              "patched engines:\n\n" + ("\n".join(f"- {line}" for line in launches) or "- none") + "\n")
    (args.outdir / "export_check.md").write_text(report)
    print(report)
    return status or test.returncode or (0 if launches else 1)


if __name__ == "__main__":
    sys.exit(main())
