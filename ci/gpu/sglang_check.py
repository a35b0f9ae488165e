"""Stock SGLang against SGLang with our adapter, on a CUDA host, side by side: counts, tokens, speed.

    python ci/gpu/sglang_check.py OUTDIR [--tp 2] [--styles llama gemma] [--variants stock sk]

For each model style and variant, one `sglang.Engine` runs in its own process, with SGLang's defaults (bf16,
CUDA graphs for decode, piecewise CUDA graphs for prefill), `sampling_backend="pytorch"`; the "sk" variant does
what a user does: `import sk.adapters.sglang` before building the engine. Each run measures
  - greedy tokens with the top-5 candidates per step (agreement with stock: exact sequences, first divergence,
    top-5 overlap before it; on the trained models also the answers, the tokens up to the first newline);
  - throughput: 64 prompts x 64 generated tokens, the median of 7 timed batches after a warm-up batch;
  - decode latency: one sequence, milliseconds per generated token;
  - our ops in the engine: each scheduler process's adapter report (kernel calls and fallbacks per TP rank),
    written when the engine is asked for its server info (SGLang kills schedulers at shutdown).
Then (unless --no-serve) `sk-serve --engine sglang` on the Llama-style model: it must start, answer
/v1/completions, get reports from the schedulers, and on SIGINT exit 0 leaving none of its processes behind.
Writes OUTDIR/sglang_check.json and OUTDIR/sglang_check.md.

Needs SGLang 0.5.17 (staged as ../shared/gpu/README.md describes, on PYTHONPATH) and standardkernels installed
with its entry points (`pip install --no-deps -e .`), so that SGLang's scheduler processes load the plugin.
Sets SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 (the staged sgl-kernel build is not the one SGLang pins).
Prompts, model sizes and the agreement measure are vllm_check.py's, so the two engines' tables compare.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_check import (  # noqa: E402  (shared with the vLLM check: same prompts, models and measures)
    LATENCY_REPEATS,
    LATENCY_TOKENS,
    MODEL_SPECS,
    PROMPT_LEN,
    STYLES,
    THROUGHPUT_PROMPTS,
    THROUGHPUT_REPEATS,
    THROUGHPUT_TOKENS,
    TOKEN_PROMPTS,
    TOKEN_STEPS,
    TOP_K,
    agreement,
    answer_end_id,
    greedy_cells,
    median_seconds,
    model_path,
    prompts,
)
from engine_child import run_child  # noqa: E402

# Each variant's environment. The "sk" variant switches the adapter on as a user does, by importing it in the
# engine's process (run_engine); others (ci/gpu/export_check.py's "patched") are added by environment.
VARIANT_ENV: dict[str, dict[str, str]] = {"stock": {}, "sk": {}}
# Start-up is ~110 s (60 s of it prefill graph capture) and the measurements about a minute.
RUN_TIMEOUT_S, SILENCE_S = 540, 180
ENGINE_ENV = {"SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1"}
SERVE_PORT = 30123
SERVE_STOP_TIMEOUT_S = 120


# ------------------------------------------------------------------------------------- one engine (child)

def token_ids(model: Path, count: int, seed: int) -> list[list[int]]:
    return [p["prompt_token_ids"] for p in prompts(model, count, seed)]


def run_engine(model: Path, with_adapter: bool, tp: int) -> dict:
    if with_adapter:
        import sk.adapters.sglang  # noqa: F401  (the user's switch, inherited by the scheduler processes)
    import sglang
    import torch

    started = time.perf_counter()
    # log_level info (the Engine's default is error): a patched SGLang's (export_check.py) "first launch" lines
    # of the exported kernels are the proof that they ran.
    engine = sglang.Engine(model_path=str(model), dtype="bfloat16", tp_size=tp, random_seed=0,
                           sampling_backend="pytorch", context_length=1024, mem_fraction_static=0.6,
                           log_level="info")
    startup_s = time.perf_counter() - started
    try:
        greedy = {"temperature": 0.0, "max_new_tokens": TOKEN_STEPS, "ignore_eos": True}
        tokens, topk = [], []
        for out in engine.generate(input_ids=token_ids(model, TOKEN_PROMPTS, seed=1), sampling_params=greedy,
                                   return_logprob=True, top_logprobs_num=TOP_K):
            tokens.append(list(out["output_ids"]))
            # Each step's candidates as (logprob, token id, text); SGLang may give None for a step.
            topk.append([[c[1] for c in sorted(step or [], key=lambda c: -c[0])[:TOP_K]]
                         for step in out["meta_info"]["output_top_logprobs"]])

        fixed = {"temperature": 0.0, "max_new_tokens": THROUGHPUT_TOKENS, "ignore_eos": True}
        batch = token_ids(model, THROUGHPUT_PROMPTS, seed=2)
        # Warm-up with the timed batch: kernels compiled on first use stay out of the timing.
        engine.generate(input_ids=batch, sampling_params=fixed)
        throughput_s = median_seconds(lambda: engine.generate(input_ids=batch, sampling_params=fixed),
                                      THROUGHPUT_REPEATS)

        def one_sequence_s(max_tokens: int) -> float:
            started = time.perf_counter()
            engine.generate(input_ids=token_ids(model, 1, seed=3),
                            sampling_params={"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True})
            return time.perf_counter() - started

        # Per decode step: the time for LATENCY_TOKENS tokens less the time for one (prefill + first token).
        decode_ms = statistics.median(
            (one_sequence_s(LATENCY_TOKENS + 1) - one_sequence_s(1)) * 1e3 / LATENCY_TOKENS
            for _ in range(LATENCY_REPEATS))
        # Asking for the server info makes each scheduler write its adapter report (see sk.adapters.sglang).
        internal_states = engine.get_server_info()["internal_states"]
    finally:
        engine.shutdown()
    return {
        "startup_s": startup_s,
        "tokens": tokens,
        "topk": topk,
        "throughput_tokens_per_s": THROUGHPUT_PROMPTS * THROUGHPUT_TOKENS / throughput_s,
        "throughput_wall_s": throughput_s,
        "decode_ms_per_token": decode_ms,
        "reports_in_server_info": sum("standardkernels" in s for s in internal_states),
        "gpu": torch.cuda.get_device_name(0),
        "sglang": sglang.__version__,
    }


# ------------------------------------------------------------------------------------------ orchestration

def run_variant(style: str, variant: str, tp: int, work: Path) -> dict:
    from sk.reports import read_reports

    report_dir = work / f"{style}-{variant}-reports"
    out = work / f"{style}-{variant}.json"
    env = {**os.environ, **ENGINE_ENV, "SK_REPORT_DIR": str(report_dir), **VARIANT_ENV[variant]}
    env.pop("SK_ADAPTERS", None)  # only the sk variant's own import switches the adapter on
    log = work / f"{style}-{variant}.log"
    # The model is written here, so that the engine's process does no torch CPU work before SGLang starts.
    command = [sys.executable, __file__, str(out), "--child", str(model_path(style)), "--tp", str(tp),
               *(["--with-adapter"] if variant == "sk" else [])]
    returncode = run_child(command, env, log, RUN_TIMEOUT_S, SILENCE_S)
    if returncode:
        return {"error": f"engine run failed ({returncode}); log {log}", "log_tail": log.read_text()[-3000:]}
    result = json.loads(out.read_text())
    reports = read_reports(report_dir, engine="sglang") if report_dir.exists() else []
    result["schedulers"] = [
        {"rank": r["rank"], "pid": r["pid"], "process_title": r["process_title"], "replaced": sorted(r["replaced"]),
         "kernel_calls": r["coverage"]["kernel_calls"], "fallbacks": r["coverage"]["fallbacks"]}
        for r in reports if r["process_title"].startswith("sglang::scheduler")
    ]
    if variant == "sk" and not any(s["kernel_calls"] for s in result["schedulers"]):
        result["error"] = "no scheduler process reported kernel calls of our ops"
    if variant == "stock" and reports:
        result["error"] = f"stock run activated the adapter in {len(reports)} process(es)"
    return result


def http_json(url: str, body: dict | None = None, timeout: float = 60.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def check_serve(work: Path) -> dict:
    """sk-serve --engine sglang: start, one completion, SIGINT; then exit status, reports, leftover processes."""
    from sk.reports import read_reports
    from sk.evals.gate import wait_for_server
    from sk.workflow.errors import WorkflowError

    model = model_path("llama")
    report_dir, log = work / "serve-reports", work / "serve.log"
    url = f"http://127.0.0.1:{SERVE_PORT}"
    env = {**os.environ, **ENGINE_ENV}
    env.pop("SK_ADAPTERS", None)  # sk-serve switches the adapter on itself
    command = [sys.executable, "-m", "sk.adapters.serve", "--engine", "sglang", str(model), "--report-dir", str(report_dir),
               "--port", str(SERVE_PORT), "--sampling-backend", "pytorch"]
    result: dict = {"command": " ".join(command[1:])}
    with open(log, "w") as f:
        proc = subprocess.Popen(command, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        started = time.perf_counter()
        served = wait_for_server(SERVE_PORT, proc, log)
        result["startup_s"] = time.perf_counter() - started
        completion = http_json(f"{url}/v1/completions",
                               {"model": served, "prompt": "Hello", "max_tokens": 8, "temperature": 0})
        # The random model's ids past the tokenizer's vocabulary decode to nothing: the token count is the answer.
        result["completion"] = completion["choices"][0]["text"]
        result["completion_tokens"] = completion["usage"]["completion_tokens"]
    except WorkflowError as e:  # sk-serve exited or did not answer in time
        result["error"] = str(e)
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as e:
        result["error"] = f"completion failed: {e!r}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            result["exit_status"] = proc.wait(timeout=SERVE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            result["exit_status"] = f"still running {SERVE_STOP_TIMEOUT_S} s after SIGINT (killed)"
    reports = read_reports(report_dir, engine="sglang") if report_dir.exists() else []
    result["scheduler_kernel_calls"] = [r["coverage"]["kernel_calls"] for r in reports
                                        if r["process_title"].startswith("sglang::scheduler")]
    result["leftover_pids"] = _still_alive([r["pid"] for r in reports])
    problems = [p for p, bad in (
        (f"exit status {result['exit_status']}", result["exit_status"] != 0),
        ("no scheduler report with kernel calls", not any(result["scheduler_kernel_calls"])),
        ("the completion has no tokens", "completion_tokens" in result and not result["completion_tokens"]),
        (f"processes left running: {result['leftover_pids']}", bool(result["leftover_pids"])),
    ) if bad]
    if problems and "error" not in result:
        result["error"] = "; ".join(problems)
    if "error" in result:
        result["log_tail"] = log.read_text()[-3000:]
    return result


def _still_alive(pids: list[int], grace_s: float = 10.0) -> list[int]:
    # Processes orphaned by the server's exit are reaped by init shortly after: give them a moment.
    deadline = time.perf_counter() + grace_s
    while True:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive or time.perf_counter() > deadline:
            return alive
        time.sleep(0.5)


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import triton

    import sk

    found = {"torch": torch.__version__, "triton": triton.__version__, "standardkernels": sk.__version__,
             "cuda": torch.version.cuda}
    for dist in ("sglang", "sglang-kernel", "flashinfer-python"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = None
    return found


def markdown(summary: dict) -> str:
    lines = [f"# SGLang with and without Standard Kernels ({summary['date']})", "",
             f"GPU: {summary['gpu']}; tensor parallel: {summary['tp']}; versions: "
             + ", ".join(f"{k} {v}" for k, v in summary["versions"].items()), "",
             "bf16, SGLang defaults (CUDA graphs for decode, piecewise CUDA graphs for prefill), sampling backend "
             f"pytorch. Throughput: {THROUGHPUT_PROMPTS} prompts x {THROUGHPUT_TOKENS} tokens, median of "
             f"{THROUGHPUT_REPEATS} batches (prompt {PROMPT_LEN}). "
             f"Decode: one sequence, ms per token. Tokens: {TOKEN_PROMPTS} prompts x {TOKEN_STEPS} greedy steps "
             "vs stock (trained models: also the answers, up to the first newline).", "",
             f"| model | variant | start (s) | tokens/s | decode ms/token | greedy = stock | top-{TOP_K} overlap | "
             "our kernel calls per scheduler (TP rank) | fallbacks |",
             "|---|---|---|---|---|---|---|---|---|"]
    for style, runs in summary["runs"].items():
        for variant, r in runs.items():
            if "startup_s" not in r:
                lines.append(f"| {style} | {variant} | {r['error']} | | | | | | |")
                continue
            agree = r.get("agreement")
            calls = "; ".join(f"rank {s['rank']}: " + ", ".join(f"{op} {n}" for op, n in sorted(
                s["kernel_calls"].items())) for s in r["schedulers"]) or "-"
            fallbacks = sum(f["count"] for s in r["schedulers"] for f in s["fallbacks"])
            lines.append(
                f"| {style} | {variant} | {r['startup_s']:.0f} | {r['throughput_tokens_per_s']:.0f} | "
                f"{r['decode_ms_per_token']:.2f} | "
                + greedy_cells(agree)
                + f" | {calls} | {fallbacks} |")
    errors = [f"{style} {variant}: {r['error']}" for style, runs in summary["runs"].items()
              for variant, r in runs.items() if "error" in r]
    reasons = {f["reason"] for runs in summary["runs"].values() for r in runs.values()
               for s in r.get("schedulers", []) for f in s["fallbacks"]}
    if reasons:
        lines += ["", "Fallback reasons: " + "; ".join(sorted(reasons))]
    serve = summary.get("serve")
    if serve:
        lines += ["", f"`sk-serve --engine sglang` (llama): "
                  + (f"FAILED: {serve['error']}" if "error" in serve else
                     f"started in {serve['startup_s']:.0f} s, completion {serve['completion']!r} "
                     f"({serve['completion_tokens']} tokens), scheduler kernel calls "
                     f"{serve['scheduler_kernel_calls']}, exit status {serve['exit_status']} after SIGINT, "
                     "no process left")]
    if errors:
        lines += ["", "Errors: " + "; ".join(errors)]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (2 on the 2-GPU host)")
    parser.add_argument("--styles", nargs="+", default=list(MODEL_SPECS), choices=STYLES)
    parser.add_argument("--variants", nargs="+", default=list(VARIANT_ENV), choices=list(VARIANT_ENV))
    parser.add_argument("--no-serve", action="store_true", help="skip the sk-serve --engine sglang check")
    parser.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--with-adapter", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        Path(args.outdir).write_text(json.dumps(run_engine(Path(args.child), args.with_adapter, args.tp)))
        return 0

    from importlib.metadata import entry_points

    plugins = {e.name: e.value for e in entry_points(group="sglang.srt.plugins")}
    if plugins.get("standardkernels") != "sk.adapters.sglang_plugin:register":
        sys.exit("standardkernels' sglang.srt.plugins entry point is not installed (found "
                 f"{plugins or 'none'}): pip install --no-deps -e .")
    from sk.adapters.sglang.support import check_installed_sglang

    check_installed_sglang()  # an SGLang the adapter does not know stops here, with the reason
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sglang-check-", dir=out))
    summary = {"date": datetime.date.today().isoformat(), "tp": args.tp, "versions": versions(), "runs": {}}
    for style in args.styles:
        runs = summary["runs"][style] = {}
        for variant in args.variants:
            print(f"sglang_check: {style} {variant} tp={args.tp}", file=sys.stderr, flush=True)
            runs[variant] = run_variant(style, variant, args.tp, work)
        stock = runs.get("stock", {})
        for variant, r in runs.items():
            if variant != "stock" and "tokens" in r and "tokens" in stock:
                r["agreement"] = agreement(stock, r, answer_end_id(style))
    if not args.no_serve:
        print("sglang_check: sk-serve --engine sglang", file=sys.stderr, flush=True)
        summary["serve"] = check_serve(work)
    summary["gpu"] = next((r["gpu"] for runs in summary["runs"].values() for r in runs.values() if "gpu" in r),
                          None)
    (out / "sglang_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "sglang_check.md").write_text(markdown(summary))
    print(markdown(summary))
    failed = any("error" in r for runs in summary["runs"].values() for r in runs.values())
    return 1 if failed or "error" in summary.get("serve", {}) else 0


if __name__ == "__main__":
    sys.exit(main())
