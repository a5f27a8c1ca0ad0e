"""How busy the machine was while we measured: the CPU time of every process but ours, in cores.

A timing taken while another process compiles can move 30x on a shared machine; no tolerance
separates that from a regression. So the runner records, per batch size, the average number of
cores other processes kept busy (system busy time from /proc/stat via psutil, minus the CPU time of
this process and its children, such as a server a fixture started), and the gate refuses to judge a
comparison where either side was measured on a busy machine.

`LoadMeter.reading()` also counts the other threads of this process (a neighbour thread is invisible to
`stop()`, which is about other processes): the offload engine's start-up microbenchmark runs on one thread
and is disturbed by a busy thread beside it as much as by another process.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import psutil


def _own_cpu_seconds(process: psutil.Process) -> float:
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            total += sum(child.cpu_times()[:2])
    return total


def _system_busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


@dataclass(frozen=True)
class LoadReading:
    """Average busy cores during a measurement: other processes, and other threads of this process."""

    foreign_cores: float
    sibling_cores: float  # this process and its children, minus the thread that took the reading
    wall_s: float

    @property
    def busy_cores(self) -> float:
        return self.foreign_cores + self.sibling_cores


@dataclass
class LoadMeter:
    """Start before a measurement, `stop()` after: returns the foreign load in cores."""

    _wall: float = 0.0
    _system: float = 0.0
    _own: float = 0.0

    def __post_init__(self) -> None:
        self._process = psutil.Process()
        self._wall = time.monotonic()
        self._system = _system_busy_seconds()
        self._own = _own_cpu_seconds(self._process)
        self._thread = time.thread_time()

    def stop(self) -> float:
        return self.reading().foreign_cores

    def reading(self) -> LoadReading:
        """Foreign load and the load of this process's other threads, in cores (call on the starting thread)."""
        wall = time.monotonic() - self._wall
        if wall <= 0:
            return LoadReading(0.0, 0.0, 0.0)
        own = _own_cpu_seconds(self._process) - self._own
        foreign = (_system_busy_seconds() - self._system) - own
        siblings = own - (time.thread_time() - self._thread)
        return LoadReading(max(foreign, 0.0) / wall, max(siblings, 0.0) / wall, wall)
