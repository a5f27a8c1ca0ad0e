"""Clocks. Timing code takes a clock so that unit tests can inject one and never read real time.

A clock is a zero-argument callable returning integer nanoseconds. On CUDA, work is asynchronous:
`synchronized_clock` waits for the device before each reading so that a timestamp means the work
launched before it has finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

Clock = Callable[[], int]

perf_counter_clock: Clock = time.perf_counter_ns


def synchronized_clock(synchronize: Callable[[], None], clock: Clock = perf_counter_clock) -> Clock:
    """A clock that calls `synchronize()` (e.g. `torch.cuda.synchronize`) before reading `clock`."""

    def read() -> int:
        synchronize()
        return clock()

    return read


class FakeClock:
    """A clock for tests: each reading returns the next scripted value, or advances by `step`."""

    def __init__(self, ticks: Iterable[int] | None = None, step: int = 1_000_000) -> None:
        self._ticks: Iterator[int] | None = iter(ticks) if ticks is not None else None
        self.now = 0
        self.step = step

    def __call__(self) -> int:
        if self._ticks is not None:
            self.now = next(self._ticks)
        else:
            self.now += self.step
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns
