"""OpenAI-compatible backend against the double's /v1 routes (TGI's Messages API shape), and the
llmperf_openai fixture. The real-vLLM tests are in test_vllm_e2e.py (tox -e vllm)."""

from __future__ import annotations

import json
import os
import socket

import httpx
import pytest

from pytest_llmperf.measure.backend import BackendError, GenerationRequest
from pytest_llmperf.backends.openai_compat import OpenAICompatBackend
from pytest_llmperf.backends.models import make_prompt
from pytest_llmperf.processes import free_port
from pytest_llmperf.processes import ProcessRegistry

from .doubles.leaks import assert_gone, descendants
from .server_helpers import PYTHON, TGI_DOUBLE, clean_env, run_inner

pytestmark = pytest.mark.slow  # every test here starts a server double


@pytest.fixture(autouse=True)
def no_leaks():
    before = descendants()
    yield
    assert_gone(descendants() - before)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    registry = ProcessRegistry(tmp_path_factory.mktemp("openai-logs"))
    port = free_port()
    config = {"model_id": "double/chat", "token_delay_ms": 4.0, "batch_factor": 0.0}
    proc = registry.start("double", [PYTHON, str(TGI_DOUBLE), "--port", str(port), "--config", json.dumps(config)],
                          url=f"http://127.0.0.1:{port}")
    proc.wait_ready(lambda: httpx.get(f"{proc.url}/health").status_code == 200, 30)
    yield proc
    registry.stop_all()


def req(bs, decode=6):
    return GenerationRequest(bs, 16, decode, make_prompt(16))


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_tokens_times_and_usage_counts(server, api):
    backend = OpenAICompatBackend(server.url, api=api, fixed_length="none", truncate_prompt=True, token_ids=True)
    try:
        assert backend.model == "double/chat"  # from /v1/models
        backend.generate(req(1))
        sample = backend.generate(req(2))
        assert backend.last_prompt_tokens == [16, 16]  # this run's two requests, cut to sequence_length
        assert sample.generated_tokens == 12 and sample.sequence_tokens == [6, 6]  # usage.completion_tokens
        assert [len(t) for t in sample.token_times_ns] == [6, 6]  # role-only and usage chunks are not tokens
        assert all(t[-1] - sent >= 5 * 4_000_000 for t, sent in zip(sample.token_times_ns, sample.sent_ns))
        assert all(0 <= sent < t[0] for t, sent in zip(sample.token_times_ns, sample.sent_ns))
        assert [len(ids) for ids in sample.output_ids] == [6, 6] and all(t >= 100 for t in sample.output_ids[0])
        assert sample.output_texts[0].startswith(" ") and sample.failed_requests == []
        assert backend.describe()["token_count"] == "server usage.completion_tokens"
    finally:
        backend.close()


def test_the_prompt_the_server_received_is_checked_against_the_scenario(server):
    backend = OpenAICompatBackend(server.url, fixed_length="none")  # the prompt as is: 32 words for 16
    try:
        with pytest.raises(BackendError, match=r"the server received 32 prompt tokens \(usage.prompt_tokens\), the "
                                               r"scenario asks for sequence_length=16; pass truncate_prompt=True"):
            backend.generate(req(1))
    finally:
        backend.close()
    unchecked = OpenAICompatBackend(server.url, fixed_length="none", check_prompt_length=False)
    try:
        assert unchecked.generate(req(1)).generated_tokens == 6
        assert unchecked.describe()["input_length"] == "prompt sent as is, unchecked"
    finally:
        unchecked.close()


