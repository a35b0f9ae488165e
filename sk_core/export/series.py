"""Assemble one engine version's series: check the source tree, generate the kernel module, the wiring and the
test, render the numbered patches and the cover letter, and write them."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

from sk.export import kernel_module, patch_format, pr_description, sglang_series, vllm_series
from sk.export.known_versions import KNOWN
from sk.export.source_edits import apply_all
from sk.export.source_tree import SourceTree

ENGINES = {"vllm": vllm_series, "sglang": sglang_series}
PR_DESCRIPTION = "PR_DESCRIPTION.md"


class ExportRefused(RuntimeError):
    pass


def check_tree(tree: SourceTree) -> str:
    """The version's label, or ExportRefused naming the unknown version or the first file that differs."""
    version = tree.version()
    known = KNOWN.get((tree.engine, version))
    if known is None:
        versions = ", ".join(v for e, v in KNOWN if e == tree.engine)
        raise ExportRefused(f"sk export does not know {tree.engine} {version} (from {tree.location}); "
                            f"known: {versions}")
    for path, expected in known.checksums.items():
        text = tree.read(path)
        if text is None:
            raise ExportRefused(f"{tree.engine} {version} at {tree.location} has no {path}")
        if patch_format.sha256(text) != expected:
            raise ExportRefused(f"{path} in {tree.location} differs from pristine {tree.engine} {version} (sha256 "
                                f"{patch_format.sha256(text)}, recorded {expected}): export needs unmodified sources")
    return known.label


def _filename(number: int, subject: str) -> str:
    return f"{number:04d}-{re.sub(r'[^A-Za-z0-9]+', '-', subject).strip('-')[:52].rstrip('-')}.patch"


def build(tree: SourceTree, ops: tuple[str, ...], results: Path) -> dict[str, str]:
    """File name -> text of the series for `ops` against `tree`."""
    target = check_tree(tree)
    engine = ENGINES[tree.engine]
    kernel = kernel_module.render(ops, engine.KERNEL_HEADER, engine.OP_NAMESPACE)
    wiring = [patch_format.FileChange(path, None, text) for path, text in engine.new_files(ops).items()]
    edits = engine.edits(ops)
    for path in dict.fromkeys(e.path for e in edits):
        before = tree.read(path)
        wiring.append(patch_format.FileChange(path, before, apply_all(before, [e for e in edits if e.path == path])))
    op_list = ", ".join(ops)
    patches = [
        ("Add Standard Kernels' Triton kernels",
         textwrap.fill(f"Adds {engine.KERNEL_PATH}: Triton kernels for {op_list}, wrapped as torch custom ops "
                       f"({engine.OP_NAMESPACE}::standard_kernels_*). Nothing uses them yet.", 100),
         [patch_format.FileChange(engine.KERNEL_PATH, None, kernel)]),
        (f"Use Standard Kernels' kernels in the layers when {engine.SWITCH}=1",
         "The series, under the engine's conventions (this patch is the wiring):\n\n"
         + engine.__doc__.split("\n\n", 1)[1].strip(), wiring),
        ("Test Standard Kernels' kernels",
         f"Adds {engine.TEST_PATH}, which runs on CUDA or, on CPU, under TRITON_INTERPRET=1.",
         [patch_format.FileChange(engine.TEST_PATH, None, engine.test_file(ops))]),
    ]
    total = len(patches)
    files = {}
    for number, (subject, message, changes) in enumerate(patches, 1):
        files[_filename(number, subject)] = patch_format.render(number, total, subject, message, target, changes)
    # Markdown beside the patches rather than a cover-letter patch, so that `git apply DIR/*.patch` works.
    files[PR_DESCRIPTION] = pr_description.render(tree.engine, target, ops, engine.SWITCH, results, list(files))
    return dict(sorted(files.items()))


def write(files: dict[str, str], out: Path) -> None:
    """Replace the series in `out` (stale patches from an earlier op selection are removed)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.patch"), out / PR_DESCRIPTION]:
        if old.exists() and old.name not in files:
            old.unlink()
    for name, text in files.items():
        (out / name).write_text(text)
