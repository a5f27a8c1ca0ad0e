"""Server metrics as vLLM's `bench serve` defines them, each request timed from its own send, with an
injected clock: TTFT, ITL, TPOT and E2EL per request and their reduction per run (metrics.py); the
concurrent requests of a run (backends/_aio.py), one of which may fail while the others are timed."""

from __future__ import annotations

import asyncio

import pytest

from pytest_llmperf.backends._aio import (LoopThread, RequestFailed, Stream, completed, run_concurrently,
                                          sample_from)
from pytest_llmperf.measure.backend import FakeClock
from pytest_llmperf.measure.metrics import requests_of, run_values
from pytest_llmperf.measure.records import RunSample

MS = 1_000_000


def staggered() -> RunSample:
    # batch 4 as a client sends it: request i leaves at 2*i ms; 3 tokens each, usage says 3
    sent = [0, 2 * MS, 4 * MS, 6 * MS]
    times = [[s + 40 * MS, s + 50 * MS, s + 60 * MS] for s in sent]
    times[3] = [6 * MS + 100 * MS, 6 * MS + 102 * MS, 6 * MS + 150 * MS]  # queued behind the others' prefill
    return RunSample(4, times, end_to_end_ns=156 * MS, generated_tokens=12, sent_ns=sent, sequence_tokens=[3] * 4)


def test_each_request_is_timed_from_its_own_send_and_the_run_takes_the_median_over_requests():
    values = run_values(staggered())
    # TTFT per request from its own send: 40, 40, 40, 100 ms -> median 40 (from the run's start: 40, 42, 44, 106)
    assert values["ttft_ms"] == pytest.approx(40.0)
    # E2EL: last token - own send: 60, 60, 60, 150 -> median 60
    assert values["e2e_ms"] == pytest.approx(60.0)
    # TPOT: (last - first) / (tokens - 1): 10, 10, 10, 25 -> median 10
    assert values["tpot_ms"] == pytest.approx(10.0)
    # ITL: every gap of every request, pooled: 10 x6, 2, 48 -> median 10 (the mean, 12.5, carries the stall)
    assert values["itl_ms"] == pytest.approx(10.0)
    # the batch-level view of seed 000 stays: Decode (total) = mean of last - first, throughput over the run
    assert values["first_to_last_token_ms"] == pytest.approx((20 * 3 + 50) / 4)
    assert values["throughput_tokens_per_s"] == pytest.approx(12 / 0.156)


def test_tpot_takes_the_servers_count_per_request_not_its_chunks():
    sample = RunSample(1, [[10 * MS, 20 * MS, 40 * MS]], 40 * MS, generated_tokens=5, sequence_tokens=[5])
    # 3 chunks carried 5 tokens: TPOT = 30 ms / 4, while ITL stays per chunk (10 and 20 -> 15)
    assert run_values(sample)["tpot_ms"] == pytest.approx(7.5)
    assert run_values(sample)["itl_ms"] == pytest.approx(15.0)


def test_in_process_runs_send_every_sequence_at_the_start():
    sample = RunSample(2, [[5 * MS, 7 * MS, 9 * MS]] * 2, 9 * MS, prefill_ns=4 * MS, decode_steps_ns=[2 * MS] * 2,
                       generated_tokens=6)
    assert [r.sent for r in requests_of(sample)] == [0, 0] and [r.tokens for r in requests_of(sample)] == [3, 3]
    values = run_values(sample)
    assert values["ttft_ms"] == 5.0 and values["e2e_ms"] == 9.0 and values["tpot_ms"] == 2.0


def test_concurrent_requests_record_their_send_and_a_failure_does_not_stop_the_others():
    loop = LoopThread("test")
    clock = FakeClock(step=MS)  # every reading advances 1 ms

    async def one(index: int, start: int) -> Stream:
        stream = Stream(sent_ns=clock() - start)
        await asyncio.sleep(0)
        if index == 1:
            raise RequestFailed("the stream broke after 2 of 3 tokens: RemoteProtocolError: peer closed")
        stream.times_ns = [clock() - start for _ in range(3)]
        stream.server_tokens, stream.token_ids, stream.text = 3, [7, 8, 9], " a b c"
        return stream

    try:
        results, e2e = loop.run(run_concurrently(3, clock, one), timeout=10)
    finally:
        loop.close()
    streams, failed = completed(results)
    assert [s.sent_ns for s in streams] == [1 * MS, 3 * MS]  # requests 0 and 2, each stamped before it went out
    assert [i for i, _ in failed] == [1]
    sample = sample_from(3, streams, e2e, failed, with_ids=True)
    assert sample.sent_ns == [MS, 3 * MS] and sample.sequence_tokens == [3, 3] and sample.generated_tokens == 6
    assert sample.output_ids == [[7, 8, 9], [7, 8, 9]] and sample.output_texts == [" a b c", " a b c"]
    assert sample.failed_requests == ["request 1: the stream broke after 2 of 3 tokens: RemoteProtocolError: peer "
                                      "closed"]


def test_a_run_whose_every_request_failed_raises_the_first_failure():
    with pytest.raises(RequestFailed, match="first"):
        completed([RequestFailed("first"), ValueError("second")])
    assert completed([]) == ([], [])


@pytest.mark.parametrize(("api", "content", "finish", "token"), [
    ("completions", " word", None, True),
    ("completions", "", None, True),  # a special token decodes to no text: vLLM's bench counts the chunk
    ("completions", " word", "length", True),  # vLLM sends the last token with the finish reason
    ("completions", "", "stop", False),  # llama.cpp closes a stream with an empty chunk: no token
    ("completions", None, None, False),
    ("chat", "", None, False),  # the role-only first chunk
    ("chat", " word", None, True),
])
def test_which_chunks_are_tokens(api, content, finish, token):
    from pytest_llmperf.backends.openai_compat import is_token

    assert is_token(api, content, finish) is token