def test_a_stream_the_server_drops_is_a_failed_request_and_the_others_are_measured(server):
    # every second request's connection is closed after 2 tokens: one of the two requests of each run
    httpx.post(f"{server.url}/_double/config", json={"drop_after": 2, "drop_every": 2}).raise_for_status()
    backend = OpenAICompatBackend(server.url, fixed_length="none", truncate_prompt=True)
    try:
        sample = backend.generate(req(2))
        assert len(sample.token_times_ns) == 1 and sample.generated_tokens == 6  # the completed request, timed
        assert len(sample.failed_requests) == 1
        assert sample.failed_requests[0].startswith(("request 0: ", "request 1: "))
        assert "the stream broke after 2 of 6 tokens" in sample.failed_requests[0]
        sample = backend.generate(req(1))  # the third request (odd): completes
        assert not sample.failed_requests
        with pytest.raises(BackendError, match=r"every request failed at batch size 1: the stream broke after 2 of 6 "
                                               r"tokens"):  # the fourth, alone: nothing completed, the run fails
            backend.generate(req(1))
    finally:
        httpx.post(f"{server.url}/_double/config", json={"drop_after": None})
        backend.close()


def test_fixed_length_modes(server):
    httpx.post(f"{server.url}/_double/config", json={"eos_after": 2}).raise_for_status()
    backends = {mode: OpenAICompatBackend(server.url, fixed_length=mode, eos_token_ids=[2], truncate_prompt=True)
                for mode in ("ignore_eos", "logit_bias", "none")}
    try:
        assert backends["ignore_eos"].generate(req(2)).generated_tokens == 12
        assert backends["logit_bias"].generate(req(2)).generated_tokens == 12
        with pytest.raises(BackendError, match=r"generated 3 tokens \(finish_reason=stop\), not decode_length=6; "
                                               r"the sequence stopped early"):
            backends["none"].generate(req(2))
        assert "logit_bias -100 on tokens [2]" in backends["logit_bias"].describe()["output_length"]
    finally:
        httpx.post(f"{server.url}/_double/config", json={"eos_after": None})
        for b in backends.values():
            b.close()


def test_server_that_ignores_ignore_eos_is_caught(server):
    # TGI's Messages API has no ignore_eos: asking for it does not make the run pass silently
    httpx.post(f"{server.url}/_double/config", json={"eos_after": 2}).raise_for_status()
    backend = OpenAICompatBackend(server.url, fixed_length="ignore_eos", extra_body={"ignore_eos": False},
                                  truncate_prompt=True)
    try:
        with pytest.raises(BackendError, match="the server ignored ignore_eos/min_tokens"):
            backend.generate(req(1))
    finally:
        httpx.post(f"{server.url}/_double/config", json={"eos_after": None})
        backend.close()


def test_errors_name_the_server_and_the_fix(server):
    with pytest.raises(BackendError, match="logit_bias' needs eos_token_ids"):
        OpenAICompatBackend(server.url, fixed_length="logit_bias")
    port = free_port()
    with pytest.raises(BackendError, match=rf"cannot reach the vLLM server at http://127.0.0.1:{port} "
                                           r"\(from --llmperf-openai-url\)"):
        OpenAICompatBackend(f"http://127.0.0.1:{port}", server_name="vLLM", source="--llmperf-openai-url")
    backend = OpenAICompatBackend(server.url)
    try:
        # TGI's /v1 routes validate inside the stream: 200, then an error event naming the status
        with pytest.raises(BackendError, match=r"request failed at batch size 1 \(HTTP 422, sent in the stream\): "
                                               r"Input validation error: .*must be <= 1512"):
            backend.generate(GenerationRequest(1, 4, 1600, "a b c d"))
    finally:
        backend.close()


FIXTURE_TEST = f"""
import sys
from pytest_llmperf.measure.backend import GenerationRequest

def test_start(llmperf_openai):
    cmd = [sys.executable, {str(TGI_DOUBLE)!r}, "--hostname", "{{host}}", "--port", "{{port}}"]
    server = llmperf_openai(cmd, name="TGI-messages", fixed_length="none", api="chat")
    assert llmperf_openai(cmd, name="TGI-messages", fixed_length="none", api="chat") is server
    assert server.generate(GenerationRequest(2, 4, 3, "a b c d")).generated_tokens == 6
    assert server.describe()["server"] == "TGI-messages"
"""


