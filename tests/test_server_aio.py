"""The server backends' event-loop thread: a run that times out is cancelled on the loop."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from pytest_llmperf.backends._aio import LoopThread


def test_timeout_cancels_the_coroutine_and_raises():
    loop = LoopThread("test")
    cancelled = asyncio.Event()
    try:
        async def forever() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        # Python 3.10 raises concurrent.futures.TimeoutError, 3.11+ the builtin (the same class there)
        with pytest.raises((TimeoutError, concurrent.futures.TimeoutError)):
            loop.run(forever(), timeout=0.05)

        async def wait_cancelled() -> bool:
            await asyncio.wait_for(cancelled.wait(), timeout=10)
            return True

        assert loop.run(wait_cancelled(), timeout=15)
    finally:
        loop.close()


def test_a_run_pauses_the_garbage_collector_and_gives_its_state_back():
    import gc

    from pytest_llmperf.backends._aio import Stream, run_concurrently
    from pytest_llmperf.measure.backend import FakeClock

    seen = []

    async def one(index: int, start: int) -> Stream:
        seen.append(gc.isenabled())
        await asyncio.sleep(0)
        seen.append(gc.isenabled())
        return Stream()

    loop = LoopThread("test")
    was = gc.isenabled()
    try:
        gc.enable()
        results, e2e = loop.run(run_concurrently(2, FakeClock(step=5), one), timeout=10)
        assert seen == [False] * 4 and gc.isenabled()  # off for the requests, back on after
        assert len(results) == 2 and e2e == 5  # the injected clock: start at 5, end at 10
        gc.disable()  # a caller that had turned it off keeps it off
        loop.run(run_concurrently(1, FakeClock(), one), timeout=10)
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
        loop.close()
