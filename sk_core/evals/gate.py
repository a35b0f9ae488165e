"""The accuracy gate: the project's lm-eval tasks run in the engine with stock kernels and with ours, compared.

    sk gate SCENARIO.yaml [--enforce-eager] [--via-server] [--limit N] [--out DIR] [--candidate-env KEY=VALUE ...]

For each scenario row, lm-eval (add_bos_token=True as the models were trained) runs twice in fresh processes
with identical settings, stock kernels then ours (our kernels in every engine process), in one of two ways:
  - in process (vLLM rows; the default): lm-eval's `vllm` backend builds the engine, SK_ADAPTERS=vllm for ours;
  - through a server (SGLang rows always; vLLM rows with --via-server): `sk-serve --engine ENGINE MODEL` (with
    --no-sk for stock) and the engine's server arguments derived from the row, then lm-eval's
    `local-completions` backend against its /v1/completions (log-likelihoods through echo + logprobs), then
    SIGINT; the model processes' adapter reports are read from the report directory sk-serve was given.
    lm-eval tokenizes with the model's own tokenizer and sends token ids, so both ways score the same tokens
    (BOS included): vLLM's CPU engine served scores the items as it does in process (fp32, trained llama, first
    20 items of each task: log-likelihoods and generations identical, stock and ours;
    tests/evals/test_gate_server.py).
The gate prints both tables side by side and the items on which the two runs answer differently, and fails when
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
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from sk import settings
from sk.argtypes import key_value, output_dir, positive_int
from sk.evals.task_data import TASK_FILES

TASKS = tuple(TASK_FILES)
TOLERANCE = {"float32": 0.01, "bfloat16": 0.02, "float16": 0.02}
VARIANTS = ("stock", "ours")
# vLLM's CPU engine answers in 1-2 minutes, SGLang with CUDA graphs on the H200 in ~2 (2026-11-29); cold
# compile caches take longer.
SERVER_START_TIMEOUT_S = 900.0
# sk-serve stops its engine within its own grace periods (40 s, sk.adapters.serve: GRACE_S + TERM_S); then it
# sums the reports and exits (tests/evals/test_gate_server.py keeps the two in step).
SERVER_STOP_TIMEOUT_S = 70.0
# Requests per HTTP call to the server; a batch is scored as separate sequences, so results do not depend on it.
SERVER_BATCH_SIZE = 32


def lm_eval_model_args(scenario, model: str, enforce_eager: bool) -> dict:
    """lm-eval's VLLM arguments (the unknown ones go on to vllm.LLM) for one scenario row."""
    args = {"pretrained": model, "dtype": scenario.dtype, "tensor_parallel_size": scenario.tp,
            "kv_cache_dtype": scenario.kv_cache_dtype, "add_bos_token": True, "seed": 0, "batch_size": "auto",
            "enforce_eager": enforce_eager, **scenario.engine_args}
    for key in ("max_model_len", "kv_cache_memory_bytes"):
        if getattr(scenario, key) is not None:
            args[key] = getattr(scenario, key)
    return args


def engine_flags(engine_args: dict) -> list[str]:
    """A scenario's engine_args as server command-line flags: key_name: value -> --key-name value."""
    from sk.workflow.errors import WorkflowError

    flags = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is False:  # neither server has a generic negation; their "off" flags are flags of their own
            raise WorkflowError(f"engine_args.{key}: false has no command-line form; leave it out, or set the "
                                f"engine's own negative flag (e.g. no_{key} or disable_{key}) to true")
        flags += [flag] if value is True else [flag, value if isinstance(value, str) else json.dumps(value)]
    return flags


