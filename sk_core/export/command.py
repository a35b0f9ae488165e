"""`sk export`: write an upstream patch series for an engine version (the `main(argv)` behind the subcommand)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sk.argtypes import existing_dir, output_dir
from sk.export.kernel_module import ALL_OPS
from sk.export.series import ENGINES, ExportRefused, build, write
from sk.export.source_tree import open_tree

REPO = Path(__file__).resolve().parents[2]


def _ops(value: str) -> tuple[str, ...]:
    ops = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [op for op in ops if op not in ALL_OPS]
    if unknown or not ops:
        raise argparse.ArgumentTypeError(f"unknown op(s) {', '.join(unknown) or '(none)'}; known: {', '.join(ALL_OPS)}")
    return tuple(op for op in ALL_OPS if op in ops)  # canonical order: the output does not depend on the spelling


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `sk export` (shared by `main` and the `sk` command's subparser)."""
    parser.add_argument("--engine", choices=sorted(ENGINES), required=True)
    parser.add_argument("--ops", type=_ops, default=ALL_OPS,
                        help=f"comma-separated, default all: {','.join(ALL_OPS)}")
    parser.add_argument("--source", help="pristine engine sources: a folder holding the package (e.g. a "
                                         "site-packages) or a wheel; default: the engine installed in this Python")
    parser.add_argument("--out", type=output_dir, help="default: upstream_patches/<engine>/<version>/")
    parser.add_argument("--results", type=existing_dir, default=REPO / "results",
                        help="folder of our committed results (an existing folder); the PR tables are the files "
                             "in it that sk.export.pr_description.RESULT_FILES names")


def run(args: argparse.Namespace) -> int:
    try:
        tree = open_tree(args.engine, args.source)
        files = build(tree, args.ops, args.results)
        out = args.out or REPO / "upstream_patches" / args.engine / tree.version()
    except (ExportRefused, FileNotFoundError, ValueError) as refused:
        print(f"sk export: refused: {refused}", file=sys.stderr)
        return 2
    write(files, out)
    print(f"sk export: {len(files)} files for {args.engine} {tree.version()} ({', '.join(args.ops)}) in {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sk export", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
