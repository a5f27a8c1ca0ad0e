"""Shared by the server backends: an event loop on its own thread, and B concurrent streams per run.

The loop (and the async client living on it) persists for the backend's life, so connections are
reused across runs as a long-lived benchmark client's would be, and warmup runs open them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..measure.clock import Clock
from ..measure.records import RunSample

T = TypeVar("T")


class LoopThread:
    """An asyncio loop running on a daemon thread; `run(coro)` blocks until the coroutine ends."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"llmperf-{name}-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        # Python 3.10's concurrent.futures.TimeoutError is not the builtin TimeoutError (3.11 made
        # it an alias); catch both so the coroutine is cancelled on every supported version.
        except (TimeoutError, concurrent.futures.TimeoutError):
            future.cancel()
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


@dataclass
class Stream:
    """What one request of a run saw: token arrival times (ns from the run's start) and the count
    of generated tokens the server reported."""

    times_ns: list[int] = field(default_factory=list)
    server_tokens: int | None = None
    finish_reason: str | None = None
    end_ns: int = 0


async def run_concurrently(batch_size: int, clock: Clock,
                           one: Callable[[int, int], Awaitable[Stream]]) -> tuple[list[Stream], int]:
    """Start `batch_size` requests at once; each gets its index and the run's start time.

    Returns the streams in request order and the run's end-to-end time (start to the end of
    the last request). The first failure cancels the others and is raised.
    """
    start = clock()
    tasks = [asyncio.ensure_future(one(i, start)) for i in range(batch_size)]
    try:
        streams = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    end = clock()
    return list(streams), end - start


def sample_from(batch_size: int, streams: list[Stream], end_to_end_ns: int,
                counters: dict[str, float] | None = None) -> RunSample:
    counts = [s.server_tokens for s in streams]
    generated = sum(c for c in counts if c is not None) if all(c is not None for c in counts) else None
    return RunSample(batch_size=batch_size, token_times_ns=[s.times_ns for s in streams], end_to_end_ns=end_to_end_ns,
                     generated_tokens=generated, counters=dict(counters or {}))
