"""End to end against llama.cpp's server (llama-cpp-python[server] 0.3.36), started by llmperf_openai.

Run by `tox -e llamacpp` (its own venv; llama-cpp-python's sdist compiles llama.cpp, docs/servers.md);
not part of `tox -e test`. The model is scripts/tiny_gguf.py's tiny Llama, written here with seeded
random weights: nothing is downloaded.
"""

from __future__ import annotations

import re
import os
import signal
from pathlib import Path

import psutil
import pytest

from pytest_llmperf.measure.backend import BackendError, GenerationRequest
from pytest_llmperf.backends.models import make_prompt
from pytest_llmperf.measure.metrics import run_values

from .server_helpers import PYTHON, load_script

pytestmark = pytest.mark.slow  # each test starts a real server (through its fixture)

SEQ, DECODE = 16, 8
# llama-cpp-python streams no `usage`, so tokens are the content chunks, checked against decode_length;
# it has min_tokens but no ignore_eos: logit_bias -100 keeps the specials (unknown, BOS, EOS) out.
LLAMA = dict(name="llama.cpp", health_path="/v1/models", model="tiny-llama", fixed_length="logit_bias",
             eos_token_ids=[0, 1, 2], count_chunks=True)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    return load_script("tiny_gguf").write(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


def command(gguf: Path, *extra: str) -> list[str]:
    # interrupt_requests defaults to True: a new request cancels the one streaming (see the last test)
    return [PYTHON, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "tiny-llama",
            "--host", "{host}", "--port", "{port}", "--n_ctx", "512", "--n_threads", "1",
            "--interrupt_requests", "False", *extra]


def req(bs: int) -> GenerationRequest:
    return GenerationRequest(bs, SEQ, DECODE, make_prompt(SEQ))


@pytest.fixture(scope="module")
def llama(llmperf_openai, gguf):
    return llmperf_openai(command(gguf), **LLAMA)


def test_the_server_listens_on_loopback_only(llama):
    listening = [c.laddr for c in psutil.Process(llama.process.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening and {a.ip for a in listening} <= {"127.0.0.1"}, listening


def test_the_vocabulary_makes_a_prompt_word_one_token():
    pieces, scores = load_script("tiny_gguf").vocabulary(["seattle"])
    assert "\u2581seattle" in pieces and "\u2581s" in pieces and pieces[:3] == ["<unk>", "<s>", "</s>"]
    assert scores[pieces.index("\u2581seattle")] > scores[pieces.index("\u2581seattl")]  # longer merges first


def test_llamacpp_streams_the_fixed_length(llama, record_property):
    llama.generate(req(1))  # warmup
    for bs in (1, 2, 4):  # the server decodes one request at a time; the rest wait for its lock
        sample = llama.generate(req(bs))
        assert sample.generated_tokens == bs * DECODE  # content chunks, logit_bias kept the end tokens out
        assert [len(t) for t in sample.token_times_ns] == [DECODE] * bs  # one token per chunk
        assert all(t == sorted(t) for t in sample.token_times_ns)
        values = run_values(sample)
        assert values["ttft_ms"] > 0 and values["itl_ms"] > 0
        record_property(f"bs{bs}", {k: round(values[k], 2) for k in ("ttft_ms", "itl_ms", "e2e_ms")})
    d = llama.describe()
    assert d["server"] == "llama.cpp" and d["token_count"].startswith("chunk count")


# A test of the backend, not of the machine: max_load=inf, so a busy neighbour cannot get its baseline refused.
@pytest.mark.llmperf(batch_sizes=[1, 2], sequence_length=SEQ, decode_length=DECODE, runs=5, warmups=1,
                     max_load=float("inf"))
def test_llmperf_measures_llamacpp(llmperf, llama):
    result = llmperf.measure(llama)
    assert [b.batch_size for b in result.batches] == [1, 2] and all(b.ok for b in result.batches)
    for batch in result.batches:
        assert all(s.generated_tokens == batch.batch_size * DECODE for s in batch.samples)
    assert llmperf.session.outcomes[-1].status in ("created", "updated", "compared")


def test_llamacpp_dying_mid_run_is_reported(llama):
    os.kill(llama.process.pid, signal.SIGKILL)
    with pytest.raises(BackendError, match=r"llama.cpp server at http://127.0.0.1:\d+ (died|has exited)"):
        llama.generate(req(2))


def test_concurrent_streams_cut_by_the_servers_default_are_failed_requests_and_named(llmperf_openai, gguf):
    # llama-cpp-python's server defaults to --interrupt_requests True: a request arriving while another
    # streams ends that stream early, with no finish_reason and no error
    server = llmperf_openai([a for a in command(gguf) if a not in ("--interrupt_requests", "False")], **LLAMA)
    server.generate(req(1))
    # 96 tokens: request 0 still streams when request 1 arrives (8 can be done first on a quiet machine)
    sample = server.generate(GenerationRequest(2, SEQ, 96, make_prompt(SEQ)))
    assert len(sample.failed_requests) == 1 and len(sample.token_times_ns) == 1, sample.failed_requests
    assert re.fullmatch(r"request 0: the stream ended after \d+ of 96 tokens with no finish_reason: the server cut "
                        r"it short .*--interrupt_requests False\)", sample.failed_requests[0]), sample.failed_requests

