"""Shared by the server backends: an event loop on its own thread, and B concurrent streams per run.

The loop (and the async client living on it) persists for the backend's life, so connections are
reused across runs as a long-lived benchmark client's would be, and warmup runs open them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..measure.backend import BackendError, Clock
from ..measure.records import RunSample

if TYPE_CHECKING:
    from ..processes import ServerProcess

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

    def close(self, closing: Coroutine[Any, Any, Any] | None = None) -> None:
        """Stop the loop, after running `closing` on it (a client session's close; its errors ignored: the
        server may be gone already)."""
        if self.loop.is_closed():
            if closing is not None:
                closing.close()
            return
        if closing is not None:
            with contextlib.suppress(Exception):
                self.run(closing, timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


@dataclass
class Stream:
    """What one request of a run saw. Times are ns from the run's start: when this request was sent, and
    when each of its tokens (or chunks) arrived; metrics.py times the request from its own send."""

    sent_ns: int = 0
    times_ns: list[int] = field(default_factory=list)
    server_tokens: int | None = None  # generated tokens as the server counts them
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # the generated ids, where the server streams them
    text: str = ""  # the generated text
    prompt_tokens: int | None = None  # the prompt length the server reports having received


class EventStream:
    """Server-sent events (the WHATWG `text/event-stream` format) from bytes fed as they arrive.

    `feed(chunk)` returns the `data` of every event the chunk completes (several `data:` lines of one event
    joined by a newline; comments, `event:`, `id:` and events without data are dropped). Lines may end in
    CRLF (sse-starlette, llama.cpp's server), LF (vLLM, TGI) or CR. Kept small because it runs for every
    token: bytes throughout, one split per chunk.
    """

    def __init__(self) -> None:
        self._pending = b""  # an unfinished line
        self._data: list[bytes] = []  # the data lines of the event being read

    def feed(self, chunk: bytes) -> list[bytes]:
        lines = (self._pending + chunk).splitlines(keepends=True)  # bytes.splitlines: CRLF, LF, CR only
        # an unfinished last line waits, and so does one ending in CR: it may be the first half of a CRLF
        self._pending = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
        events = []
        for line in lines:
            line = line.rstrip(b"\r\n")
            if not line:  # a blank line ends the event
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                self._data.append(line[6:] if line[5:6] == b" " else line[5:])
        return events

    def close(self) -> list[bytes]:
        """What the stream's end completes: the last line even without its newline (the event itself is
        dropped, as the format says, unless a blank line ended it)."""
        events = self.feed(b"\n") if self._pending else []
        self._data = []
        return events


class RequestFailed(BackendError):
    """One request of a run failed while the server went on serving (a stream cut short, an error event)."""


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a run, as `timeit` turns it off: in a process that has loaded
    torch and vLLM a full collection takes ~170 ms here, and one that fell inside a run held the client off the
    socket while the server went on, so every token that came meanwhile got the collection's end as its time
    (tox -e vllm saw 15 of 16 tokens stamped at one instant). Its previous state comes back after the run."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


async def run_concurrently(
    batch_size: int, clock: Clock, one: Callable[[int, int], Awaitable[Stream]]
) -> tuple[list[Stream | Exception], int]:
    """Start `batch_size` requests at once; each gets its index and the run's start time.

    Returns, in request order, each request's stream or the exception it failed with, and the run's
    end-to-end time (start to the end of the last request). A request that fails does not stop the others:
    `completed` tells a run with some failed requests from one where the server answered none. The garbage
    collector is paused for the run (`collector_paused`).
    """
    with collector_paused():
        start = clock()
        tasks = [asyncio.ensure_future(one(i, start)) for i in range(batch_size)]
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
        except BaseException:  # cancelled (the run timed out): cancel every request
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        end = clock()
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # KeyboardInterrupt, SystemExit: never a failed request
    return list(results), end - start  # type: ignore[arg-type]


def completed(results: list[Stream | Exception]) -> tuple[list[Stream], list[tuple[int, Exception]]]:
    """The streams that completed and (index, exception) of the requests that failed. When none completed,
    the first failure is raised: the server is down or refused every request, which the backend names."""
    streams = [r for r in results if isinstance(r, Stream)]
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
    if not streams and failed:
        raise failed[0][1]
    return streams, failed


def run_batch(
    loop: LoopThread,
    clock: Clock,
    batch_size: int,
    one: Callable[[int, int], Awaitable[Stream]],
    *,
    timeout: float,
    where: str,
    process: ServerProcess | None,
) -> tuple[list[Stream], list[tuple[int, Exception]], int]:
    """Send one run's requests at once and wait for them: (the streams that completed, (index, exception) of the
    requests that failed, the run's time in ns). A run whose every request broke raises run_failed's error."""
    try:
        results, e2e = loop.run(run_concurrently(batch_size, clock, one), timeout=timeout)
        streams, failed = completed(results)
    except RequestFailed as exc:
        raise run_failed(exc, where, process, batch_size) from exc
    return streams, failed, e2e


def run_failed(exc: RequestFailed, where: str, process: ServerProcess | None, batch_size: int) -> BackendError:
    """The error for a run whose every request broke: the server died, or it cut them all."""
    if process is not None and process.exited_within(1.0):
        return BackendError(process.describe_failure(f"died during a run ({exc})"))
    return BackendError(f"{where}: every request failed at batch size {batch_size}: {exc}")


def check_survived(failed: list[tuple[int, Exception]], process: ServerProcess | None) -> None:
    """Requests that failed because the server died are no failed requests of a run that goes on: say it died."""
    if failed and process is not None and process.exited_within(1.0):
        raise BackendError(process.describe_failure(f"died during a run ({failure_text(*failed[0])})"))


def prompt_mismatch(streams: list[Stream], sequence_length: int) -> int | None:
    """A prompt length the server reports having received that is not the scenario's; None when all agree (or
    the server reports none)."""
    return next((s.prompt_tokens for s in streams if s.prompt_tokens not in (None, sequence_length)), None)


def failure_text(index: int, exc: Exception) -> str:
    """One line for a failed request of a run."""
    text = str(exc) if isinstance(exc, RequestFailed) else f"{type(exc).__name__}: {exc}"
    return f"request {index}: {text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__}"


def sample_from(
    batch_size: int,
    streams: list[Stream],
    end_to_end_ns: int,
    failed: list[tuple[int, Exception]] | None = None,
    counters: dict[str, float] | None = None,
    with_ids: bool = False,
) -> RunSample:
    """A run's sample from its completed streams (the failed requests are named, not timed)."""
    counts = [s.server_tokens for s in streams]
    known = all(c is not None for c in counts)
    generated = sum(c for c in counts if c is not None) if known else None
    ids = (
        [list(s.token_ids or []) for s in streams]
        if with_ids and all(s.token_ids is not None for s in streams)
        else None
    )
    return RunSample(
        batch_size=batch_size,
        token_times_ns=[s.times_ns for s in streams],
        end_to_end_ns=end_to_end_ns,
        generated_tokens=generated,
        counters=dict(counters or {}),
        sent_ns=[s.sent_ns for s in streams],
        sequence_tokens=[int(c) for c in counts] if known else None,  # type: ignore[arg-type]
        output_ids=ids,
        output_texts=[s.text for s in streams] if ids is not None else None,
        failed_requests=[failure_text(i, e) for i, e in failed or []],
    )


def outputs_note(what: str, deterministic: bool) -> str:
    """A server's `outputs` line in describe(): what it reports, and what a change does."""
    return what + (
        "; a change fails (deterministic=True)"
        if deterministic
        else "; a change only warns: pass deterministic=True to the fixture where greedy decoding on this "
        "server repeats itself"
    )


def unreachable(
    exc: BaseException, process: ServerProcess | None, where: str, source: str | None, address: str = "the URL"
) -> BackendError:
    """The error for a server that does not answer: the one we started died or hangs (with its log tail), or
    nothing answers at the address the user gave."""
    detail = exc.details() if hasattr(exc, "details") else str(exc)  # gRPC errors say it in details()
    if process is not None:
        state = "died" if process.exited_within(2.0) else "did not answer"
        return BackendError(process.describe_failure(f"{state} ({type(exc).__name__}: {detail})"))
    hint = f"check {address}, or unset it to let the fixture start a server" if source else "is the server running?"
    return BackendError(f"cannot reach the {where}: {type(exc).__name__}: {detail}; {hint}")
