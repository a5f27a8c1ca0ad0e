"""The OpenAI-compatible client's reading and timing, without a server: the event-stream reader on the ways
servers frame their events, and where a request's send and its tokens are stamped (an injected clock, a
scripted response)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from pytest_llmperf.backends._aio import EventStream, LoopThread
from pytest_llmperf.measure.backend import BackendError, GenerationRequest
from pytest_llmperf.backends.openai_compat import OpenAICompatBackend


def read_all(chunks: list[bytes]) -> list[bytes]:
    events = EventStream()
    out = [e for c in chunks for e in events.feed(c)]
    return out + events.close()


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_events_on_every_line_ending(newline):
    text = newline.join([b"data: one", b"", b": a comment", b"event: x", b"data: two", b"data:three", b"", b""])
    assert read_all([text]) == [b"one", b"two\nthree"]  # comments and event names dropped, data lines joined


def test_events_split_anywhere_across_reads():
    text = b"data: {\"a\": 1}\r\n\r\ndata: [DONE]\r\n\r\n"
    for cut in range(1, len(text)):  # also between a CR and its LF: no extra blank line, no lost event
        assert read_all([text[:cut], text[cut:]]) == [b'{"a": 1}', b"[DONE]"], cut


def test_an_event_the_stream_does_not_end_is_dropped():
    assert read_all([b"data: one\n\ndata: cut"]) == [b"one"]


# -- where the times are taken -----------------------------------------------------------------------

class Clock:
    """An injected clock the scripted response moves; each reading gives `now`, then moves it on by 1 ns, so
    that readings taken one after the other differ."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += 1
        return self.now - 1


def chunk(i: int, *, last: bool = False) -> bytes:
    choice = {"index": 0, "text": f" t{i}", "finish_reason": "length" if last else None, "token_ids": [100 + i]}
    return b"data: " + json.dumps({"choices": [choice], "usage": None}).encode() + b"\n\n"


USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}\n\ndata: [DONE]\n\n'


class ScriptedResponse:
    """What aiohttp's response gives the backend: a status and reads, each arriving at a time of the script."""

    def __init__(self, clock: Clock, reads: list[tuple[int, bytes]], status: int = 200) -> None:
        self.status, self.reason, self._clock, self._reads = status, "Bad Request", clock, reads
        self.content = self

    async def iter_any(self) -> AsyncIterator[bytes]:
        for at, data in self._reads:
            await asyncio.sleep(0)  # a read waits for its bytes: the run's other requests go on meanwhile
            self._clock.now = at  # the bytes are there at `at`
            yield data

    async def text(self) -> str:
        return '{"error": "bad"}'

    async def __aenter__(self) -> ScriptedResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class ScriptedSession:
    """Stands in for the backend's aiohttp session: each post answers with the next script."""

    def __init__(self, clock: Clock, make: Callable[[], ScriptedResponse]) -> None:
        self.clock, self.make, self.posted_at, self.bodies = clock, make, [], []

    def post(self, url: str, *, data: bytes, headers: dict[str, str]) -> ScriptedResponse:
        self.posted_at.append(self.clock.now)
        self.bodies.append(json.loads(data))
        self.clock.now += 1_000  # posting takes time: it must not be counted before the stamp
        return self.make()

    async def close(self) -> None:
        return None


def scripted_backend(monkeypatch, clock: Clock, make: Callable[[], ScriptedResponse]) -> OpenAICompatBackend:
    monkeypatch.setattr(OpenAICompatBackend, "_served_model", lambda self: "m")
    backend = OpenAICompatBackend("http://127.0.0.1:9", fixed_length="ignore_eos", token_ids=True, clock=clock)
    backend._loop.run(backend._session.close())  # the real one, made on the backend's loop
    backend._session = ScriptedSession(clock, make)  # type: ignore[assignment]
    return backend


