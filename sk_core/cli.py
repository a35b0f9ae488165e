"""The `sk` command: the ops and their coverage, an install self-check, peer benchmarks, and the optimization
workflow (workloads, capture, operator map, candidate stubs, kernel bench, end-to-end eval; sk.workflow).

Bad input (unknown op, missing capture, malformed scenario, mismatched candidate) is a WorkflowError: its
message is printed and the exit code is 2, without a traceback. Bad option values (a count below 1, an output
folder that is a file) are refused by argparse (sk.argtypes), also with exit code 2, before any work starts."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sk.argtypes import non_negative_float, output_dir, positive_int

console = Console(width=160)


def cmd_list(args) -> int:
    from sk import coverage, ops

    if args.workloads:
        return list_workloads()
    if args.map:
        return list_map(args.map, Path(args.captures))
    if args.markdown:  # the README's table is this output (tests/test_package.py)
        print(coverage.markdown_table())
        return 0

    table = Table(title="Kernel Coverage", show_lines=False)
    table.add_column("Op", no_wrap=True)  # names stay whole however narrow the terminal
    for column in ("Precision", "Hardware", "Shape", "Provenance", "Training", "Inference"):
        table.add_column(column)
    tick = {True: "✓", False: "✗"}
    for e in coverage.table().values():
        table.add_row(e.op, ", ".join(e.precisions), ", ".join(h.upper() for h in e.hardware), e.shape,
                      e.provenance, f"{tick[e.training]} {e.training_note}".strip(), tick[e.inference])
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


def list_workloads() -> int:
    from sk.workflow.workloads import SPECS

    table = Table(title="Workloads (use the token in a scenario's workloads: list)")
    for column in ("Token", "Name", "Dataset", "Purpose", "Parameters"):
        table.add_column(column)
    for member, spec in SPECS.items():
        table.add_row(member.token, member.value, spec.dataset, spec.purpose.value, spec.parameters())
    console.print(table)
    return 0


def list_map(arch: str, capture_dir: Path) -> int:
    import importlib.util

    from sk.workflow.capture import distinct_calls
    from sk.workflow.operators import architecture, operators_of_layers

    if importlib.util.find_spec("vllm") is not None:
        from sk.workflow.engine_map import architecture_layers, resolve_architecture

        distinct_calls(capture_dir, resolve_architecture(arch)[0])  # a broken capture folder: refused before the walk
        model_type, cls_name, layers = architecture_layers(arch)
        engine_classes: dict[str, list[str]] = {}
        for layer in layers:
            engine_classes.setdefault(layer["op"], []).append(layer["class"])
        operators = operators_of_layers(list(layers))
        title = f"Operators of {model_type} ({cls_name}) in the installed vLLM, and Standard Kernels coverage"
    else:
        model_type, operators = arch, architecture(arch)
        engine_classes = {op.name: [op.vllm_class] for op in operators}
        title = f"Operators of {arch} in vLLM (built-in list: vLLM is not installed), and Standard Kernels coverage"
    captured = distinct_calls(capture_dir, model_type)
    table = Table(title=title)
    columns = ("Operator", "vLLM class", "Standard Kernels", "Baseline / stub", f"Captured shapes ({capture_dir}/)")
    for column in columns:
        table.add_column(column)
    for op in operators:
        table.add_row(op.name, ", ".join(engine_classes[op.name]),
                      ", ".join(f"sk.ops.{o}" for o in op.sk_ops) or "[dim]not covered",
                      "yes" if op.baseline else "[dim]no", str(captured.get(op.name, 0)) if captured else "-")
    for name in sorted(set(captured) - {op.name for op in operators}):
        table.add_row(name, "[yellow]captured, not in vLLM's model class", "", "", str(captured[name]))
    console.print(table)
    return 0


def cmd_capture(args) -> int:
    from sk.workflow import capture

    for path in capture.run(args.scenario, Path(args.out), args.max_layers, args.max_requests):
        console.print(f"wrote {path}")
    return 0


def cmd_create_stubs(args) -> int:
    from sk.workflow import stubs

    for op, outcome in stubs.create(args.architecture, Path(args.candidates), args.force).items():
        console.print(f"{op:<28} {outcome}")
    return 0


def cmd_eval(args) -> int:
    from sk.workflow import evaluate

    passed = evaluate.run(args.scenario, Path(args.out), enforce_eager=args.enforce_eager, max_layers=args.max_layers,
                          max_requests=args.max_requests, candidates=args.candidates, console=console,
                          rounds=args.rounds, self_test=args.self_test, workloads=_tokens(args.workloads),
                          tie_nats=evaluate.DEFAULT_TIE_NATS if args.tie_nats is None else args.tie_nats,
                          restarts=_restarts(args))
    return 0 if passed else 1


def _restarts(args) -> int:
    """--restarts N, or 2 for --crossed (its shorthand); both only where they agree."""
    from sk.workflow.errors import WorkflowError

    if args.crossed and args.restarts not in (None, 2):
        raise WorkflowError(f"--crossed is --restarts 2; got --restarts {args.restarts} too (drop one of the two)")
    return 2 if args.crossed else args.restarts or 1


def _tokens(value: str | None) -> list[str] | None:
    return [t.strip() for t in value.split(",") if t.strip()] if value else None


def cmd_profile(args) -> int:
    from sk.workflow import profile
    from sk.workflow.errors import WorkflowError

    if args.compare:
        if args.scenario:
            raise WorkflowError(f"sk profile --compare reads two profiles and runs nothing: drop the scenario "
                                f"{args.scenario!r}")
        profile.run_compare(*args.compare, console=console)
        return 0
    if not args.scenario:
        raise WorkflowError("sk profile needs a scenario YAML (or --compare BASE.json CANDIDATE.json)")
    if args.both and args.sk:
        raise WorkflowError("sk profile --both profiles stock and then ours: drop --sk")
    profile.run(args.scenario, Path(args.out), with_sk=args.sk, enforce_eager=args.enforce_eager,
                max_layers=args.max_layers, max_requests=args.max_requests, console=console,
                workloads=_tokens(args.workloads), both=args.both, side_by_side=args.side_by_side)
    return 0


def cmd_bench(args) -> int:
    import torch

    if args.target:
        from sk.workflow import kernel_bench

        passed = kernel_bench.run(args.target, Path(args.captures), Path(args.candidates), args.self_test, console,
                                  args.max_shapes)
        return 0 if passed else 1

    if not torch.cuda.is_available():
        console.print("[red]sk bench --peers needs a CUDA GPU: its timings are CUDA-graph replays[/red]")
        return 2
    from sk.bench import peers

    peers.run(args.out)
    console.print(f"results in {args.out}/ops_peers.{{json,md,png}}")
    return 0


def _engine_run_options(parser: argparse.ArgumentParser, scenario_optional: bool = False) -> None:
    parser.add_argument("scenario", nargs="?" if scenario_optional else None,
                        help="scenario YAML (e.g. scenarios/tiny.yaml); every row in it runs")
    parser.add_argument("--max-layers", type=positive_int, metavar="N",
                        help="build the model with only this many layers, 1 or more (cheap loops)")
    parser.add_argument("--max-requests", type=positive_int, metavar="N",
                        help="cap each throughput workload's request count (1 or more)")


def _workloads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", metavar="TOKENS",
                        help="comma-separated workloads instead of the rows' own "
                             "(e.g. LLM.decode_batch_1,LLM.throughput)")


def main(argv: list[str] | None = None) -> int:
    from sk.workflow.candidates import default_dir
    from sk.workflow.errors import WorkflowError
    from sk.workflow.paired import DEFAULT_ROUNDS

    parser = argparse.ArgumentParser(prog="sk", description="Standard Kernels: fused GPU kernels for LLM layers.")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="the ops and the coverage table; the workloads; an architecture's operators")
    shown = listing.add_mutually_exclusive_group()
    shown.add_argument("--markdown", action="store_true", help="the coverage table as Markdown, as in the README")
    shown.add_argument("--workloads", action="store_true", help="the workloads scenarios can name")
    shown.add_argument("--map", metavar="ARCH", help="the operators architecture ARCH uses, and which we cover")
    listing.add_argument("--captures", default="captures", help="capture folder counted by --map")
    listing.set_defaults(func=cmd_list)
    sub.add_parser("selfcheck", help="run every op once, kernel against reference").set_defaults(func=cmd_selfcheck)

    capture = sub.add_parser("capture", help="record the operators the engine executes per scenario and workload")
    _engine_run_options(capture)
    capture.add_argument("--out", type=output_dir, default="captures",
                         help="folder for the JSON files (one per scenario·workload)")
    capture.set_defaults(func=cmd_capture)

    stubs = sub.add_parser("create-stubs", help="candidate modules to edit, one per operator of an architecture")
    stubs.add_argument("--architecture", required=True, metavar="ARCH")
    stubs.add_argument("--candidates", type=output_dir, default=str(default_dir()),
                       help="candidate folder (default: $SK_CANDIDATE_DIR or candidates/)")
    stubs.add_argument("--force", action="store_true", help="overwrite existing candidate files")
    stubs.set_defaults(func=cmd_create_stubs)

    bench = sub.add_parser("bench", help="kernel bench of a candidate on captured shapes, or the ops against peers")
    what = bench.add_mutually_exclusive_group(required=True)
    what.add_argument("--target", metavar="OP", help="operator to bench, baseline vs candidate, on captured shapes")
    what.add_argument("--peers", action="store_true",
                      help="(GPU) every op side by side with PyTorch eager, torch.compile and importable peer kernels")
    bench.add_argument("--self-test", action="store_true", help="with --target: the baseline against itself (~1.0x)")
    bench.add_argument("--captures", default="captures", help="with --target: capture folder")
    bench.add_argument("--candidates", default=str(default_dir()), help="with --target: candidate folder")
    bench.add_argument("--max-shapes", type=positive_int, metavar="N",
                       help="with --target: only the most frequent N shapes (1 or more)")
    bench.add_argument("--out", type=output_dir, default="results/bench",
                       help="with --peers: output folder (JSON, Markdown, PNG)")
    bench.set_defaults(func=cmd_bench)

    evaluate = sub.add_parser("eval", help="end to end: stock engine vs our kernels, throughput, latency, tokens")
    _engine_run_options(evaluate)
    evaluate.add_argument("--enforce-eager", action="store_true", help="no compilation or CUDA graphs in either run")
    evaluate.add_argument("--candidates", type=Path, metavar="DIR",
                          help="candidate = your modules in DIR (sk create-stubs) instead of Standard Kernels' adapter")
    evaluate.add_argument("--out", type=output_dir, default="results/eval",
                          help="folder for the JSON, the PNG chart and engine logs")
    evaluate.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS, metavar="N",
                          help=f"paired rounds per workload, each one timed batch per engine, A B B A ...: even, "
                               f"and with --restarts a multiple of twice its N (default {DEFAULT_ROUNDS})")
    _workloads_option(evaluate)
    evaluate.add_argument("--self-test", action="store_true",
                          help="the stock engine as both baseline and candidate: every interval should hold 1.00")
    evaluate.add_argument("--restarts", type=positive_int, default=None, metavar="N",
                          help="start the pair of engines N times, N 1 or even (baseline first, then candidate "
                               "first, ...), "
                               "the rounds split between the pairs and pooled: a difference between the engine "
                               "started first and the one started second cancels, and the interval, resampling "
                               "the pairs and then their rounds, holds what differs from one engine start to the "
                               "next (default 1)")
    evaluate.add_argument("--crossed", action="store_true", help="shorthand for --restarts 2")
    evaluate.add_argument("--tie-nats", type=non_negative_float, default=None, metavar="NATS",
                          help="a sequence that first differs where both engines hold both tokens in their top 20 "
                               "and disagree on the two tokens' log-probability difference by at most NATS is a "
                               "near-tie, not a mismatch (default 1.0: four bf16 steps of a logit in [32, 64); "
                               "two stock vLLM engines disagreed by up to 0.75 on an H200; 0 counts every "
                               "difference)")
    evaluate.set_defaults(func=cmd_eval)

    profile = sub.add_parser("profile", help="where a step's time goes: GPU time per kernel class, idle gaps, "
                                            "kernels per step, per workload")
    _engine_run_options(profile, scenario_optional=True)
    profile.add_argument("--compare", nargs=2, metavar=("BASE.json", "CANDIDATE.json"),
                         help="instead of profiling: two earlier profiles side by side per engine step (e.g. stock, "
                              "then --sk), each class's and each top kernel's time and the difference")
    profile.add_argument("--sk", action="store_true", help="profile with our adapter on (default: the stock engine)")
    profile.add_argument("--both", action="store_true",
                         help="profile the stock engine, then ours, on this device (OUT/stock/, OUT/sk/), and "
                              "compare them (OUT/SCENARIO.compare.txt)")
    profile.add_argument("--side-by-side", action="store_true",
                         help="with --both: start both engines first, each with its share of the device as `sk "
                              "eval` pairs them, and profile one while the other idles")
    profile.add_argument("--enforce-eager", action="store_true", help="no compilation or CUDA graphs")
    profile.add_argument("--out", type=output_dir, default="results/profile", help="folder for the JSON and PNG")
    _workloads_option(profile)
    profile.set_defaults(func=cmd_profile)

    from sk.evals.gate import main as gate_main
    from sk.export.command import add_arguments as export_arguments
    from sk.export.command import run as cmd_export

    export = sub.add_parser("export", help="upstream patch series of our kernels against vLLM/SGLang sources")
    export_arguments(export)
    export.set_defaults(func=cmd_export)

    # The gate parses its own arguments (sk.evals.gate); listed here for `sk --help`.
    sub.add_parser("gate", add_help=False, help="lm-eval accuracy gate: stock kernels vs ours in the engine")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gate"]:
        return gate_main(argv[1:])

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except WorkflowError as e:
        console.print(f"[red]sk {args.command}: {e}", highlight=False, soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
