"""The `sk` command: list the ops and their coverage, benchmark them against peers, check an install."""
from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

console = Console(width=160)


def cmd_list(args) -> int:
    from sk import coverage, ops

    if args.markdown:  # the README's table is this output (tests/test_coverage_table.py)
        print(coverage.markdown_table())
        return 0

    table = Table(title="Kernel Coverage", show_lines=False)
    for column in ("Op", "Precision", "Hardware", "Shape", "Provenance", "Training", "Inference"):
        table.add_column(column)
    tick = {True: "✓", False: "✗"}
    for e in coverage.table().values():
        table.add_row(e.op, ", ".join(e.precisions), ", ".join(h.upper() for h in e.hardware), e.shape,
                      e.provenance, tick[e.training], tick[e.inference])
    console.print(table)
    console.print("ops: " + ", ".join(f"sk.ops.{name}" for name in ops.__all__))
    return 0


def cmd_selfcheck(args) -> int:
    """Run every op once on the available device, kernel against reference; exit 1 on a mismatch."""
    import torch

    from sk import coverage, ops
    from sk.ops.act_and_mul import act_and_mul_reference
    from sk.ops.rms_norm import fused_add_rms_norm_reference, rms_norm_reference

    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(7, 1023, device=device)
    r, w = torch.randn_like(x), torch.randn(1023, device=device)
    checks = {
        "rms_norm": (ops.rms_norm(x, w), rms_norm_reference(x, w, 1e-6)),
        "gemma_rms_norm": (ops.gemma_rms_norm(x, w), rms_norm_reference(x, w, 1e-6, 1.0)),
        "fused_add_rms_norm": (ops.fused_add_rms_norm(x, r, w)[0], fused_add_rms_norm_reference(x, r, w, 1e-6)[0]),
        "silu_and_mul": (ops.silu_and_mul(x[:, :1022]), act_and_mul_reference(x[:, :1022], "silu")),
        "gelu_and_mul": (ops.gelu_and_mul(x[:, :1022]), act_and_mul_reference(x[:, :1022], "gelu")),
    }
    report = coverage.report()
    failed = 0
    for name, (got, expected) in checks.items():
        err = ((got - expected).norm() / expected.norm()).item()
        ok = err < 1e-5  # fp32 inputs: one fp32 rounding per element
        failed += not ok
        console.print(f"{'OK ' if ok else 'BAD'} {name:<20} rel. error {err:.1e}")
    path = "kernel" if report["kernel_calls"] else "PyTorch reference (" + report["fallbacks"][0]["reason"] + ")"
    console.print(f"device {device}; path taken: {path}")
    return 1 if failed else 0


def cmd_bench(args) -> int:
    import torch

    if not torch.cuda.is_available():
        console.print("[red]sk bench --peers needs a CUDA GPU: its timings are CUDA-graph replays[/red]")
        return 2
    from sk.bench import peers

    peers.run(args.out)
    console.print(f"results in {args.out}/ops_peers.{{json,md,png}}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sk", description="Standard Kernels: fused GPU kernels for LLM layers.")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="the ops and the Kernel Coverage table")
    listing.add_argument("--markdown", action="store_true", help="the coverage table as Markdown, as in the README")
    listing.set_defaults(func=cmd_list)
    sub.add_parser("selfcheck", help="run every op once, kernel against reference").set_defaults(func=cmd_selfcheck)
    bench = sub.add_parser("bench", help="benchmark the ops on a GPU")
    bench.add_argument("--peers", action="store_true", required=True,
                       help="side by side with PyTorch eager, torch.compile and importable peer kernels")
    bench.add_argument("--out", default="results/bench", help="output folder (JSON, Markdown, PNG)")
    bench.set_defaults(func=cmd_bench)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
