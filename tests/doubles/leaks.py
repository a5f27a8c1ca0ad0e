"""Process-leak checks for the server tests: nothing a test started may outlive it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import psutil


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if alive(p.pid)}


def assert_gone(pids: Iterable[int], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    assert not left, f"processes left behind: {[(p, psutil.Process(p).cmdline()) for p in left if alive(p)]}"


def read_pids(path) -> list[int]:
    try:
        return [int(x) for x in open(path).read().split()]
    except FileNotFoundError:
        return []


def main(argv: list[str]) -> int:
    """`python tests/doubles/leaks.py TAG`: fail if any process other than this one lives with
    LLMPERF_LEAK_TAG=TAG in its environment. tox sets the tag for the pytest session, so every
    process it started (servers, their spawned workers) carries it; run this after the session."""
    tag = argv[0] if argv else os.environ.get("LLMPERF_LEAK_TAG", "")
    if not tag:
        print("usage: leaks.py TAG (or set LLMPERF_LEAK_TAG)")
        return 2
    me = os.getpid()
    left = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.info["pid"] in (me, os.getppid()) or not alive(proc.info["pid"]):
            continue
        try:
            if proc.environ().get("LLMPERF_LEAK_TAG") == tag:
                left.append((proc.info["pid"], " ".join(proc.info["cmdline"] or [])[:200]))
        except (psutil.Error, OSError):
            continue
    if left:
        print(f"processes left behind after the session: {left}")
        return 1
    print(f"no process with LLMPERF_LEAK_TAG={tag} left behind")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
