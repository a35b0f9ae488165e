"""One engine process of `sk capture` / `sk eval` / `sk profile`: start the engine for a scenario, then serve the
parent's commands (run a workload's batch, capture, profile) until told to exit.

    python -m sk.workflow.engine_job JOB.json

The parent (sk.workflow.engine_runner) decides baseline or candidate through the environment it gives this
process (SK_ADAPTERS=vllm|sglang switches our adapter on in every engine process) or, for the user's candidate
modules, through the candidate worker extension; both runs execute this same code with identical settings.
Commands arrive on stdin as JSON lines; progress and results go to stdout as lines starting with EVENT_PREFIX;
everything else printed here (the engine's logs) goes to the parent's log file. A paired eval keeps two such
processes alive on one device and alternates their batches (sk.workflow.paired).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

from tqdm import tqdm

from sk.workflow import prompts
from sk.workflow.front_end_clock import front_end_clock
from sk.workflow.scenarios import TINY_PREFIX, Scenario
from sk.workflow.workloads import Purpose, resolve

EVENT_PREFIX = "@sk-event "
CAPTURE_EXTENSION = "sk.workflow.capture_worker.OperatorCapture"
CANDIDATE_EXTENSION = "sk.workflow.candidate_worker.CandidateLayers"
PROFILE_EXTENSION = "sk.workflow.profile_worker.StepProfiler"
# vLLM's and SGLang's own defaults for the device memory an engine may take.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_MEM_FRACTION_STATIC = 0.8
# SGLang's schedulers write the profiler's trace after stop_profile returns.
TRACE_WAIT_S = 120
# Log-probabilities kept per generated position in MATCH: enough to rank both engines' tokens at a divergence
# (vLLM's default max_logprobs; 5 left a 0.125-nat near-tie unjudged on the H200, results/h200/engines, 2026-12-04).
MATCH_TOP_LOGPROBS = 20
# An engine that has just returned a batch may still be retiring it: how long a prefix-cache reset is retried.
RESET_TRIES, RESET_PAUSE_S = 100, 0.1
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


def _until_done(attempt, what: str) -> None:
    for _ in range(RESET_TRIES):
        if attempt():
            return
        time.sleep(RESET_PAUSE_S)
    raise RuntimeError(f"{what} did not succeed within {RESET_TRIES * RESET_PAUSE_S:.0f} s: the engine still holds "
                       "requests after its batch returned")


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


def device_identity() -> dict:
    """The card a run measured: its name and, on a GPU, its UUID (`sk profile --compare` says whether two
    profiles ran on one card: only then do their kernel times compare)."""
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu"}
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))
    known = re.fullmatch(r"(GPU-)?[0-9a-fA-F-]{32,36}", uuid)  # not an object's repr from another torch build
    return {"device": torch.cuda.get_device_name(0), **({"device_uuid": uuid} if known else {})}


def memory_args(scenario: Scenario, slot: int, engines: int) -> dict:
    """The memory arguments of engine `slot` (0-based, in start order) of `engines` sharing one device.

    vLLM: gpu_memory_utilization is a per-engine budget, so each gets an equal share. SGLang: mem_fraction_static
    is the share of the whole device in use once its pool is allocated, counting memory other engines hold, so
    engine k of n gets the cumulative (k+1)/n of it and every engine ends up with the same pool. An explicit KV
    cache size (vLLM's CPU engine) is the same for every engine.
    """
    if engines == 1 or scenario.kv_cache_memory_bytes is not None:
        return {}
    if scenario.engine == "vllm":
        total = scenario.engine_args.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
        return {"gpu_memory_utilization": round(total / engines, 4)}
    total = scenario.engine_args.get("mem_fraction_static", DEFAULT_MEM_FRACTION_STATIC)
    return {"mem_fraction_static": round(total * (slot + 1) / engines, 4)}


class VllmEngine:
    def __init__(self, scenario: Scenario, job: dict):
        from vllm import LLM

        args = {
            **job["model_args"],  # resolved by the parent (sk.workflow.engine_runner)
            "dtype": scenario.dtype,
            "tensor_parallel_size": scenario.tp,
            "kv_cache_dtype": scenario.kv_cache_dtype,
            "seed": 0,
            "enforce_eager": job["enforce_eager"] or job["mode"] == "capture",  # captures read Python hooks
            **scenario.engine_args,
            **memory_args(scenario, job["slot"], job["engines"]),
        }
        for key in ("max_model_len", "kv_cache_memory_bytes"):
            if getattr(scenario, key) is not None:
                args[key] = getattr(scenario, key)
        extension = {"capture": CAPTURE_EXTENSION, "profile": PROFILE_EXTENSION}.get(job["mode"])
        if job["candidates"]:
            extension = CANDIDATE_EXTENSION
        if extension:
            args["worker_extension_cls"] = extension
        self.llm = LLM(**args)

    def tokenizer(self):
        return self.llm.get_tokenizer()

    def generate(self, requests: list[prompts.Request], progress: bool = False, top_logprobs: int = 0,
                 detokenize: bool = True) -> tuple[list[list[int]], list | None]:
        """Greedy tokens per request and, with `top_logprobs`, per position the top [token, logprob] pairs."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # Greedy with a fixed number of tokens per request: both engines do the same work, and any difference in
        # the tokens is a difference in the numbers the kernels computed.
        params = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True,
                                 logprobs=top_logprobs or None, detokenize=detokenize) for r in requests]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=r.prompt_token_ids) for r in requests], params,
                                    use_tqdm=_ProgressToParent if progress else False)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        if not top_logprobs:
            return tokens, None
        return tokens, [[[[t, lp.logprob] for t, lp in (position or {}).items()] for position in o.outputs[0].logprobs]
                        for o in outputs]

    def batch(self, requests: list[prompts.Request]) -> tuple[list[list[int]], dict]:
        """A timed batch's tokens and where its time went in this process (sk.workflow.front_end_clock). Its
        tokens are counted, never read as text: vLLM detokenizes in this process, which feeds the engine core,
        so the batch skips it (both variants alike) to keep a front end that falls behind out of the time."""
        with front_end_clock(self.llm.llm_engine) as clock:
            tokens, _ = self.generate(requests, progress=True, detokenize=False)
        return tokens, {"front_end": clock}

    def reset_prefix_cache(self) -> None:
        _until_done(self.llm.reset_prefix_cache, "vLLM's reset_prefix_cache()")

    def rank0(self, method: str, *args):
        # Rank 0's answer: with tensor parallelism every rank runs the same operators on its shard.
        return self.llm.collective_rpc(method, args=args)[0]

    def capture_reset(self) -> None:
        self.llm.collective_rpc("sk_capture_reset")

    def capture_operators(self) -> list[dict]:
        return self.rank0("sk_capture_operators")

    def profile(self, run, keep: str | None = None) -> dict:
        self.llm.collective_rpc("sk_profile_start")
        run()
        return self.rank0("sk_profile_stop", keep)

    def graph_replay(self, batch_size: int) -> float | None:
        """Median µs of one replay of rank 0's FULL CUDA graph of a `batch_size` decode batch (profile mode)."""
        return self.rank0("sk_graph_replay", batch_size)

    def graph_clocks(self, batch_size: int) -> dict | None:
        """Rank 0's card under that graph replayed (sk.workflow.profile_worker.clocks_under)."""
        return self.rank0("sk_graph_clocks", batch_size)

    def candidates_replaced(self):
        return self.rank0("sk_candidates_replaced")

    def scheduler_reports(self) -> int:
        return 0  # vLLM's workers keep their reports written themselves (sk.reports)

    def kv_cache_tokens(self) -> int | None:
        """Tokens the engine's KV cache holds (vLLM's blocks, as its engine core reported them, times their size)."""
        cache = self.llm.llm_engine.vllm_config.cache_config
        return cache.num_gpu_blocks * cache.block_size if cache.num_gpu_blocks else None

    def environment(self) -> dict:
        import torch
        import vllm

        hf_config = self.llm.llm_engine.model_config.hf_config
        return {"engine": "vllm", "vllm": vllm.__version__, "torch": torch.__version__, **device_identity(),
                "architecture": hf_config.model_type, "num_hidden_layers": hf_config.num_hidden_layers}

    def close(self) -> None:
        del self.llm