def test_the_send_is_stamped_before_the_post_and_each_token_as_its_event_is_decoded(monkeypatch):
    clock = Clock()
    reads = [(5_000_000, chunk(0)), (9_000_000, chunk(1) + chunk(2, last=True)), (9_500_000, USAGE)]
    clock.now = 2_000_000
    backend = scripted_backend(monkeypatch, clock, lambda: ScriptedResponse(clock, reads))
    try:
        sample = backend.generate(GenerationRequest(1, 4, 3, "a b c d"))
    finally:
        backend.close()
    assert sample.sent_ns == [1]  # the run starts at 2 ms and its request is stamped next, before the post
    assert backend._session.posted_at == [2_000_002]  # type: ignore[attr-defined]
    # times from the run's start: each token when its event is decoded, right after its read; tokens 1 and 2
    # came in one read and get their own times, in order, not the read's one time (a zero gap)
    first, second, third = sample.token_times_ns[0]
    assert 3_000_000 <= first < 3_000_010 and 7_000_000 <= second < third < 7_000_010
    assert sample.output_ids == [[100, 101, 102]] and sample.sequence_tokens == [3]
    body = backend._session.bodies[0]  # type: ignore[attr-defined]
    assert body["prompt"] == "a b c d" and body["ignore_eos"] is True and body["return_token_ids"] is True


def test_requests_of_a_run_send_one_body_encoded_once(monkeypatch):
    clock = Clock()
    reads = [(1_000_000, chunk(0)), (2_000_000, chunk(1)), (3_000_000, chunk(2, last=True) + USAGE)]
    backend = scripted_backend(monkeypatch, clock, lambda: ScriptedResponse(clock, reads))
    encoded: list[bytes] = []
    body = backend._body
    monkeypatch.setattr(backend, "_body", lambda request: encoded.append(body(request)) or encoded[-1])
    try:
        sample = backend.generate(GenerationRequest(4, 4, 3, "a b c d"))
    finally:
        backend.close()
    assert len(encoded) == 1 and len(backend._session.bodies) == 4  # type: ignore[attr-defined]
    assert sample.sent_ns == [1, 1_002, 2_003, 3_004]  # each request stamped after the previous one's post


def test_an_error_status_names_the_status_and_the_answer(monkeypatch):
    clock = Clock()
    backend = scripted_backend(monkeypatch, clock, lambda: ScriptedResponse(clock, [], status=400))
    try:
        with pytest.raises(BackendError, match=r'request failed at batch size 1 \(HTTP 400\): Bad Request: '
                                               r'\{"error": "bad"\}'):
            backend.generate(GenerationRequest(1, 4, 3, "a b c d"))
    finally:
        backend.close()


def test_an_error_event_from_vllm_names_its_code(monkeypatch):
    clock = Clock()
    error = b'data: {"error": {"object": "error", "message": "boom", "type": "InternalServerError", "code": 500}}\n\n'
    backend = scripted_backend(monkeypatch, clock, lambda: ScriptedResponse(clock, [(1, chunk(0) + error)]))
    try:
        with pytest.raises(BackendError, match=r"request failed at batch size 1 \(HTTP 500, sent in the stream\): "
                                               r"boom$"):
            backend.generate(GenerationRequest(1, 4, 3, "a b c d"))
    finally:
        backend.close()


def test_the_loop_thread_is_left_closed_by_close(monkeypatch):
    backend = scripted_backend(monkeypatch, Clock(), lambda: ScriptedResponse(Clock(), []))
    loop: LoopThread = backend._loop
    backend.close()
    backend.close()  # twice is fine
    assert loop.loop.is_closed()


def test_the_backend_without_aiohttp_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_aiohttp(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "aiohttp":
            raise ImportError("No module named 'aiohttp'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_aiohttp)
    with pytest.raises(BackendError, match=r"needs aiohttp: pip install pytest-llmperf\[openai\] \(No module named"):
        OpenAICompatBackend("http://127.0.0.1:9", model="m")
