"""sk-serve's watchdog: ends the engine's process group when sk-serve dies, even by SIGKILL.

    python -S adapters/watchdog.py SK_SERVE_PID

sk-serve starts this first, as the leader of a new process group, and the engine server in that group; the
engine's own processes (vLLM's EngineCore and workers, SGLang's schedulers) inherit it. When sk-serve is gone,
the watchdog sends SIGTERM to the group, then SIGKILL (itself included). While sk-serve lives it only polls:
sk-serve's own stop signals the group too, which the watchdog ignores until the final SIGKILL.
Run by path with the standard library only, so that it starts in milliseconds (no torch import).
"""
import os
import signal
import sys
import time

POLL_S = 0.2
# Between SIGTERM and SIGKILL to the group once sk-serve is gone: the engine's chance to stop by itself.
TERM_S = 2.0


def main() -> None:
    parent = int(sys.argv[1])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    while os.getppid() == parent:
        time.sleep(POLL_S)
    group = os.getpgid(0)
    os.killpg(group, signal.SIGTERM)
    time.sleep(TERM_S)
    os.killpg(group, signal.SIGKILL)


if __name__ == "__main__":
    main()