def server_engine_args(scenario, enforce_eager: bool) -> list[str]:
    """The engine server's own arguments for one scenario row, matching lm_eval_model_args' engine settings."""
    common = [f"--dtype={scenario.dtype}", f"--kv-cache-dtype={scenario.kv_cache_dtype}"]
    if scenario.engine == "vllm":
        args = [*common, f"--tensor-parallel-size={scenario.tp}", "--seed=0"]
        if scenario.max_model_len is not None:
            args.append(f"--max-model-len={scenario.max_model_len}")
        if scenario.kv_cache_memory_bytes is not None:
            args.append(f"--kv-cache-memory-bytes={scenario.kv_cache_memory_bytes}")
        if enforce_eager:
            args.append("--enforce-eager")
    else:
        # flashinfer's sampler is not among the GPU host's packages; greedy sampling is the same in PyTorch.
        args = [*common, f"--tp-size={scenario.tp}", "--random-seed=0", "--sampling-backend=pytorch"]
        if scenario.max_model_len is not None:
            args.append(f"--context-length={scenario.max_model_len}")
        if enforce_eager:
            args += ["--cuda-graph-backend-decode=disabled", "--cuda-graph-backend-prefill=disabled"]
    return args + engine_flags(scenario.engine_args)  # last, so that a row's engine_args override ours


def sk_serve_command(scenario, model: str, variant: str, port: int, report_dir: Path, enforce_eager: bool,
                     ) -> list[str]:
    stock = ["--no-sk"] if variant == "stock" else []
    return [sys.executable, "-m", "sk.adapters.serve", "--engine", scenario.engine, model, *stock,
            f"--report-dir={report_dir}", "--host=127.0.0.1", f"--port={port}",
            *server_engine_args(scenario, enforce_eager)]


def local_completions_model_args(scenario, model: str, served_name: str, port: int) -> dict:
    """lm-eval's local-completions arguments: our tokenizer (token ids sent, BOS added), batched requests."""
    args = {"model": served_name, "base_url": f"http://127.0.0.1:{port}/v1/completions", "tokenizer": model,
            "tokenizer_backend": "huggingface", "add_bos_token": True, "seed": 0,
            "batch_size": SERVER_BATCH_SIZE, "max_retries": 1, "timeout": 600}
    if scenario.max_model_len is not None:  # the in-process backend takes its max length from the engine
        args["max_length"] = scenario.max_model_len
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(port: int, proc: subprocess.Popen, log: Path) -> str:
    """The served model's name, once the server answers /v1/models (WorkflowError when sk-serve exits first)."""
    from sk.workflow.errors import WorkflowError

    started = time.monotonic()
    while proc.poll() is None and time.monotonic() - started < SERVER_START_TIMEOUT_S:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
                return json.load(response)["data"][0]["id"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError):
            time.sleep(2)
    state = (f"sk-serve exited with {proc.returncode}" if proc.poll() is not None
             else f"no answer within {SERVER_START_TIMEOUT_S:.0f} s")
    raise WorkflowError(f"the engine server did not start ({state}); its log is {log}, ending with:\n"
                        + "".join(log.read_text().splitlines(keepends=True)[-40:]))


def stop_server(proc: subprocess.Popen) -> None:
    """SIGINT, as a user stops sk-serve: the engine shuts down, its processes' reports are written."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=SERVER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # not expected: sk-serve kills its engine after its own grace periods
        proc.kill()
        proc.wait()


def run_in_process(scenario, model: str, variant: str, out_dir: Path, base_env: dict, extra: dict,
                   args: argparse.Namespace) -> tuple[dict, dict]:
    """lm-eval's vllm backend in a child process: (its output, how it ran)."""
    model_args = lm_eval_model_args(scenario, model, args.enforce_eager)
    env = base_env | ({settings.env_name("adapters"): "vllm", **extra} if variant == "ours" else {})
    return run_lm_eval("vllm", model_args, out_dir, env, args.limit), {"backend": "vllm", "model_args": model_args}


