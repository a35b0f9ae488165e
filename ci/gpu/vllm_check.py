"""Stock vLLM against vLLM with our adapter, on a CUDA host, side by side: counts, tokens, speed.

    python ci/gpu/vllm_check.py OUTDIR [--tp 2] [--styles llama gemma] [--variants stock sk]

For each model style and variant, one engine runs in its own process, in vLLM's default mode (bf16, Inductor
compile + CUDA graphs) and measures:
  - greedy tokens with the top-5 candidates per step (agreement with stock: exact sequences, first divergence,
    top-5 overlap before it; on the trained models also the answers, the tokens up to the first newline);
  - throughput: 64 prompts x 64 generated tokens, the median of 7 timed batches after a warm-up batch;
  - decode latency: one sequence, milliseconds per generated token;
  - our ops in the engine: each process's adapter report (kernel calls and fallbacks, per worker rank).
Writes OUTDIR/vllm_check.json and OUTDIR/vllm_check.md.

Needs vLLM (0.25.0 on the H200 host) and standardkernels installed with its entry points
(`pip install --no-deps -e .`), so that vLLM's workers load the plugin. The models are the project's own
(sk.models), bigger than the CPU test ones so that the norms and activations weigh in the step time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_child import run_child  # noqa: E402

PROMPT_LEN = 128
THROUGHPUT_PROMPTS, THROUGHPUT_TOKENS = 64, 64
# One batch takes 0.1-0.3 s on the H200: a single timing of it varied by 1.5x between runs (2026-11-30).
THROUGHPUT_REPEATS = 7
LATENCY_TOKENS, LATENCY_REPEATS = 128, 5
TOKEN_PROMPTS, TOKEN_STEPS, TOP_K = 16, 32, 5
# Llama style runs on any vLLM; vLLM 0.25's Gemma requires tied embeddings.
MODEL_SPECS = {
    "llama": dict(style="llama", hidden_size=2048, intermediate_size=8192, num_layers=8, num_heads=16,
                  num_kv_heads=8, head_dim=128, vocab_size=32000),
    "gemma": dict(style="gemma", hidden_size=2048, intermediate_size=8192, num_layers=8, num_heads=16,
                  num_kv_heads=8, head_dim=128, vocab_size=32000, tie_word_embeddings=True),
}
# The committed trained models (models/trained, sk.models.train): on held-out prompts of their corpus their logits
# are peaked, which makes greedy tokens a fair comparison in bf16. Small (hidden 128): for tokens, not for speed.
TRAINED_MODELS = {f"{style}-trained": Path(__file__).resolve().parents[2] / "models" / "trained" / style
                  for style in ("llama", "gemma", "qwen3")}
STYLES = [*MODEL_SPECS, *TRAINED_MODELS]
VARIANT_ENV = {"stock": {}, "sk": {"SK_ADAPTERS": "vllm"}}
# Every engine process: flashinfer's sampler is not staged on the host; no usage reports (the host is offline);
# spawned rather than forked engine processes (a process forked after torch's OpenMP work can hang).
ENGINE_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
# Start-up is 45-80 s and the measurements take about a minute; a run silent for 3 minutes has stalled.
RUN_TIMEOUT_S, SILENCE_S = 480, 180


# ------------------------------------------------------------------------------------- one engine (child)

def median_seconds(run, repeats: int) -> float:
    """Median wall time of `repeats` calls of `run` (both engines' checks time their batches with it)."""
    def once() -> float:
        started = time.perf_counter()
        run()
        return time.perf_counter() - started
    return statistics.median(once() for _ in range(repeats))


def prompts(model: Path, count: int, seed: int) -> list[dict]:
    """Token-id prompts: held-out corpus prompts for a trained model, else PROMPT_LEN random byte tokens."""
    import random

    from sk.models.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE

    if (model / "training.json").exists():
        from tokenizers import Tokenizer

        from sk.models.corpus import held_out_examples

        tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))  # adds <bos>, as in training
        return [{"prompt_token_ids": tokenizer.encode(e.prompt).ids} for e in held_out_examples(count, seed)]
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(len(SPECIAL_TOKENS), VOCAB_SIZE) for _ in range(PROMPT_LEN)]}
            for _ in range(count)]


def model_path(style: str) -> Path:
    import sk.models

    if style in TRAINED_MODELS:
        return TRAINED_MODELS[style]
    return sk.models.tiny_model(sk.models.TinyModelSpec(**MODEL_SPECS[style]))


