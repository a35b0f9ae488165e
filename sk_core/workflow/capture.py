"""`sk capture`: the operators an engine executes under each workload of a scenario file, one JSON per pair.

Each scenario's engine runs once, eagerly, over all of its workloads, recording its layers where they run:
vLLM rows with sk.workflow.capture_worker in the workers, SGLang rows with sk.workflow.sglang_capture in the
schedulers (SK_CAPTURE=1). The record is reset before each workload, so a file holds exactly that workload's
calls.
"""
from __future__ import annotations

import json
from pathlib import Path

from sk import settings
from sk.workflow import scenarios
from sk.workflow.engine_runner import progress_bars, run_engine_job
from sk.workflow.errors import WorkflowError
from sk.workflow.workloads import resolve

SCHEMA = "standardkernels.capture/1"


def capture_path(out_dir: Path, scenario: scenarios.Scenario, token: str) -> Path:
    return out_dir / f"{scenario.slug}.{resolve(token).value}.json"


def run(scenario_file: str, out_dir: Path, max_layers: int | None, max_requests: int | None) -> list[Path]:
    written = []
    loaded = scenarios.load(scenario_file)
    scenarios.check_fits(loaded, 1, scenario_file)
    with progress_bars() as progress:
        for scenario in loaded:
            env = {settings.env_name("capture"): "1"} if scenario.engine == "sglang" else {}
            result = run_engine_job(scenario, label=f"capture {scenario.model}", env=env,
                                    log_path=out_dir / "logs" / f"{scenario.slug}.log", progress=progress,
                                    capture=True, max_layers=max_layers, max_requests=max_requests)
            for token, workload in result["workloads"].items():
                path = capture_path(out_dir, scenario, token)
                path.write_text(json.dumps({
                    "schema": SCHEMA,
                    "scenario": scenario.model_dump(),
                    "workload": token,
                    "max_layers": max_layers,
                    "max_requests": max_requests,
                    "environment": result["environment"],
                    "operators": workload["operators"],
                }, indent=1) + "\n")
                written.append(path)
    return written


def read_json(path: Path) -> dict:
    """A JSON file of a capture folder; {} for JSON that is not an object (not a capture), a WorkflowError
    naming the file when it cannot be read or parsed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WorkflowError(f"{path} in the capture folder is not a readable JSON file ({type(e).__name__}: {e}); "
                            "move it away or capture again") from None
    return data if isinstance(data, dict) else {}


def distinct_calls(capture_dir: Path, arch: str) -> dict[str, int]:
    """Operator -> number of distinct (init params, inputs) captured for models of architecture `arch`."""
    seen: dict[str, set[str]] = {}
    for path in Path(capture_dir).glob("*.json"):
        data = read_json(path)
        if data.get("schema") == SCHEMA and data["environment"]["architecture"] == arch:
            for e in data["operators"]:
                seen.setdefault(e["op"], set()).add(json.dumps([e["init"], e["inputs"]], sort_keys=True))
    return {op: len(calls) for op, calls in seen.items()}


def load_captures(capture_dir: Path) -> list[dict]:
    """Every capture file in `capture_dir`; WorkflowError when there is none."""
    captures = []
    for path in sorted(Path(capture_dir).glob("*.json")):
        data = read_json(path)
        if data.get("schema") == SCHEMA:
            captures.append(data | {"path": str(path)})
    if not captures:
        raise WorkflowError(f"no capture in {capture_dir}/: run `sk capture SCENARIO.yaml --out {capture_dir}` first")
    return captures
