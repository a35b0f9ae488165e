"""One lm-eval run of the project's tasks (the gate starts one per variant).

    python -m sk.evals.lm_eval_job JOB.json   # {"backend": "vllm"|"local-completions", "model_args": {...},
                                              #  "limit": N|null, "out": PATH}

`vllm`: the engine runs in this process. `local-completions`: the engine is a server (sk-serve) that the gate
started; this process only sends requests.
Writes {"results", "samples", "adapter_reports"} to `out`. lm-eval is used through its Python API rather than
its CLI so that, while an in-process engine still runs, each worker can be asked for our adapter's report
(`collective_rpc`): at-exit report files are lost when vLLM force-kills a busy worker at shutdown. A server's
processes write their own reports (the gate reads them); adapter_reports is then empty.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sk.reports import current_report, is_active
from sk.evals.task_data import TASK_FILES, TASKS_DIR


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    ask_workers = job["backend"] == "vllm" and is_active("vllm")
    if ask_workers:
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc ships a function (pickled)

    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    lm = get_model(job["backend"])(**job["model_args"])
    evaluation = lm_eval.simple_evaluate(model=lm, tasks=list(TASK_FILES), limit=job["limit"],
                                         task_manager=TaskManager(include_path=str(TASKS_DIR)),
                                         log_samples=True)
    reports = []
    if ask_workers:
        reports = [r for r in lm.model.collective_rpc(current_report) if r is not None]
    out = {"results": evaluation["results"], "samples": evaluation["samples"], "adapter_reports": reports}
    Path(job["out"]).write_text(json.dumps(out, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
