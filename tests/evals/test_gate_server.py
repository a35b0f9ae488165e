"""`sk gate` through a server: sk-serve + lm-eval's local-completions (SGLang rows always, vLLM with --via-server).

The SGLang server cannot start on our CPU machines (it needs AMX and a CPU build of sgl-kernel): its rows are
checked up to the sk-serve command line here, and the server path itself runs through vLLM's CPU engine.
"""
import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from sk.evals import gate
from sk.workflow import scenarios
from sk.workflow.errors import WorkflowError

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "models" / "trained" / "llama"
LIMIT = 20


def _scenario_file(tmp_path: Path, row: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(f"scenarios:\n  - {{model: {LLAMA}, dtype: float32, workloads: [LLM.single_request], {row}}}\n")
    return path


def test_sglang_row_gives_the_sk_serve_command(tmp_path):
    (row,) = scenarios.load(_scenario_file(tmp_path, "engine: sglang, tp: 2, max_model_len: 256, "
                                                      "engine_args: {mem_fraction_static: 0.3}"))
    command = gate.sk_serve_command(row, str(LLAMA), "stock", 8123, tmp_path / "reports", enforce_eager=True)
    assert command == [
        sys.executable, "-m", "sk.adapters.serve", "--engine", "sglang", str(LLAMA), "--no-sk",
        f"--report-dir={tmp_path / 'reports'}", "--host=127.0.0.1", "--port=8123",
        "--dtype=float32", "--kv-cache-dtype=auto", "--tp-size=2", "--random-seed=0", "--sampling-backend=pytorch",
        "--context-length=256", "--cuda-graph-backend-decode=disabled", "--cuda-graph-backend-prefill=disabled",
        "--mem-fraction-static", "0.3",
    ]
    ours = gate.sk_serve_command(row, str(LLAMA), "ours", 8123, tmp_path / "reports", enforce_eager=False)
    assert "--no-sk" not in ours and not any("cuda-graph" in a for a in ours)
    assert "sglang" in row.slug and "sglang" in row.label


def test_sk_serve_splits_the_gate_command_as_meant(tmp_path):
    from sk.adapters.serve import parse_args

    (row,) = scenarios.load(_scenario_file(tmp_path, "engine: sglang, max_model_len: 256"))
    command = gate.sk_serve_command(row, str(LLAMA), "stock", 8123, tmp_path, enforce_eager=False)
    args, engine_args = parse_args(command[3:])
    assert (args.engine, args.model, args.no_sk, args.report_dir) == ("sglang", str(LLAMA), True, str(tmp_path))
    assert engine_args == command[command.index("--host=127.0.0.1"):]


def test_vllm_row_gives_the_sk_serve_command(tmp_path):
    (row,) = scenarios.load(_scenario_file(tmp_path, "max_model_len: 256, kv_cache_memory_bytes: 268435456, "
                                                      "engine_args: {no_enable_prefix_caching: true}"))
    command = gate.sk_serve_command(row, str(LLAMA), "ours", 8123, tmp_path, enforce_eager=True)
    assert command[command.index("--port=8123") + 1:] == [
        "--dtype=float32", "--kv-cache-dtype=auto", "--tensor-parallel-size=1", "--seed=0", "--max-model-len=256",
        "--kv-cache-memory-bytes=268435456", "--enforce-eager", "--no-enable-prefix-caching"]


@pytest.mark.parametrize("row, message", [
    ("engine: trtllm", "engine: Input should be 'vllm' or 'sglang'"),
    ("engine: sglang, kv_cache_memory_bytes: 268435456", "kv_cache_memory_bytes is a vLLM setting"),
    ("engine: sglang, kv_cache_dtype: fp8", "use fp8_e4m3 or fp8_e5m2"),
])
def test_bad_engine_settings_are_refused(tmp_path, row, message):
    with pytest.raises(WorkflowError, match=message):
        scenarios.load(_scenario_file(tmp_path, row))


def test_commands_that_run_vllm_only_refuse_sglang_rows(tmp_path):
    with pytest.raises(WorkflowError, match=r"scenarios.0.engine is 'sglang'; this command runs vllm only"):
        scenarios.load(_scenario_file(tmp_path, "engine: sglang"), engines=("vllm",))


def test_false_engine_args_are_refused():
    with pytest.raises(WorkflowError, match="engine_args.enable_prefix_caching: false has no command-line form"):
        gate.engine_flags({"enable_prefix_caching": False})


def _gate(*args: str) -> subprocess.CompletedProcess:
    # As in test_gate_engine.py: our ops take their PyTorch path in the CPU engine (no Triton interpreter).
    env = {k: v for k, v in os.environ.items()
           if k not in ("SK_ADAPTERS", "SK_STRICT", "SK_REPORT_DIR", "TRITON_INTERPRET")}
    return subprocess.run([sys.executable, "-m", "sk.evals.gate", *args], capture_output=True, text=True,
                          env=env, timeout=3600)


def _scored(run_dir: Path) -> dict:
    """{(task, doc_id): the log-likelihoods of the choices, or the generated text} of one lm-eval run."""
    samples = json.loads((run_dir / "lm_eval.json").read_text())["samples"]
    return {(task, s["doc_id"]): [r if isinstance(r, str) else float(r[0]) for r in s["filtered_resps"]]
            for task, items in samples.items() for s in items}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(find_spec("vllm") is None or find_spec("lm_eval") is None,
                    reason="needs vLLM and lm-eval (the ci/envs/vllm_cpu.sh venv)")
def test_server_path_passes_and_scores_as_in_process(tmp_path):
    scenario = _scenario_file(tmp_path, "max_model_len: 256, kv_cache_memory_bytes: 268435456")
    served = _gate(str(scenario), "--via-server", "--enforce-eager", "--limit", str(LIMIT), "--out",
                   str(tmp_path / "served"))
    assert served.returncode == 0, served.stdout[-8000:] + served.stderr[-4000:]
    (result,) = json.loads((tmp_path / "served" / "gate.json").read_text())
    assert result["runs"]["ours"]["backend"] == "local-completions"
    assert result["runs"]["ours"]["server_exit_status"] == 0
    assert {op for op, n in result["activity"]["op_calls"].items() if n} >= {"fused_gated_mlp/rms"}  # norm + MLP
    assert "through sk-serve" in served.stdout and "gate: PASS" in served.stdout

    in_process = _gate(str(scenario), "--enforce-eager", "--limit", str(LIMIT), "--out", str(tmp_path / "direct"))
    assert in_process.returncode == 0, in_process.stdout[-8000:] + in_process.stderr[-4000:]
    slug = next(p.name for p in (tmp_path / "served").iterdir() if p.is_dir())
    for variant in gate.VARIANTS:
        by_server, by_engine = (_scored(tmp_path / run / slug / variant) for run in ("served", "direct"))
        assert by_server.keys() == by_engine.keys() and len(by_server) == 2 * LIMIT
        for item, scores in by_engine.items():
            # Measured identical (fp32, CPU); the slack only absorbs a batch-shape rounding change.
            assert by_server[item] == pytest.approx(scores, abs=1e-4), (variant, item)


def test_the_gate_waits_longer_than_sk_serve_takes_to_stop():
    from sk.adapters import serve

    assert gate.SERVER_STOP_TIMEOUT_S >= serve.GRACE_S + serve.TERM_S + 20