def sglang_engine_args(scenario: Scenario, job: dict) -> dict:
    """sglang.Engine's arguments for a scenario row: the same settings as the vLLM row's, in SGLang's names."""
    args = {"model_path": job["model_args"]["model"], "dtype": scenario.dtype, "tp_size": scenario.tp,
            "kv_cache_dtype": scenario.kv_cache_dtype, "random_seed": 0, "sampling_backend": "pytorch",
            # Captures read Python hooks: no CUDA graphs.
            "disable_cuda_graph": job["enforce_eager"] or job["mode"] == "capture", **scenario.engine_args,
            **memory_args(scenario, job["slot"], job["engines"])}
    if "hf_overrides" in job["model_args"]:
        args["json_model_override_args"] = json.dumps(job["model_args"]["hf_overrides"])
        args["load_format"] = job["model_args"]["load_format"]
    if scenario.max_model_len is not None:
        args["context_length"] = scenario.max_model_len
    return args


class SglangEngine:
    """sglang.Engine; its layers run in scheduler processes, reached through Engine.get_server_info (each
    scheduler's internal state: our adapter's report, sk.workflow.sglang_capture's record) and its profiler."""

    def __init__(self, scenario: Scenario, job: dict):
        import sglang

        args = sglang_engine_args(scenario, job)
        self.model_path = args["model_path"]
        if job["mode"] == "profile":
            import tempfile

            self.profile_dir = tempfile.mkdtemp(prefix="sk-sglang-profile-")
            # SGLang's own variable, read by its schedulers (spawned below) where start_profile names no folder.
            os.environ["SGLANG_TORCH_PROFILER_DIR"] = self.profile_dir
        self.engine = sglang.Engine(**args)

    def tokenizer(self):
        return self.engine.tokenizer_manager.tokenizer

    def generate(self, requests: list[prompts.Request], progress: bool = False,
                 top_logprobs: int = 0) -> tuple[list[list[int]], list | None]:
        """Greedy tokens per request and, with `top_logprobs`, per position the top [token, logprob] pairs."""
        params = [{"temperature": 0.0, "max_new_tokens": r.max_tokens, "ignore_eos": True} for r in requests]
        logprobs = {"return_logprob": True, "top_logprobs_num": top_logprobs} if top_logprobs else {}
        outputs = self.engine.generate(input_ids=[r.prompt_token_ids for r in requests], sampling_params=params,
                                       **logprobs)
        if progress:
            emit("requests_done", n=len(requests))
        tokens = [list(o["output_ids"]) for o in outputs]
        if not top_logprobs:
            return tokens, None
        # SGLang's meta_info: per position a list of (logprob, token id, text) triples, or None.
        return tokens, [[[[t, lp] for lp, t, *_ in (position or [])]
                         for position in o["meta_info"]["output_top_logprobs"]] for o in outputs]

    def batch(self, requests: list[prompts.Request]) -> tuple[list[list[int]], dict]:
        """A timed batch's tokens (SGLang detokenizes in a process of its own, beside the scheduler's)."""
        tokens, _ = self.generate(requests, progress=True)
        return tokens, {}

    def reset_prefix_cache(self) -> None:
        _until_done(lambda: self.engine.flush_cache().success, "SGLang's flush_cache()")

    def _states(self) -> list[dict]:
        # Each scheduler's internal state; asking makes our adapter write each scheduler's report.
        return self.engine.get_server_info()["internal_states"]

    def capture_reset(self) -> None:
        self._states()  # each ask hands over (and clears) the calls recorded since the last one

    def capture_operators(self) -> list[dict]:
        from sk.workflow.sglang_capture import STATE_KEY

        return self._states()[0].get(STATE_KEY, [])

    def profile(self, run, keep: str | None = None) -> dict:
        import glob

        from sk.workflow.kernel_profile import load_trace, rank_path, summarize_trace

        seen = set(glob.glob(os.path.join(self.profile_dir, "**", "*.trace.json*"), recursive=True))
        try:
            self.engine.start_profile(output_dir=self.profile_dir, activities=["GPU"])
        except TypeError:  # an SGLang whose start_profile takes no options: SGLANG_TORCH_PROFILER_DIR (set at start)
            self.engine.start_profile()
        steps = run()
        self.engine.stop_profile()
        deadline = time.monotonic() + TRACE_WAIT_S
        while not (traces := sorted(set(glob.glob(os.path.join(self.profile_dir, "**", "*TP-0*.trace.json*"),
                                                  recursive=True)) - seen)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"SGLang's profiler wrote no trace of TP rank 0 in {self.profile_dir} within "
                                   f"{TRACE_WAIT_S} s")
            time.sleep(1)
        time.sleep(2)  # the scheduler may still be writing the file it just created
        return summarize_trace(load_trace(traces[0]), steps=steps, device="cuda", keep=keep and rank_path(keep, 0))

    def graph_replay(self, batch_size: int) -> None:
        return None  # SGLang's graphs live in its scheduler process, which takes no such call

    def graph_clocks(self, batch_size: int) -> None:
        return None

    def candidates_replaced(self):
        return None

    def scheduler_reports(self) -> int:
        return sum("standardkernels" in state for state in self._states())

    def kv_cache_tokens(self) -> int | None:
        """Tokens the engine's KV cache holds (SGLang's max_total_num_tokens, TP rank 0's scheduler)."""
        return self.engine.get_server_info().get("max_total_num_tokens")

    def environment(self) -> dict:
        import sglang
        import torch
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.model_path)
        return {"engine": "sglang", "sglang": sglang.__version__, "torch": torch.__version__, **device_identity(),
                "architecture": config.model_type, "num_hidden_layers": config.num_hidden_layers}

    def close(self) -> None:
        self.engine.shutdown()
        if hasattr(self, "profile_dir"):
            import shutil

            shutil.rmtree(self.profile_dir, ignore_errors=True)