def run_via_server(scenario, model: str, variant: str, out_dir: Path, base_env: dict, extra: dict,
                   args: argparse.Namespace) -> tuple[dict, dict]:
    """sk-serve, lm-eval's local-completions against it, SIGINT: (lm-eval's output with the model processes'
    adapter reports, how it ran)."""
    from sk.reports import model_process_reports, read_reports

    port, report_dir, log = free_port(), out_dir / "reports", out_dir / "server.log"
    command = sk_serve_command(scenario, model, variant, port, report_dir, args.enforce_eager)
    server_env = base_env | (extra if variant == "ours" else {})
    with open(log, "w") as server_log:
        proc = subprocess.Popen(command, env=server_env, stdout=server_log, stderr=subprocess.STDOUT)
    try:
        served_name = wait_for_server(port, proc, log)
        model_args = local_completions_model_args(scenario, model, served_name, port)
        run = run_lm_eval("local-completions", model_args, out_dir, base_env, args.limit)
    finally:
        stop_server(proc)
    reports = read_reports(report_dir, engine=scenario.engine) if report_dir.exists() else []
    run["adapter_reports"] = model_process_reports(reports)
    return run, {"backend": "local-completions", "model_args": model_args, "server_command": command[1:],
                 "server_exit_status": proc.returncode}


def run_lm_eval(backend: str, model_args: dict, out_dir: Path, env: dict[str, str], limit: int | None) -> dict:
    """One lm-eval run (sk.evals.lm_eval_job) in a child process; its log goes to out_dir/lm_eval.log."""
    from sk.workflow.errors import WorkflowError

    job, out = out_dir / "job.json", out_dir / "lm_eval.json"
    job.write_text(json.dumps({"backend": backend, "model_args": model_args, "limit": limit, "out": str(out)}))
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
    from sk.reports import merge_reports

    if not reports:
        return {"workers": 0, "replaced": {}, "op_calls": {}}
    merged = merge_reports(reports)
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
    parser.add_argument("--via-server", action="store_true",
                        help="vLLM rows through sk-serve and lm-eval's local-completions, as SGLang rows always run")
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help="only the first N items of each task (1 or more)")
    parser.add_argument("--out", type=output_dir, help="keep lm-eval outputs, logs and gate.json here")
    parser.add_argument("--candidate-env", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for the candidate run only (e.g. TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    console = Console(width=160)
    extra = dict(args.candidate_env)
    try:
        loaded = scenarios.load(args.scenario)
        for scenario in loaded:  # a row the server cannot take is refused before anything is written
            if args.via_server or scenario.engine == "sglang":
                server_engine_args(scenario, args.enforce_eager)
    except WorkflowError as e:
        console.print(f"sk gate: {e}", markup=False)
        return 2

    out_root = args.out or Path(tempfile.mkdtemp(prefix="sk-gate-"))
    # Only the candidate run switches our adapter on.
    base_env = settings.stock_environment()
    base_env |= {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    passed, summary = True, []
    try:
        for scenario in loaded:
            model = truncated_model_args(scenario, None)["model"]  # project models resolved to their directory
            via_server = args.via_server or scenario.engine == "sglang"
            run_variant = run_via_server if via_server else run_in_process
            runs, how = {}, {}
            for variant in VARIANTS:
                out_dir = out_root / scenario.slug / variant
                out_dir.mkdir(parents=True, exist_ok=True)
                console.print(f"{scenario.label}: lm-eval, {variant} kernels, "
                              f"{'through sk-serve' if via_server else 'in process'} ({out_dir})")
                runs[variant], how[variant] = run_variant(scenario, model, variant, out_dir, base_env, extra, args)
            comparison = compare(runs["stock"], runs["ours"], TOLERANCE[scenario.dtype])
            activity = candidate_activity(runs["ours"]["adapter_reports"])
            print_report(scenario.label, comparison, activity, console)
            ok = (all(r["ok"] for r in comparison["metrics"]) and all(t["ok"] for t in comparison["tasks"].values())
                  and sum(activity["op_calls"].values()) > 0)
            if not activity["op_calls"]:
                console.print("[red]FAIL: the candidate run reported no calls of our ops[/red]")
            passed &= ok
            summary.append({"scenario": scenario.model_dump(), "model": model, "runs": how,
                            "enforce_eager": args.enforce_eager, "limit": args.limit, "passed": ok,
                            "activity": activity, **comparison})
    except WorkflowError as e:
        console.print(f"sk gate: {e}", markup=False)
        return 2
    (out_root / "gate.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"gate: {'PASS' if passed else 'FAIL'} (details: {out_root / 'gate.json'})")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
