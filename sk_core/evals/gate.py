"""The accuracy gate: the project's lm-eval tasks run in the engine with stock kernels and with ours, compared.

    sk gate SCENARIO.yaml [--enforce-eager] [--limit N] [--out DIR] [--candidate-env KEY=VALUE ...]

For each scenario row, lm-eval (its `vllm` backend, add_bos_token=True as the models were trained) runs twice in
fresh processes with identical settings: stock vLLM, then with SK_ADAPTERS=vllm (our kernels in every engine
process, as sk-serve does). The gate prints both tables side by side and the items on which the two runs answer
differently, and fails when
  - a metric differs by more than the tolerance of the scenario's dtype, or
  - more items than that tolerance allows are answered differently (a metric can hide flips that cancel), or
  - the candidate run's adapter reports show that none of our ops ran (stock against stock proves nothing).
Exit code: 0 pass, 1 fail, 2 bad input (WorkflowError) or a failed engine run.

Tolerance, as a share of the items of a task (the same bound for a metric difference and for flipped items).
Swapping a kernel changes only rounding. An item can flip only if its decision margin (log-likelihood gap between
the two best choices; top-2 logit gap at a generated token) is smaller than the rounding difference that
reaches the logits:
  - float32: ~1e-6 relative per op; the trained models' margins are far larger on nearly every item, so
    expect zero flips (measured on CPU: 0 of 300 per task, log-likelihoods equal); 1% (3 of 300) absorbs an
    item sitting on a tie without hiding a real bug: a broken kernel flips far more (measured on the first 60
    items of each task: dropped residual 41 + 60 flips, acc 0.72 -> 0.12; norm epsilon 1.0 instead of 1e-6
    7 + 24 flips, exact match 0.85 -> 0.58; tests/evals/test_gate_engine.py).
  - bfloat16/float16: ~4e-3 / 5e-4 relative per op, compounded over layers; items with margins below a few
    hundredths of a nat may flip legitimately. 2% (6 of 300) per task.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

from sk.evals.task_data import TASK_FILES

TASKS = tuple(TASK_FILES)
TOLERANCE = {"float32": 0.01, "bfloat16": 0.02, "float16": 0.02}
# Removed from both runs' environments: only the candidate run switches our adapter on.
_ADAPTER_VARIABLES = ("SK_ADAPTERS", "SK_STRICT", "SK_REPORT_DIR")
VARIANTS = ("stock", "ours")


def lm_eval_model_args(scenario, model: str, enforce_eager: bool) -> dict:
    """lm-eval's VLLM arguments (the unknown ones go on to vllm.LLM) for one scenario row."""
    args = {"pretrained": model, "dtype": scenario.dtype, "tensor_parallel_size": scenario.tp,
            "kv_cache_dtype": scenario.kv_cache_dtype, "add_bos_token": True, "seed": 0, "batch_size": "auto",
            "enforce_eager": enforce_eager, **scenario.engine_args}
    for key in ("max_model_len", "kv_cache_memory_bytes"):
        if getattr(scenario, key) is not None:
            args[key] = getattr(scenario, key)
    return args


def run_lm_eval(model_args: dict, out_dir: Path, env: dict[str, str], limit: int | None) -> dict:
    """One lm-eval run (sk.evals.lm_eval_job) in a child process; its log goes to out_dir/lm_eval.log."""
    from sk.workflow.errors import WorkflowError

    job, out = out_dir / "job.json", out_dir / "lm_eval.json"
    job.write_text(json.dumps({"model_args": model_args, "limit": limit, "out": str(out)}))
    out.unlink(missing_ok=True)
    tail: deque[str] = deque(maxlen=40)
    with open(out_dir / "lm_eval.log", "w") as log, subprocess.Popen(
        [sys.executable, "-m", "sk.evals.lm_eval_job", str(job)], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1,
    ) as child:
        for line in child.stdout:
            log.write(line)
            tail.append(line)
    if child.returncode != 0 or not out.exists():
        raise WorkflowError(f"lm-eval failed (exit code {child.returncode}); its log is {out_dir / 'lm_eval.log'},"
                            " ending with:\n" + "".join(tail))
    return json.loads(out.read_text())


