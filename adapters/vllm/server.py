"""vLLM's OpenAI-compatible server as sk-serve runs it: `vllm serve`, except that requests still running when
the server has stopped its engine get an HTTP error instead of no answer.

    python -m sk.adapters.vllm.server serve MODEL [vllm serve arguments...]

With --shutdown-timeout N > 0, vLLM's API server on SIGTERM lets in-flight requests drain for N s, then kills
its engine core and cancels the task that hands outputs to requests (`AsyncLLM.shutdown`): requests still
waiting are never answered, and uvicorn waits for their connections until the process is killed. Here, after
`AsyncLLM.shutdown` returns, each such request gets an EngineDeadError, which vLLM's own handlers answer with
HTTP 500 (a streamed request gets an error event). Only this process, the API server, is changed; the same with
--no-sk, since it concerns the server's lifecycle, not the kernels (NOTES.md, "Shutdown").
"""
from __future__ import annotations

import functools
import sys

SHUTDOWN_MESSAGE = ("The server is shutting down: this request was still running when its drain time "
                    "(--shutdown-timeout) ran out.")


def fail_requests_left_at_shutdown() -> None:
    """Patch AsyncLLM.shutdown (vLLM 0.25 and 0.32 have the same one) to fail the requests it leaves."""
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError

    class ServerStopped(EngineDeadError):
        def __init__(self):
            Exception.__init__(self, SHUTDOWN_MESSAGE)  # not EngineDeadError's "see stack trace" text

    stock = AsyncLLM.shutdown

    @functools.wraps(stock)
    def shutdown(self, *args, **kwargs):
        try:
            return stock(self, *args, **kwargs)
        finally:
            _fail_waiting_requests(self, ServerStopped)

    AsyncLLM.shutdown = shutdown


def _fail_waiting_requests(llm, error: type[Exception]) -> None:
    handler = getattr(llm, "output_handler", None)
    processor = getattr(llm, "output_processor", None)
    if handler is None or processor is None or not processor.request_states:
        return
    # shutdown runs in an executor thread; the requests' queues belong to the server's event loop.
    try:
        handler.get_loop().call_soon_threadsafe(processor.propagate_error, error())
    except RuntimeError:  # the loop is closed: nobody waits for these requests any more
        pass


def main() -> None:
    fail_requests_left_at_shutdown()
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    sys.exit(main())
