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