def test_fixture_starts_from_a_command_and_attaches_by_url(pytester, monkeypatch, server):
    clean_env(monkeypatch)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_cmd=FIXTURE_TEST, test_attach="""
def test_attach(llmperf_openai, llmperf_servers):
    backend = llmperf_openai(fixed_length="none")
    assert backend.process is None and llmperf_servers.processes == []
""", test_none="""
def test_none(llmperf_openai):
    llmperf_openai()
""")
    run_inner(pytester, "test_cmd.py").assert_outcomes(passed=1)
    run_inner(pytester, "test_attach.py", f"--llmperf-openai-url={server.url}").assert_outcomes(passed=1)
    result = run_inner(pytester, "test_none.py")
    result.stdout.fnmatch_lines(["*llmperf_openai needs a command*--llmperf-openai-url=URL*"])


def test_vllm_fixture_without_vllm_says_which_option(pytester, monkeypatch, tmp_path):
    clean_env(monkeypatch)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_v="def test_v(llmperf_vllm):\n    llmperf_vllm('tiny-llama')\n")
    fake = tmp_path / "python-without-vllm"
    fake.write_text(f"#!/bin/sh\nexec {PYTHON} -S \"$@\"\n")
    fake.chmod(0o755)
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    result = run_inner(pytester, "-o", f"llmperf_vllm_python={fake}", f"--llmperf-model=tiny-llama={model_dir}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*vLLM is not installed for * (llmperf_vllm_python)*"])


# -- llmperf_openai failure paths: each a clear error, and no process left behind ------------------

FAILING = f"""
import json, sys, pytest
from pytest_llmperf.measure.backend import BackendError, GenerationRequest

DOUBLE = [sys.executable, {str(TGI_DOUBLE)!r}, "--hostname", "{{host}}", "--port", "{{port}}"]

def test_wont_start(llmperf_openai):
    cmd = [sys.executable, "-c", "import sys; sys.exit('loading the model failed: no such file /models/x')"]
    llmperf_openai(cmd, name="SGLang", timeout_s=30)

def test_dies_mid_run(llmperf_openai):
    server = llmperf_openai(DOUBLE + ["--config", json.dumps({{"exit_after_requests": 1}})], fixed_length="none")
    server.generate(GenerationRequest(1, 4, 2, "a b c d"))
    server.generate(GenerationRequest(1, 4, 2, "a b c d"))

def test_port_taken(llmperf_openai):
    import os
    llmperf_openai(DOUBLE, port=int(os.environ["TAKEN_PORT"]), fixed_length="none")

def test_attach(llmperf_openai):
    llmperf_openai(fixed_length="none")
"""


@pytest.fixture
def failing(pytester, monkeypatch):
    clean_env(monkeypatch)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_failing=FAILING)
    before = descendants()
    yield pytester
    assert_gone(descendants() - before, within_s=5)  # the server and its children are stopped


def test_openai_server_that_wont_start(failing):
    result = run_inner(failing, "-k", "wont_start")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*SGLang server at http://127.0.0.1:* exited before it became healthy (exit code 1)*",
                                 "*last lines of the log:*", "*loading the model failed: no such file /models/x*"])


def test_openai_server_dying_mid_run(failing):
    result = run_inner(failing, "-k", "dies_mid_run")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*OpenAI-compatible server at http://127.0.0.1:* died*",
                                 "*router: exiting after 1 requests (exit_after_requests)*"])


def test_openai_port_taken(failing, monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv("TAKEN_PORT", str(port))
        result = run_inner(failing, "-k", "port_taken")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*cannot start the OpenAI-compatible server on 127.0.0.1:{port}: the port is taken "
                                 f"by pid {os.getpid()}*leave port= unset*"])


def test_openai_bad_url(failing):
    port = free_port()
    result = run_inner(failing, "-k", "attach", f"--llmperf-openai-url=http://127.0.0.1:{port}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*cannot reach the OpenAI-compatible server at http://127.0.0.1:{port} "
                                 "(from --llmperf-openai-url)*unset it*"])
    result = run_inner(failing, "-k", "attach", "--llmperf-openai-url=ftp://x")
    assert "bad value for --llmperf-openai-url: expected an http:// or https:// URL" in result.stderr.str()