def metrics(results: dict) -> dict[tuple[str, str], float]:
    """{(task, metric): value} from lm-eval's results, stderr and bookkeeping left out."""
    return {(task, key.split(",")[0]): value for task in TASKS for key, value in results[task].items()
            if "," in key and not key.split(",")[0].endswith("_stderr")}


def answer(sample: dict) -> str:
    """What the model answered on one item: the chosen option (multiple choice) or the generated text."""
    if "acc" in sample:
        scores = [float(resp[0]) for resp in sample["filtered_resps"]]
        return sample["doc"]["choices"][max(range(len(scores)), key=scores.__getitem__)]
    return sample["filtered_resps"][0]


def disagreements(stock: list[dict], ours: list[dict]) -> list[dict]:
    out = []
    for a, b in zip(stock, ours, strict=True):
        if answer(a) != answer(b):
            choices = a["doc"].get("choices")  # a multiple-choice target is the index of the right choice
            target = choices[int(a["target"])] if choices else a["target"]
            out.append({"doc_id": a["doc_id"], "prompt": a["doc"]["prompt"], "target": target,
                        "stock": answer(a), "ours": answer(b)})
    return out


def max_loglikelihood_difference(stock: list[dict], ours: list[dict]) -> float | None:
    """Largest |log p(stock) - log p(ours)| over every scored choice: how far apart the kernels are, in nats."""
    diffs = [abs(float(ra[0]) - float(rb[0])) for a, b in zip(stock, ours)
             for ra, rb in zip(a["filtered_resps"], b["filtered_resps"]) if not isinstance(ra, str)]
    return max(diffs) if diffs else None


def candidate_activity(reports: list[dict]) -> dict:
    """Our adapter's reports, one per engine worker, merged: replaced layers and op calls (kernel + fallback)."""
    from sk.adapters import _common

    if not reports:
        return {"workers": 0, "replaced": {}, "op_calls": {}}
    merged = _common.merge_reports(reports)
    calls = dict(merged["coverage"]["kernel_calls"])
    for fallback in merged["coverage"]["fallbacks"]:
        calls[fallback["op"]] = calls.get(fallback["op"], 0) + fallback["count"]
    return {"workers": len(reports), "replaced": merged["replaced"], "op_calls": calls}


def compare(stock: dict, ours: dict, tolerance: float) -> dict:
    rows = []
    stock_metrics, our_metrics = metrics(stock["results"]), metrics(ours["results"])
    for (task, metric), value in stock_metrics.items():
        delta = our_metrics[(task, metric)] - value
        rows.append({"task": task, "metric": metric, "stock": value, "ours": our_metrics[(task, metric)],
                     "delta": delta, "ok": abs(delta) <= tolerance})
    tasks = {}
    for task in TASKS:
        stock_samples, our_samples = ([*sorted(run["samples"][task], key=lambda s: s["doc_id"])]
                                      for run in (stock, ours))
        flips = disagreements(stock_samples, our_samples)
        tasks[task] = {"items": len(stock_samples), "disagreements": flips,
                       "ok": len(flips) <= tolerance * len(stock_samples),
                       "max_loglikelihood_difference": max_loglikelihood_difference(stock_samples, our_samples)}
    return {"tolerance": tolerance, "metrics": rows, "tasks": tasks}


