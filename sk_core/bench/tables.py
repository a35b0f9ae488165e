"""The benchmarks' Markdown tables: one way to print a cell and the failures under a table."""
from __future__ import annotations


def cell(value, fmt: str = "{:.1f}") -> str:
    """A table cell: `value` formatted, or "–" when it is missing or NaN."""
    return "–" if value is None or value != value else fmt.format(value)


def failure_lines(rows: list[dict], key: str) -> list[str]:
    """The lines under a table naming each row's failed implementations (rows carry them under "failures")."""
    failures = [(r[key], r["M"], r["failures"]) for r in rows if r.get("failures")]
    return ["", "Failures:", ""] + [f"- {name} M={m}: {failed}" for name, m, failed in failures] if failures else []


def heading(what: str, env: dict, command: str, bw_tbps: float, note: str) -> list[str]:
    """A results table's first lines: what ran on which GPU and when, the command, versions, copy bandwidth."""
    return [f"# {what} on {env['gpu']} ({env['date']})", "", f"`{command}`  ",
            f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}; copy bandwidth {bw_tbps:.2f} TB/s. "
            f"{note}", ""]
