"""Through the plugin, against the TGI double's OpenAI routes started by `llmperf_openai`: a request whose
stream the server drops is a failed request (counted, named, failing the test, never stored), and a server's
generated tokens are compared with the baseline's, failing only where the user says the server is
deterministic."""

from __future__ import annotations

import json

import pytest

from .doubles.leaks import assert_gone, descendants
from .server_helpers import TGI_DOUBLE, clean_env

BENCHMARK = f"""
import json, os, sys
import pytest

DOUBLE = [sys.executable, {str(TGI_DOUBLE)!r}, "--hostname", "{{host}}", "--port", "{{port}}",
          "--config", os.environ.get("DOUBLE_CONFIG", "{{}}")]

@pytest.mark.llmperf(batch_sizes=[2], sequence_length=8, decode_length=4, runs=5, warmups=1, max_runs=5)
def test_server(llmperf, llmperf_openai):
    deterministic = os.environ.get("DETERMINISTIC") == "1"
    llmperf.measure(llmperf_openai(DOUBLE, fixed_length="ignore_eos", truncate_prompt=True, token_ids=True,
                                   deterministic=deterministic))
"""


@pytest.fixture
def project(pytester, monkeypatch):
    clean_env(monkeypatch)
    monkeypatch.delenv("DOUBLE_CONFIG", raising=False)
    monkeypatch.delenv("DETERMINISTIC", raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_bench=BENCHMARK)
    before = descendants()
    yield pytester
    assert_gone(descendants() - before, within_s=5)  # the server is stopped, also after a failure


@pytest.fixture
def run(run):
    # timings and memory are not what this is about (in-process pytester runs grow the measuring process); alpha
    # 0.05: 5 runs against a baseline of 5 can show a regression of one of 3 rows at 0.05 / 3, not at 0.01 / 3
    return run.with_flags("-p", "pytest_llmperf.servers.fixtures", "-W", "ignore::pytest.PytestAssertRewriteWarning",
                          "--llmperf-rtol=10", "-o", "llmperf_memory_rtol=10", "--llmperf-alpha=0.05")


def test_a_dropped_stream_is_a_failed_request_that_fails_the_test_and_is_never_stored(project, run, monkeypatch):
    # every second request's connection is closed after 2 of its 4 tokens: one request of every run of batch 2
    monkeypatch.setenv("DOUBLE_CONFIG", json.dumps({"drop_after": 2, "drop_every": 2}))
    result = run("--llmperf-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*batch size 2: 5 of 10 requests failed, not timed (first: request ?: the stream broke after 2 of 4 tokens: *",
        "run quality: test_server: batch size 2: 5 of 10 requests failed*"])
    assert not list(project.path.rglob("baselines/**/*.json"))  # a broken measurement is not the new normal
    report = (project.path / "reports" / "cpu.md").read_text()
    assert "- run quality: batch size 2: 5 of 10 requests failed" in report
    monkeypatch.delenv("DOUBLE_CONFIG")
    run("--llmperf-update").assert_outcomes(passed=1)  # a server that completes every request


def test_changed_server_outputs_warn_unless_the_server_is_declared_deterministic(project, run, monkeypatch):
    run("--llmperf-update").assert_outcomes(passed=1)
    baseline = next(project.path.rglob("baselines/**/test_bench.json")).read_text()
    assert '"outputs": "sha256:' in baseline  # the digest of the server's token ids (return_token_ids), per batch size
    run().assert_outcomes(passed=1)
    monkeypatch.setenv("DOUBLE_CONFIG", json.dumps({"output_salt": "changed"}))  # same prompt, other tokens
    warned = run()
    warned.assert_outcomes(passed=1)
    warned.stdout.fnmatch_lines(["*outputs changed from the baseline (its digest *); sequence 0 now reads *"
                                 "(not failing: the server is not declared deterministic; pass deterministic=True*"])
    monkeypatch.setenv("DETERMINISTIC", "1")
    failed = run()
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*test_server: batch size 2: outputs changed from the baseline (its digest "
                                 "sha256:*, now sha256:*); sequence 0 now reads '*'"])
