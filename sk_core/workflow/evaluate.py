"""`sk eval`: each scenario's workloads in the stock engine (baseline) and with our kernels (candidate).

The two runs are separate processes with identical settings; only the candidate's switch differs:
SK_ADAPTERS=vllm (our adapter replaces vLLM's layers in every engine process), or with `--candidates DIR` the
user's candidate modules (sk.workflow.candidate_worker replaces the layers they are named after). Greedy
decoding with a fixed number of tokens per request makes the token comparison exact: MATCH counts sequences
whose token ids agree entirely, and correctness is PASS only when every sequence of every workload agrees.
"""
from __future__ import annotations

import datetime
import json
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sk import settings
from sk.reports import merge_reports, model_process_reports, read_reports
from sk.workflow import scenarios
from sk.workflow.candidates import candidate_path, load_candidate
from sk.workflow.engine_runner import progress_bars, run_engine_job
from sk.workflow.errors import WorkflowError
from sk.workflow.eval_chart import write_chart
from sk.workflow.operators import OPERATORS
from sk.workflow.workloads import Purpose, resolve

SCHEMA = "standardkernels.eval/1"
CANDIDATE_ENV = {settings.env_name("adapters"): "vllm"}


def first_divergence(baseline: list[list[int]], candidate: list[list[int]]) -> dict | None:
    """The first sequence (and position in it) whose tokens differ, or None when all agree."""
    for seq, (b, c) in enumerate(zip(baseline, candidate)):
        if b != c:
            position = next((i for i, (x, y) in enumerate(zip(b, c)) if x != y), min(len(b), len(c)))
            return {"sequence": seq, "position": position,
                    "baseline_token": b[position] if position < len(b) else None,
                    "candidate_token": c[position] if position < len(c) else None}
    return None


def compare_workload(token: str, baseline: dict, candidate: dict) -> dict:
    matches = sum(b == c for b, c in zip(baseline["tokens"], candidate["tokens"]))
    row = {"workload": token, "name": resolve(token).value, "purpose": baseline["purpose"],
           "sequences": len(baseline["tokens"]), "matches": matches,
           "divergence": first_divergence(baseline["tokens"], candidate["tokens"])}
    if baseline["purpose"] == Purpose.THROUGHPUT.value:
        row.update(input_lens=baseline["input_lens"], output_lens=baseline["output_lens"],
                   baseline_tok_s=baseline["output_tokens_per_s"], candidate_tok_s=candidate["output_tokens_per_s"],
                   speedup=candidate["output_tokens_per_s"] / baseline["output_tokens_per_s"])
    else:
        row.update(batch_size=baseline["batch_size"], output_len=baseline["output_len"],
                   iterations=baseline["iterations"], baseline_median_s=baseline["median_s"],
                   candidate_median_s=candidate["median_s"], speedup=baseline["median_s"] / candidate["median_s"])
    return row


def adapter_summary(report_dir: Path) -> dict:
    """What our adapter did in the candidate's worker processes: replaced layers, kernel calls, fallbacks."""
    workers = model_process_reports(read_reports(report_dir, "vllm"))
    if not workers:
        return {"workers": 0}
    merged = merge_reports(workers)
    fallbacks: dict[str, dict[str, int]] = {}
    for f in merged["coverage"]["fallbacks"]:
        fallbacks.setdefault(f["op"], {}).setdefault(f["reason"], 0)
        fallbacks[f["op"]][f["reason"]] += f["count"]
    return {"workers": len(workers), "replaced": sorted(merged["replaced"]),
            "kernel_calls": merged["coverage"]["kernel_calls"], "fallbacks": fallbacks}


def _lengths(values: list[int]) -> str:
    return str(values[0]) if len(set(values)) == 1 else "var"


def throughput_table(scenario: scenarios.Scenario, rows: list[dict], verdict: str) -> Table:
    table = Table(title=f"THROUGHPUT SUMMARY   {scenario.label}   correctness: {verdict}", title_justify="left")
    for column in ("SCENARIO", "SEQS", "IN", "OUT", "BASELINE tok/s", "CANDIDATE tok/s", "SPEEDUP", "MATCH"):
        table.add_column(column, justify="left" if column == "SCENARIO" else "right")
    for r in rows:
        out = _lengths(r["output_lens"])
        table.add_row(r["name"], str(r["sequences"]), _lengths(r["input_lens"]),
                      out if out != "var" else f"{statistics.mean(r['output_lens']):.0f}",
                      f"{r['baseline_tok_s']:,.0f}", f"{r['candidate_tok_s']:,.0f}", f"{r['speedup']:.2f}x",
                      f"{r['matches']}/{r['sequences']}")
    return table


def latency_table(scenario: scenarios.Scenario, rows: list[dict]) -> Table:
    table = Table(title=f"LATENCY SUMMARY   {scenario.label}", title_justify="left")
    for column in ("SCENARIO", "BS", "OUT", "ITERS", "BASELINE med", "CANDIDATE med", "SPEEDUP", "MATCH"):
        table.add_column(column, justify="left" if column == "SCENARIO" else "right")
    for r in rows:
        table.add_row(r["name"], str(r["batch_size"]), str(r["output_len"]), str(r["iterations"]),
                      f"{r['baseline_median_s']:.4f}s", f"{r['candidate_median_s']:.4f}s", f"{r['speedup']:.2f}x",
                      f"{r['matches']}/{r['sequences']}")
    return table


