"""One engine process of `sk capture` / `sk eval`: start the engine for a scenario, run its workloads, write JSON.

    python -m sk.workflow.engine_job JOB.json

The parent (sk.workflow.engine_runner) decides baseline or candidate through the environment it gives this
process (SK_ADAPTERS=vllm switches our adapter on in every engine process) or, for the user's candidate
modules, through the candidate worker extension; both runs execute this same code with identical settings.
Progress goes to stdout as lines starting with EVENT_PREFIX; everything else printed here (the engine's
logs) goes to the parent's log file.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from tqdm import tqdm

from sk.workflow import prompts
from sk.workflow.scenarios import TINY_PREFIX, Scenario
from sk.workflow.workloads import Purpose, resolve

EVENT_PREFIX = "@sk-event "
CAPTURE_EXTENSION = "sk.workflow.capture_worker.OperatorCapture"
CANDIDATE_EXTENSION = "sk.workflow.candidate_worker.CandidateLayers"
_DEVNULL = open(os.devnull, "w")


def emit(event: str, **fields) -> None:
    print(EVENT_PREFIX + json.dumps({"event": event, **fields}), flush=True)


class _ProgressToParent(tqdm):
    """vLLM's generate() accepts a tqdm factory; this one reports finished requests to the parent instead of
    drawing (vLLM reads its elapsed time, so it must stay enabled)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "file": _DEVNULL})

    def update(self, n=1):
        emit("requests_done", n=n)
        return super().update(n)


def truncated_model_args(scenario: Scenario, max_layers: int | None) -> dict:
    """Engine arguments naming the model, with only `max_layers` layers when asked.

    An sk-tiny model is written with that many layers (its own weights). Any other checkpoint, sk-trained ones
    included, cannot load into a shallower model (vLLM refuses the extra layers' weights), so it runs on vLLM's
    dummy weights (fixed seed, identical in both runs): the shapes are the real ones, the values are not.
    """
    if scenario.model.startswith(TINY_PREFIX):
        import dataclasses

        import sk.models

        spec = scenario.tiny_model_spec()
        if max_layers:
            spec = dataclasses.replace(spec, num_layers=min(max_layers, spec.num_layers))
        return {"model": str(sk.models.tiny_model(spec))}
    if max_layers:
        return {"model": scenario.checkpoint(), "hf_overrides": {"num_hidden_layers": max_layers},
                "load_format": "dummy"}
    return {"model": scenario.checkpoint()}


def start_engine(scenario: Scenario, job: dict):
    from vllm import LLM

    args = {
        **job["model_args"],  # resolved by the parent (sk.workflow.engine_runner)
        "dtype": scenario.dtype,
        "tensor_parallel_size": scenario.tp,
        "kv_cache_dtype": scenario.kv_cache_dtype,
        "seed": 0,
        "enforce_eager": job["enforce_eager"] or job["capture"],  # captures read Python hooks: eager only
        **scenario.engine_args,
    }
    for key in ("max_model_len", "kv_cache_memory_bytes"):
        if getattr(scenario, key) is not None:
            args[key] = getattr(scenario, key)
    if job["capture"]:
        args["worker_extension_cls"] = CAPTURE_EXTENSION
    elif job["candidates"]:
        args["worker_extension_cls"] = CANDIDATE_EXTENSION
    return LLM(**args)


def generate(llm, requests: list[prompts.Request], progress: bool = False) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    # Greedy with a fixed number of tokens per request: both engines do the same work, and any difference in
    # the tokens is a difference in the numbers the kernels computed.
    params = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True) for r in requests]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=r.prompt_token_ids) for r in requests], params,
                           use_tqdm=_ProgressToParent if progress else False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def run_throughput(llm, spec, max_requests: int | None) -> dict:
    count = min(spec.num_requests, max_requests or spec.num_requests)
    requests = prompts.throughput_requests(spec, count, llm.get_tokenizer())
    emit("workload", total=count + 1)
    generate(llm, requests[:1])  # warm-up: first-call costs stay out of the timing
    emit("requests_done", n=1)
    start = time.perf_counter()
    tokens = generate(llm, requests, progress=True)
    elapsed = time.perf_counter() - start
    return {
        "purpose": Purpose.THROUGHPUT.value,
        "input_lens": [len(r.prompt_token_ids) for r in requests],
        "output_lens": [len(t) for t in tokens],
        "elapsed_s": elapsed,
        "output_tokens_per_s": sum(len(t) for t in tokens) / elapsed,
        "tokens": tokens,
    }


def run_latency(llm, spec) -> dict:
    requests = prompts.latency_requests(spec, llm.get_tokenizer())
    emit("workload", total=spec.warmup + spec.iterations)
    for _ in range(spec.warmup):
        generate(llm, requests)
        emit("requests_done", n=1)
    times = []
    for _ in range(spec.iterations):
        start = time.perf_counter()
        tokens = generate(llm, requests)
        times.append(time.perf_counter() - start)
        emit("requests_done", n=1)
    return {
        "purpose": Purpose.LATENCY.value,
        "batch_size": spec.batch_size,
        "input_len": spec.input_len,
        "output_len": spec.output_len,
        "iterations": spec.iterations,
        "times_s": times,
        "median_s": statistics.median(times),
        "tokens": tokens,
    }


def main(job_path: str) -> None:
    import torch
    import vllm

    job = json.loads(open(job_path).read())
    scenario = Scenario.model_validate(job["scenario"])
    llm = start_engine(scenario, job)
    emit("engine_ready")
    results = {}
    for token in scenario.workloads:
        spec = resolve(token).spec
        if job["capture"]:
            llm.collective_rpc("sk_capture_reset")  # drop the engine's start-up profiling runs
        if spec.purpose is Purpose.THROUGHPUT:
            results[token] = run_throughput(llm, spec, job["max_requests"])
        else:
            results[token] = run_latency(llm, spec)
        if job["capture"]:
            # Rank 0's record: with tensor parallelism every rank runs the same operators on its shard.
            results[token]["operators"] = llm.collective_rpc("sk_capture_operators")[0]
    hf_config = llm.llm_engine.model_config.hf_config
    environment = {"vllm": vllm.__version__, "torch": torch.__version__,
                   "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                   "architecture": hf_config.model_type, "num_hidden_layers": hf_config.num_hidden_layers}
    replaced = llm.collective_rpc("sk_candidates_replaced")[0] if job["candidates"] else None
    with open(job["out"], "w") as f:
        json.dump({"environment": environment, "workloads": results, "candidates_replaced": replaced}, f)


if __name__ == "__main__":
    main(sys.argv[1])
