"""Process-leak checks for the server tests: nothing a test started may outlive it."""

from __future__ import annotations

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
