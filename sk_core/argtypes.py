"""argparse `type=` functions shared by the `sk` subcommands: a bad value is refused while the arguments are
parsed, before any engine starts or any file is written, with argparse's one-line message
("argument --limit: -1 is not allowed: expected a whole number, 1 or more") and exit code 2."""
from __future__ import annotations

import argparse
from pathlib import Path


def positive_int(value: str) -> int:
    """A count, limit or size: a whole number of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number; expected 1 or more") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: expected a whole number, 1 or more")
    return number


def non_negative_float(value: str) -> float:
    """A tolerance: a finite number, 0 or more."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number; expected 0 or more") from None
    if not 0 <= number < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} is not allowed: expected a finite number, 0 or more")
    return number


def output_dir(value: str) -> Path:
    """A folder to write into, existing or to be created: refused when it, or the nearest part of it that
    exists, is not a folder (mkdir would fail there only after the work is done)."""
    path = Path(value)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        what = "it is" if existing == path else f"{existing} is"
        raise argparse.ArgumentTypeError(f"{value}: {what} a file, not a folder; expected a folder "
                                         "(existing or to be created)")
    return path


def existing_dir(value: str) -> Path:
    """A folder to read from, which must exist."""
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} {'is not a folder' if path.exists() else 'does not exist'}; "
                                         "expected an existing folder")
    return path


def key_value(value: str) -> tuple[str, str]:
    """KEY=VALUE, KEY not empty (an environment variable for a child process)."""
    key, sep, rest = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE (e.g. TRITON_INTERPRET=1)")
    return key, rest
