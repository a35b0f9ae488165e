"""H200 check of an exported series: the patched engine, side by side with the stock engine and with our adapter.

    python3 ci/gpu/export_check.py OUTDIR [--engine vllm|sglang] [--series DIR] [--tp 2] [--styles llama gemma]

1. Copies the installed engine package to a temporary folder laid out as the engine's repository (vLLM: vllm/,
   SGLang: python/sglang/) and applies the series there (`git apply --check` first).
2. Runs the series' own kernel test from the patched tree on the GPU.
3. Runs the engine's comparison (ci/gpu/vllm_check.py, ci/gpu/sglang_check.py) with a third variant, "patched":
   the engine imported from the patched copy with the series' switch on and our adapter off (bf16, the engine's
   default compile and CUDA graphs; tokens, throughput, decode latency).
4. Writes OUTDIR/export_check.md: that table, plus the exported kernels' first-launch lines from each patched
   engine's log (the adapter's per-process counts do not apply to the patched engine).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))


@dataclasses.dataclass(frozen=True)
class EngineLayout:
    check: str  # the comparison script's module, beside this file
    package_dir: str  # where the package sits in the engine's repository
    test: str  # the series' own test, in the repository
    switch: str  # the series' opt-in environment variable
    series: str  # the default series


ENGINES = {
    "vllm": EngineLayout("vllm_check", "vllm", "tests/kernels/core/test_standard_kernels.py",
                         "VLLM_USE_STANDARD_KERNELS", "vllm/0.25.0"),
    "sglang": EngineLayout("sglang_check", "python/sglang", "test/srt/test_standard_kernels.py",
                           "SGLANG_USE_STANDARD_KERNELS", "sglang/0.5.17"),
}


def patch_installed(engine: str, series: Path, root: Path) -> Path:
    """The installed `engine` copied under `root` as in its repository, with `series` applied; the folder to put
    on PYTHONPATH."""
    package_dir = root / ENGINES[engine].package_dir
    shutil.copytree(Path(importlib.import_module(engine).__path__[0]), package_dir,
                    ignore=shutil.ignore_patterns("__pycache__"))
    patches = sorted(str(p.resolve()) for p in series.glob("*.patch"))
    subprocess.run(["git", "apply", "--check", *patches], cwd=root, check=True)
    subprocess.run(["git", "apply", *patches], cwd=root, check=True)
    return package_dir.parent


def absent_test_dependencies(folder: Path) -> str | None:
    """A folder of stand-ins for the engines' test-only imports the GPU host lacks, or None if it has them all.
    SGLang's test utilities import its benchmark datasets, which import Hugging Face `datasets` (not on the host,
    no package index there); the series' test never loads a dataset, so a stand-in that raises when used is enough
    (results/h200/engines/README.md, 2026-12-05 evening)."""
    if importlib.util.find_spec("datasets") is not None:
        return None
    (folder / "datasets").mkdir(parents=True, exist_ok=True)
    (folder / "datasets" / "__init__.py").write_text(
        "def load_dataset(*args, **kwargs):\n"
        "    raise ImportError('datasets is not installed (a stand-in for the series test, ci/gpu/export_check.py)')\n")
    return str(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--engine", choices=list(ENGINES), default="vllm")
    parser.add_argument("--series", type=Path, help="series folder (default: the engine's H200 version)")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--styles", nargs="+", default=["llama", "gemma"])
    args = parser.parse_args()
    layout = ENGINES[args.engine]
    series = args.series or REPO / "upstream_patches" / layout.series
    check = importlib.import_module(layout.check)
    args.outdir.mkdir(parents=True, exist_ok=True)

    root = Path(tempfile.mkdtemp(prefix=f"{args.engine}-patched-"))
    importable = patch_installed(args.engine, series, root)
    pythonpath = os.pathsep.join(p for p in (str(importable), os.environ.get("PYTHONPATH", "")) if p)
    test_path = os.pathsep.join(filter(None, (absent_test_dependencies(root / "test-stubs"), pythonpath)))
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / layout.test)],
                          cwd=root, env={**os.environ, "PYTHONPATH": test_path}, capture_output=True, text=True)
    (args.outdir / "series_test.log").write_text(test.stdout + test.stderr)

    check.VARIANT_ENV["patched"] = {"PYTHONPATH": pythonpath, layout.switch: "1"}
    sys.argv = [check.__file__, str(args.outdir), "--tp", str(args.tp), "--styles", *args.styles,
                "--variants", "stock", "sk", "patched", *(["--no-serve"] if args.engine == "sglang" else [])]
    status = check.main()

    launches = sorted({line.split("] ", 1)[-1].strip() for log in args.outdir.glob("*-check-*/*-patched.log")
                       for line in log.read_text().splitlines() if "Standard Kernels: first launch" in line})
    report = ((args.outdir / f"{layout.check}.md").read_text()
              + f"\nSeries: `{series}`; its own test on the GPU: "
              + (test.stdout.strip().splitlines() or ["no output"])[-1] + "\n\nExported kernels launched in the "
              "patched engines:\n\n" + ("\n".join(f"- {line}" for line in launches) or "- none") + "\n")
    (args.outdir / "export_check.md").write_text(report)
    print(report)
    return status or test.returncode or (0 if launches else 1)


if __name__ == "__main__":
    sys.exit(main())
