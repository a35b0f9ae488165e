"""Process and port helpers for the sk-serve tests.

A process tree is found by parent pid while it is alive (`tree`), and checked later by pid (`alive`). Every
process sk-serve starts also inherits a marker variable (`with_marker`), but vLLM's and SGLang's processes
set their title with setproctitle, which overwrites the memory /proc/PID/environ is read from: the marker
finds those that keep it (orphans included), the tree finds the rest.
"""
import os
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when it is gone."""
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def tree(root: int) -> set[int]:
    """`root` and its live descendants."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None:
            children.setdefault(stat[1], []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def alive(pids) -> list[int]:
    """Those of `pids` still running (zombies left out: nobody may reap them here)."""
    return sorted(pid for pid in pids if (stat := _stat(pid)) is not None and stat[0] != "Z")


def with_marker(marker: str) -> list[int]:
    """Live processes whose environment still carries `marker`."""
    found = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            if marker.encode() in (Path("/proc") / str(pid) / "environ").read_bytes():
                found.append(pid)
        except OSError:
            pass  # gone, or not ours to read
    return alive(found)


def leftovers(marker: str, known: set[int]) -> list[int]:
    """What is still running of the processes seen (`known`) or started with `marker`."""
    return sorted(set(alive(known)) | set(with_marker(marker)))