def print_report(label: str, comparison: dict, activity: dict, console) -> None:
    from rich.table import Table

    table = Table(title=f"accuracy gate: {label}", caption=f"tolerance {comparison['tolerance']:.1%} of items")
    for column in ("task", "metric", "stock", "ours", "Δ", "result"):
        table.add_column(column)
    for row in comparison["metrics"]:
        table.add_row(row["task"], row["metric"], f"{row['stock']:.4f}", f"{row['ours']:.4f}",
                      f"{row['delta']:+.4f}", "PASS" if row["ok"] else "[red]FAIL[/red]")
    console.print(table)
    for task, result in comparison["tasks"].items():
        flips, items = result["disagreements"], result["items"]
        diff = result["max_loglikelihood_difference"]
        note = f"; max |Δ log-likelihood| {diff:.2e} nats" if diff is not None else ""
        console.print(f"{task}: {len(flips)} of {items} items answered differently "
                      f"({'PASS' if result['ok'] else 'FAIL'}){note}")
        for flip in flips[:10]:
            console.print(f"  item {flip['doc_id']}: {flip['prompt']!r} target {flip['target']!r}: "
                          f"stock {flip['stock']!r}, ours {flip['ours']!r}", markup=False)
        if len(flips) > 10:
            console.print(f"  ... {len(flips) - 10} more in the gate's JSON")
    calls = ", ".join(f"{op} {n}" for op, n in sorted(activity["op_calls"].items())) or "none"
    console.print(f"our ops in the candidate run ({activity['workers']} engine workers reporting): {calls}")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from sk.workflow import scenarios
    from sk.workflow.engine_job import truncated_model_args
    from sk.workflow.errors import WorkflowError

    parser = argparse.ArgumentParser(prog="sk gate", description=__doc__.splitlines()[0])
    parser.add_argument("scenario", help="scenario YAML (sk.workflow.scenarios); its workloads are not used")
    parser.add_argument("--enforce-eager", action="store_true", help="no compile, no CUDA graphs")
    parser.add_argument("--limit", type=int, help="only the first N items of each task")
    parser.add_argument("--out", type=Path, help="keep lm-eval outputs, logs and gate.json here")
    parser.add_argument("--candidate-env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for the candidate run only (e.g. TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    console = Console(width=160)
    try:
        extra = dict(item.split("=", 1) for item in args.candidate_env)
    except ValueError:
        console.print(f"--candidate-env takes KEY=VALUE, got {args.candidate_env}")
        return 2

    out_root = args.out or Path(tempfile.mkdtemp(prefix="sk-gate-"))
    base_env = {k: v for k, v in os.environ.items() if k not in _ADAPTER_VARIABLES}
    base_env |= {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    passed, summary = True, []
    try:
        for scenario in scenarios.load(args.scenario):
            model = truncated_model_args(scenario, None)["model"]  # project models resolved to their directory
            model_args = lm_eval_model_args(scenario, model, args.enforce_eager)
            runs = {}
            for variant in VARIANTS:
                out_dir = out_root / scenario.slug / variant
                out_dir.mkdir(parents=True, exist_ok=True)
                env = dict(base_env)
                if variant == "ours":
                    env |= {"SK_ADAPTERS": "vllm", **extra}
                console.print(f"{scenario.label}: lm-eval, {variant} kernels ({out_dir / 'lm_eval.log'})")
                runs[variant] = run_lm_eval(model_args, out_dir, env, args.limit)
            comparison = compare(runs["stock"], runs["ours"], TOLERANCE[scenario.dtype])
            activity = candidate_activity(runs["ours"]["adapter_reports"])
            print_report(scenario.label, comparison, activity, console)
            ok = (all(r["ok"] for r in comparison["metrics"]) and all(t["ok"] for t in comparison["tasks"].values())
                  and sum(activity["op_calls"].values()) > 0)
            if not activity["op_calls"]:
                console.print("[red]FAIL: the candidate run reported no calls of our ops[/red]")
            passed &= ok
            summary.append({"scenario": scenario.model_dump(), "model": model, "model_args": model_args,
                            "enforce_eager": args.enforce_eager, "limit": args.limit, "passed": ok,
                            "activity": activity, **comparison})
    except WorkflowError as e:
        console.print(str(e), markup=False)
        return 2
    (out_root / "gate.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"gate: {'PASS' if passed else 'FAIL'} (details: {out_root / 'gate.json'})")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
