"""A Python that sees an engine's site-packages, with the engine package replaced by a patched copy and without
Standard Kernels: the editable install's finder and metadata are left out, so `import sk` fails there and in
every process the engine starts (they run the same interpreter and read the same `.pth`).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

# Entries of site-packages that would make our package importable or visible (entry points).
_OURS = ("__editable__", "standardkernels-")


def copy_package(site_packages: Path, package: str, dest: Path) -> Path:
    """A pristine copy of the installed `package` at dest/package (bytecode caches left out)."""
    shutil.copytree(site_packages / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    return dest / package


def make(site_packages: Path, root: Path, work: Path) -> Path:
    """The path of a python whose sys.path is `root` (holding the patched package) and then site-packages'
    other entries. `.pth` files of site-packages are not processed there (the editable finder is one)."""
    package_names = {p.name for p in root.iterdir()}
    overlay = work / "site-overlay"
    overlay.mkdir()
    for entry in site_packages.iterdir():
        if entry.name.startswith(_OURS) or entry.suffix == ".pth" or entry.name in package_names:
            continue
        (overlay / entry.name).symlink_to(entry)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (next((venv / "lib").glob("python*/site-packages")) / "patched-engine.pth").write_text(f"{root}\n{overlay}\n")
    return venv / "bin" / "python"
