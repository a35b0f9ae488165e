"""The torch profiler inside a vLLM worker process, injected as vLLM's `worker_extension_cls` by `sk profile`.

`LLM.collective_rpc("sk_profile_start")` starts torch.profiler in the worker (the process that runs the model's
kernels) and counts the engine steps it executes; `sk_profile_stop` stops it and returns the trace's summary
(sk.workflow.kernel_profile), and keeps the trace's device events where asked. CUDA: the device's kernels, CUDA
graph replays included; CPU: the CPU ops.
"""
from __future__ import annotations

import json
import os
import tempfile

import torch

from sk.workflow.kernel_profile import rank_path, summarize_trace


class StepProfiler:
    """Methods mixed into the vLLM worker, called through LLM.collective_rpc."""

    def sk_profile_start(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CUDA if torch.cuda.is_available()
                      else torch.profiler.ProfilerActivity.CPU]
        self._sk_steps = 0
        execute_model = type(self).execute_model

        def counted(*args, **kwargs):
            output = execute_model(self, *args, **kwargs)
            scheduled = getattr(args[0] if args else None, "total_num_scheduled_tokens", 1)
            self._sk_steps += bool(scheduled)  # steps that ran the model, not empty scheduler ticks
            return output

        self.execute_model = counted  # an instance attribute: the executor's calls by name find it first
        self._sk_profiler = torch.profiler.profile(activities=activities)
        self._sk_profiler.__enter__()

    def sk_profile_stop(self, keep: str | None = None) -> dict:
        """The summary; `keep`: a path for the trace's device events, "{rank}" in it this worker's rank."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._sk_profiler.__exit__(None, None, None)
        del self.execute_model
        fd, path = tempfile.mkstemp(prefix="sk-profile-", suffix=".json")
        os.close(fd)
        try:
            self._sk_profiler.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        finally:
            os.unlink(path)
        return summarize_trace(trace, steps=self._sk_steps, device="cuda" if torch.cuda.is_available() else "cpu",
                               keep=keep and rank_path(keep, getattr(self, "rank", 0)))
