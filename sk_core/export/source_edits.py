"""Edits to an engine's pristine source files, located by an anchor rather than a line number.

An anchor is a line (matched on its stripped text, by prefix) that must occur exactly once in the file or in one
class, or the end of a method found with `ast`; the engine file's checksum is verified before any edit, so an
anchor that moved is a bug in the recorded version, reported with the file's name.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass


class AnchorError(RuntimeError):
    pass


def _class_span(text: str, path: str, cls: str) -> tuple[int, int]:
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return node.lineno - 1, node.end_lineno
    raise AnchorError(f"{path}: no class {cls}")


def _one_line(lines: list[str], source: str, path: str, anchor: str, cls: str | None) -> int:
    """The index of the one line (within class `cls`, if given) whose stripped text starts with `anchor`."""
    start, end = _class_span(source, path, cls) if cls else (0, len(lines))
    hits = [i for i in range(start, end) if lines[i].strip().startswith(anchor)]
    if len(hits) != 1:
        where = f" in class {cls}" if cls else ""
        raise AnchorError(f"{path}: expected one line starting {anchor!r}{where}, found {len(hits)}")
    return hits[0]


@dataclass(frozen=True)
class InsertAtLine:
    """Insert `text` after (or before) the one line of `path` (within class `cls`, if given) starting `anchor`."""

    path: str
    anchor: str
    text: str
    cls: str | None = None
    before: bool = False

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        hit = _one_line(lines, source, self.path, self.anchor, self.cls)
        at = hit if self.before else hit + 1
        return "".join(lines[:at] + [self.text] + lines[at:])


@dataclass(frozen=True)
class ReplaceLine:
    """Replace the one line of `path` (within class `cls`, if given) starting `anchor` by `text` (whole lines)."""

    path: str
    anchor: str
    text: str
    cls: str | None = None

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        at = _one_line(lines, source, self.path, self.anchor, self.cls)
        return "".join(lines[:at] + [self.text] + lines[at + 1:])


@dataclass(frozen=True)
class InsertAfterMethod:
    """Insert `text` right after the last line of `cls.method` in `path`."""

    path: str
    cls: str
    method: str
    text: str

    def apply(self, source: str) -> str:
        classes = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == self.cls]
        if not classes:
            raise AnchorError(f"{self.path}: no class {self.cls}")
        methods = [n for n in classes[0].body if isinstance(n, ast.FunctionDef) and n.name == self.method]
        if len(methods) != 1:
            raise AnchorError(f"{self.path}: expected one {self.cls}.{self.method}, found {len(methods)}")
        lines = source.splitlines(keepends=True)
        at = methods[0].end_lineno
        return "".join(lines[:at] + [self.text] + lines[at:])


def apply_all(source: str, edits: list) -> str:
    for edit in edits:
        source = edit.apply(source)
    return source