ENGINES = {"vllm": VllmEngine, "sglang": SglangEngine}


def workload_requests(engine, token: str, max_requests: int | None) -> list[prompts.Request]:
    spec = resolve(token).spec
    if spec.purpose is Purpose.THROUGHPUT:
        count = min(spec.num_requests, max_requests or spec.num_requests)
        return prompts.throughput_requests(spec, count, engine.tokenizer())
    return prompts.latency_requests(spec, engine.tokenizer())


class Server:
    """The commands the parent sends, one method each; each returns the JSON-able result."""

    def __init__(self, engine, job: dict):
        self.engine, self.job, self._requests = engine, job, {}

    def requests(self, token: str) -> list[prompts.Request]:
        if token not in self._requests:
            self._requests[token] = workload_requests(self.engine, token, self.job["max_requests"])
        return self._requests[token]

    def match(self, workload: str) -> dict:
        """Greedy tokens of the workload's requests, apart from the timed batches, with each position's top
        log-probabilities (to tell a divergence at a near-tie from a wrong token)."""
        requests = self.requests(workload)
        tokens, top = self.engine.generate(requests, progress=True, top_logprobs=MATCH_TOP_LOGPROBS)
        return {"input_lens": [len(r.prompt_token_ids) for r in requests], "tokens": tokens, "top_logprobs": top}

    def batch(self, workload: str) -> dict:
        """One timed batch of the workload's requests, its prompts computed afresh (every batch repeats the same
        prompts, which the engine's prefix cache would otherwise serve without their prefill)."""
        requests = self.requests(workload)
        self.engine.reset_prefix_cache()
        started_at, start = time.time(), time.perf_counter()  # the wall clock: to line batches up with GPU logs
        tokens, details = self.engine.batch(requests)
        return {"elapsed_s": time.perf_counter() - start, "output_tokens": sum(len(t) for t in tokens),
                "started_at": started_at, **details}

    def capture_reset(self) -> None:
        self.engine.capture_reset()

    def capture(self) -> list[dict]:
        return self.engine.capture_operators()

    def profile(self, workload: str, keep: str | None = None) -> dict:
        """One batch of `workload` under the profiler: the summary; `keep` (a path, "{rank}" in it the rank): where
        the trace's device events go."""
        requests = self.requests(workload)
        # The engine's own step count where it has one (vLLM's worker); else a fixed batch's, one step per
        # generated token (a throughput batch's is unknown).
        steps = requests[0].max_tokens if resolve(workload).spec.purpose is Purpose.LATENCY else None

        def run():
            self.engine.generate(requests)
            return steps

        self.engine.reset_prefix_cache()  # the warm-up batch left these prompts cached
        return self.engine.profile(run, keep)

    @staticmethod
    def _decode_batch(workload: str) -> int | None:
        """A latency workload's batch size (its decode graph's); None for a throughput workload."""
        spec = resolve(workload).spec
        return spec.batch_size if spec.purpose is Purpose.LATENCY else None

    def graph_replay(self, workload: str) -> float | None:
        """A latency workload's decode step on the GPU alone: the median µs of one replay of the engine's FULL CUDA
        graph of its batch (sk.workflow.profile_worker); None for a throughput workload, or where the engine
        captured no such graph or cannot be asked (SGLang)."""
        batch = self._decode_batch(workload)
        return None if batch is None else self.engine.graph_replay(batch)

    def graph_clocks(self, workload: str) -> dict | None:
        """The card's clocks and power while that decode graph replays (as `graph_replay`: None where there is
        none)."""
        batch = self._decode_batch(workload)
        return None if batch is None else self.engine.graph_clocks(batch)

    def info(self) -> dict:
        return {"environment": self.engine.environment(), "kv_cache_tokens": self.engine.kv_cache_tokens(),
                "candidates_replaced": self.engine.candidates_replaced() if self.job["candidates"] else None,
                "scheduler_reports": self.engine.scheduler_reports()}


def main(job_path: str) -> None:
    job = json.loads(open(job_path).read())
    scenario = Scenario.model_validate(job["scenario"])
    engine = ENGINES[scenario.engine](scenario, job)
    server = Server(engine, job)
    emit("engine_ready")
    for line in sys.stdin:
        command = json.loads(line)
        name = command.pop("command")
        if name == "exit":
            break
        emit("result", value=getattr(server, name)(**command))
    engine.close()
    emit("closed")


if __name__ == "__main__":  # the engines spawn their workers: the module must be importable without side effects
    main(sys.argv[1])
