"""One `git format-patch`-style file: a fixed mail header, the message, checksums of the files it changes, a
diffstat and unified diffs that `git apply` / `git am` accept.

Nothing varies between runs: the commit hash is zeros, the author and date are fixed, diffs are computed with
difflib from the texts given.
"""
from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass

AUTHOR = "Standard Kernels <standardkernels@users.noreply.github.com>"
# A fixed date keeps regenerated series byte-identical; git am records it as the author date.
DATE = "Sun, 29 Nov 2026 00:00:00 +0000"
SIGNATURE = "standardkernels sk export"


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the engine's repository root
    before: str | None  # None: the patch creates the file
    after: str


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _diff(change: FileChange) -> str:
    old = [] if change.before is None else change.before.splitlines(keepends=True)
    new = change.after.splitlines(keepends=True)
    head = [f"diff --git a/{change.path} b/{change.path}\n"]
    if change.before is None:
        head.append("new file mode 100644\n")
    hunks = list(difflib.unified_diff(old, new, "/dev/null" if change.before is None else f"a/{change.path}",
                                      f"b/{change.path}", n=3))
    for line in hunks:
        if not line.endswith("\n"):
            raise ValueError(f"{change.path}: files must end with a newline")
    return "".join(head + hunks)


def _diffstat(changes: list[FileChange]) -> str:
    rows, added, removed = [], 0, 0
    width = max(len(c.path) for c in changes)
    for change in changes:
        lines = _diff(change).splitlines()[1:]
        plus = sum(1 for l in lines if l.startswith("+") and not l.startswith("+++"))
        minus = sum(1 for l in lines if l.startswith("-") and not l.startswith("---"))
        added, removed = added + plus, removed + minus
        rows.append(f" {change.path.ljust(width)} | {plus + minus} {'+' * min(plus, 40)}{'-' * min(minus, 40)}")
    files = f"{len(changes)} file{'s' if len(changes) != 1 else ''} changed"
    return "\n".join(rows + [f" {files}, {added} insertions(+), {removed} deletions(-)"]) + "\n"


def checksum_lines(changes: list[FileChange]) -> str:
    """The sha256 of each changed file before and after the patch (`none` for a file the patch creates)."""
    width = max(len(c.path) for c in changes)
    rows = [f"  {c.path.ljust(width)}  {'none' if c.before is None else sha256(c.before)} -> {sha256(c.after)}"
            for c in changes]
    return "sha256 of the changed files (before -> after):\n" + "\n".join(rows) + "\n"


def render(number: int, total: int, subject: str, message: str, target: str, changes: list[FileChange]) -> str:
    """Patch `number` of `total`; `target` names the engine version it applies to."""
    header = (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: {AUTHOR}\n"
              f"Date: {DATE}\nSubject: [PATCH {number}/{total}] {subject}\n\n")
    body = f"{message.rstrip()}\n\nTarget: {target}\n{checksum_lines(changes)}---\n{_diffstat(changes)}\n"
    return header + body + "".join(_diff(c) for c in changes) + f"-- \n{SIGNATURE}\n"