def print_scenario(console: Console, result: dict) -> None:
    scenario = scenarios.Scenario.model_validate(result["scenario"])
    throughput = [r for r in result["rows"] if r["purpose"] == Purpose.THROUGHPUT.value]
    latency = [r for r in result["rows"] if r["purpose"] == Purpose.LATENCY.value]
    if throughput:
        console.print(throughput_table(scenario, throughput, result["correctness"]))
    if latency:
        console.print(latency_table(scenario, latency))
    for r in result["rows"]:
        if d := r["divergence"]:
            console.print(f"[red]{r['name']}: first divergence at sequence {d['sequence']}, output position "
                          f"{d['position']} (baseline token {d['baseline_token']}, candidate {d['candidate_token']})")
    adapter = result["adapter"]
    if result["candidates_replaced"] is not None:
        replaced = result["candidates_replaced"]
        console.print("candidate worker: " + (", ".join(f"{cls} <- {path}" for cls, path in replaced.items())
                                              or "[red]no layer replaced"))
    elif adapter["workers"] == 0:
        console.print("[red]candidate: no adapter report from an engine worker: our kernels did not run")
    else:
        calls = {op: n for op, n in adapter["kernel_calls"].items() if n}
        fallbacks = {op: sum(reasons.values()) for op, reasons in adapter["fallbacks"].items()}
        reasons = sorted({reason for rs in adapter["fallbacks"].values() for reason in rs})
        console.print(f"candidate worker: replaced {', '.join(adapter['replaced'])}; Triton kernel calls {calls or 0}; "
                      f"PyTorch-reference calls {fallbacks or 0}" + (f" ({'; '.join(reasons)})" if reasons else ""))
    env = result["environment"]
    console.print(f"[dim]vLLM {env['vllm']}, torch {env['torch']}, {env['device']}; "
                  f"{'eager' if result['settings']['enforce_eager'] else 'engine default compilation'}")
    if env["device"] == "cpu":
        console.print("[yellow]CPU engine: tok/s and latencies are CPU timings of a small model (and noisy on a "
                      "shared machine); the MATCH columns are what this run proves.")


def check_candidates(directory: Path) -> None:
    """Refuse, before any engine starts, a folder without candidates or with one that does not match."""
    present = [op for op in OPERATORS.values() if op.vllm_module and candidate_path(directory, op).exists()]
    if not present:
        raise WorkflowError(f"no candidate module in {directory}/ (sk create-stubs writes some)")
    for op in present:
        load_candidate(op, directory)


def run(scenario_file: str, out_dir: Path, *, enforce_eager: bool, max_layers: int | None,
        max_requests: int | None, candidates: Path | None, console: Console) -> bool:
    """Evaluate every scenario of the file, print the summaries, write JSON + PNG; True when all tokens match."""
    run_settings = {"enforce_eager": enforce_eager, "max_layers": max_layers, "max_requests": max_requests}
    loaded = scenarios.load(scenario_file, engines=("vllm",))
    if candidates is not None:
        check_candidates(candidates)
    results = []
    stem = Path(scenario_file).stem
    for scenario in loaded:
        runs = {}
        with progress_bars() as progress, tempfile.TemporaryDirectory(prefix="sk-eval-reports-") as reports:
            candidate_env = {} if candidates else CANDIDATE_ENV | {settings.env_name("report_dir"): reports}
            for variant, env, folder in (("baseline", {}, None), ("candidate", candidate_env, candidates)):
                runs[variant] = run_engine_job(
                    scenario, label=f"{variant} {scenario.model}", env=env, progress=progress, candidates=folder,
                    log_path=out_dir / "logs" / f"{stem}.{scenario.slug}.{variant}.log", **run_settings)
            adapter = adapter_summary(Path(reports))
        rows = [compare_workload(token, runs["baseline"]["workloads"][token], runs["candidate"]["workloads"][token])
                for token in scenario.workloads]
        passed = all(r["matches"] == r["sequences"] for r in rows)
        result = {"scenario": scenario.model_dump(), "correctness": "PASS" if passed else "FAIL", "rows": rows,
                  "adapter": adapter, "candidates_replaced": runs["candidate"]["candidates_replaced"],
                  "environment": runs["baseline"]["environment"], "settings": run_settings}
        print_scenario(console, result)
        results.append(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {"schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "scenario_file": str(scenario_file), "settings": run_settings,
                "candidate": f"candidate modules in {candidates}" if candidates else "standardkernels vLLM adapter",
                "scenarios": results}
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(document, indent=1) + "\n")
    chart = write_chart(document, out_dir / f"{stem}.png")
    console.print(f"results: {json_path}" + (f", {chart}" if chart else " (no PNG chart: matplotlib is not installed)"))
    return all(r["correctness"] == "PASS" for r in results)