def run_engine(model: Path, tp: int) -> dict:
    import torch
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    # At tp > 1 on Hopper with flashinfer installed, vLLM 0.25 fuses all-reduce + RMSNorm through flashinfer,
    # whose multicast (mnnvl) workspace hung the tp=2 start (2026-11-29). NVLink multicast is off on these hosts
    # and must not be asked for (the device notes: it can take the host's GPUs out of service), so the fusion
    # pass is off at tp > 1, for stock and ours alike; all-reduce stays vLLM's custom (CUDA IPC) one.
    no_multicast = {"compilation_config": {"pass_config": {"fuse_allreduce_rms": False}}} if tp > 1 else {}
    llm = LLM(str(model), dtype="bfloat16", seed=0, tensor_parallel_size=tp, max_model_len=1024,
              gpu_memory_utilization=0.6, **no_multicast)
    startup_s = time.perf_counter() - started

    greedy = SamplingParams(temperature=0.0, max_tokens=TOKEN_STEPS, ignore_eos=True, logprobs=TOP_K)
    tokens, topk = [], []
    for out in llm.generate(prompts(model, TOKEN_PROMPTS, seed=1), greedy):
        completion = out.outputs[0]
        tokens.append(list(completion.token_ids))
        topk.append([sorted(step, key=lambda t: step[t].rank)[:TOP_K] for step in completion.logprobs])

    batch = prompts(model, THROUGHPUT_PROMPTS, seed=2)
    fixed = SamplingParams(temperature=0.0, max_tokens=THROUGHPUT_TOKENS, ignore_eos=True)
    llm.generate(batch, fixed)  # warm-up with the timed batch: kernels compiled on first use stay out of the timing
    throughput_s = median_seconds(lambda: llm.generate(batch, fixed), THROUGHPUT_REPEATS)

    def one_sequence_s(max_tokens: int) -> float:
        started = time.perf_counter()
        llm.generate(prompts(model, 1, seed=3),
                     SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        return time.perf_counter() - started

    # Per decode step: the time for LATENCY_TOKENS tokens less the time for one (prefill + first token).
    decode_ms = statistics.median(
        (one_sequence_s(LATENCY_TOKENS + 1) - one_sequence_s(1)) * 1e3 / LATENCY_TOKENS
        for _ in range(LATENCY_REPEATS))
    return {
        "startup_s": startup_s,
        "tokens": tokens,
        "topk": topk,
        "throughput_tokens_per_s": THROUGHPUT_PROMPTS * THROUGHPUT_TOKENS / throughput_s,
        "throughput_wall_s": throughput_s,
        "decode_ms_per_token": decode_ms,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }


# ------------------------------------------------------------------------------------------ orchestration

def run_variant(style: str, variant: str, tp: int, work: Path) -> dict:
    from sk.reports import model_process_reports, read_reports

    report_dir = work / f"{style}-{variant}-reports"
    out = work / f"{style}-{variant}.json"
    env = {**os.environ, **ENGINE_ENV, "SK_REPORT_DIR": str(report_dir), **VARIANT_ENV[variant]}
    if variant == "stock":
        env.pop("SK_ADAPTERS", None)
    log = work / f"{style}-{variant}.log"
    # The model is written here, so that the engine's process does no torch CPU work before vLLM starts.
    command = [sys.executable, __file__, "--child", str(model_path(style)), "--tp", str(tp), str(out)]
    status = run_child(command, env, log, RUN_TIMEOUT_S, SILENCE_S)
    if status:
        return {"error": f"engine run failed ({status}); log {log}", "log_tail": log.read_text()[-3000:]}
    result = json.loads(out.read_text())
    result["workers"] = [
        {"rank": r["rank"], "pid": r["pid"], "kernel_calls": r["coverage"]["kernel_calls"],
         "fallbacks": r["coverage"]["fallbacks"]}
        for r in model_process_reports(read_reports(report_dir))
    ]
    return result


def answer_end_id(style: str) -> int | None:
    """The token that ends a trained model's answer: its corpus answers on one line, the eval stops at "\n"."""
    if style not in TRAINED_MODELS:
        return None
    from tokenizers import Tokenizer

    (newline,) = Tokenizer.from_file(str(TRAINED_MODELS[style] / "tokenizer.json")).encode(
        "\n", add_special_tokens=False).ids
    return newline


def agreement(stock: dict, ours: dict, answer_end: int | None = None) -> dict:
    """Exact greedy sequences, first divergence, and top-k overlap on the steps before it; with `answer_end`, also
    the sequences equal up to and including that token (a trained model's answer: past it the model was never
    trained, its logits are flat and bf16 rounding decides)."""
    exact, first_divergence, overlaps = 0, [], []
    for s_tok, o_tok, s_top, o_top in zip(stock["tokens"], ours["tokens"], stock["topk"], ours["topk"]):
        diverge = next((i for i, (a, b) in enumerate(zip(s_tok, o_tok)) if a != b), None)
        exact += diverge is None
        first_divergence.append(diverge)
        # Up to and including the first differing step the two runs saw the same context.
        steps = len(s_tok) if diverge is None else diverge + 1
        overlaps += [len(set(a) & set(b)) / TOP_K for a, b in zip(s_top[:steps], o_top[:steps])]
    result = {"exact_sequences": exact, "sequences": len(stock["tokens"]),
              "first_divergence": first_divergence, f"top{TOP_K}_overlap": statistics.mean(overlaps)}
    if answer_end is not None:
        def answer(tokens: list[int]) -> list[int]:
            return tokens[:tokens.index(answer_end) + 1] if answer_end in tokens else tokens
        result["answers_equal"] = sum(answer(a) == answer(b) for a, b in zip(stock["tokens"], ours["tokens"]))
    return result


def greedy_cells(agree: dict | None) -> str:
    """The table's 'greedy = stock' and 'top-k overlap' cells (both engines' tables)."""
    if not agree:
        return "(reference) | "
    answers = f"; answers {agree['answers_equal']}/{agree['sequences']}" if "answers_equal" in agree else ""
    return f"{agree['exact_sequences']}/{agree['sequences']}{answers} | {agree[f'top{TOP_K}_overlap']:.3f}"


def versions() -> dict:
    import torch
    import triton
    import vllm

    import sk

    return {"vllm": vllm.__version__, "torch": torch.__version__, "triton": triton.__version__,
            "standardkernels": sk.__version__, "cuda": torch.version.cuda}


def markdown(summary: dict) -> str:
    lines = [f"# vLLM with and without Standard Kernels ({summary['date']})", "",
             f"GPU: {summary['gpu']}; tensor parallel: {summary['tp']}; versions: "
             + ", ".join(f"{k} {v}" for k, v in summary["versions"].items()), "",
             "bf16, vLLM defaults (Inductor compile + CUDA graphs"
             + ("; all-reduce + RMSNorm fusion off: it needs NVLink multicast" if summary["tp"] > 1 else "")
             + "). Throughput: "
             f"{THROUGHPUT_PROMPTS} prompts x {THROUGHPUT_TOKENS} tokens, median of {THROUGHPUT_REPEATS} batches "
             f"(prompt {PROMPT_LEN} random tokens; trained models: "
             "held-out corpus prompts). Decode: one "
             f"sequence, ms per token. Tokens: {TOKEN_PROMPTS} prompts x {TOKEN_STEPS} greedy steps vs stock "
             "(trained models: also the answers, up to the first newline).", "",
             "| model | variant | start (s) | tokens/s | decode ms/token | greedy = stock | top-5 overlap | "
             "our kernel calls per worker rank | fallbacks |",
             "|---|---|---|---|---|---|---|---|---|"]
    for style, runs in summary["runs"].items():
        for variant, r in runs.items():
            if "error" in r:
                lines.append(f"| {style} | {variant} | {r['error']} | | | | | | |")
                continue
            agree = r.get("agreement")
            calls = "; ".join(f"rank {w['rank']}: " + ", ".join(f"{op} {n}" for op, n in sorted(
                w["kernel_calls"].items())) for w in r["workers"]) or "-"
            fallbacks = sum(f["count"] for w in r["workers"] for f in w["fallbacks"])
            lines.append(
                f"| {style} | {variant} | {r['startup_s']:.0f} | {r['throughput_tokens_per_s']:.0f} | "
                f"{r['decode_ms_per_token']:.2f} | "
                + greedy_cells(agree)
                + f" | {calls} | {fallbacks} |")
    reasons = {f["reason"] for runs in summary["runs"].values() for r in runs.values()
               for w in r.get("workers", []) for f in w["fallbacks"]}
    if reasons:
        lines += ["", "Fallback reasons: " + "; ".join(sorted(reasons))]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (2 on the 2-GPU host)")
    parser.add_argument("--styles", nargs="+", default=list(MODEL_SPECS), choices=STYLES)
    parser.add_argument("--variants", nargs="+", default=list(VARIANT_ENV), choices=list(VARIANT_ENV))
    parser.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        Path(args.outdir).write_text(json.dumps(run_engine(Path(args.child), args.tp)))
        return 0

    from importlib.metadata import entry_points

    if "standardkernels" not in {e.name for e in entry_points(group="vllm.general_plugins")}:
        sys.exit("standardkernels' vllm.general_plugins entry point is not installed: pip install --no-deps -e .")
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vllm-check-", dir=out))
    summary = {"date": datetime.date.today().isoformat(), "tp": args.tp, "versions": versions(), "runs": {}}
    for style in args.styles:
        runs = summary["runs"][style] = {}
        for variant in args.variants:
            print(f"vllm_check: {style} {variant} tp={args.tp}", file=sys.stderr, flush=True)
            runs[variant] = run_variant(style, variant, args.tp, work)
        if "error" not in runs.get("stock", {"error": ""}):
            for variant, r in runs.items():
                if variant != "stock" and "error" not in r:
                    r["agreement"] = agreement(runs["stock"], r, answer_end_id(style))
    summary["gpu"] = next((r["gpu"] for runs in summary["runs"].values() for r in runs.values() if "gpu" in r),
                          None)
    (out / "vllm_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "vllm_check.md").write_text(markdown(summary))
    print(markdown(summary))
    failed = any("error" in r for runs in summary["runs"].values() for r in runs.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
