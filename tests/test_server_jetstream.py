"""JetStream: the backend over the gRPC double (JetStream's own stubs), and the fixture."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("jetstream.core.proto.jetstream_pb2", reason="pip install --no-deps google-jetstream")

from pytest_llmperf.measure.backend import BackendError, GenerationRequest  # noqa: E402
from pytest_llmperf.backends.jetstream import JetStreamBackend  # noqa: E402
from pytest_llmperf.processes import free_port  # noqa: E402

from .doubles.leaks import assert_gone, descendants  # noqa: E402
from .server_helpers import JETSTREAM_DOUBLE, PYTHON, clean_env, run_inner  # noqa: E402


@pytest.fixture(autouse=True)
def no_leaks():
    before = descendants()
    yield
    assert_gone(descendants() - before)


def test_bad_address_is_a_clear_error():
    port = free_port()
    with pytest.raises(BackendError, match=rf"cannot reach the JetStream server at 127.0.0.1:{port} "
                                           r"\(from --llmperf-jetstream-url\).*host:port"):
        JetStreamBackend(f"127.0.0.1:{port}", source="--llmperf-jetstream-url")


TEST = f"""
import json, sys, pytest
from pytest_llmperf.measure.backend import BackendError, GenerationRequest

CMD = [sys.executable, {str(JETSTREAM_DOUBLE)!r}, "--host", "{{host}}", "--port", "{{port}}", "--config",
       json.dumps({{"batch_size": 2, "token_delay_ms": 4.0}})]
SEED = dict(model="double", device="cpu", dtype="float32", server_batch_size=2, cache_length=64,
            max_input_length=32, max_output_length=8)

def test_tokens(llmperf_jetstream):
    server = llmperf_jetstream(CMD, **SEED)
    server.generate(GenerationRequest(1, 8, 6, "a b c d e f g h"))
    sample = server.generate(GenerationRequest(4, 8, 6, "a b c d e f g h"))
    assert sample.generated_tokens == 24  # token_ids counted; the final empty message is not a token
    assert [len(t) for t in sample.token_times_ns] == [6] * 4
    # two slots: requests 3 and 4 wait for 1 and 2, so the last first-token comes after a whole sequence
    firsts = sorted(t[0] for t in sample.token_times_ns)
    assert firsts[2] >= 5 * 4_000_000
    d = server.describe()
    assert (d["cache_length"], d["server_batch_size"], d["dtype"]) == (64, 2, "float32")

def test_several_tokens_in_one_message_are_one_arrival(llmperf_jetstream):
    cmd = CMD[:-1] + [json.dumps({{"token_delay_ms": 4.0, "tokens_per_message": 2}})]
    sample = llmperf_jetstream(cmd, **SEED).generate(GenerationRequest(1, 8, 6, "a b c d e f g h"))
    assert sample.generated_tokens == 6  # counted from token_ids
    times = sample.token_times_ns[0]
    assert len(times) == 3  # three messages of two tokens: three arrivals, two gaps
    assert all(later > earlier for earlier, later in zip(times, times[1:]))  # no zero gaps

def test_early_stop(llmperf_jetstream):
    cmd = CMD[:-1] + [json.dumps({{"eos_after": 3}})]
    with pytest.raises(BackendError, match=r"returned 3 tokens, not decode_length=6.*no ignore_eos"):
        llmperf_jetstream(cmd, **SEED).generate(GenerationRequest(1, 8, 6, "a b c"))

def test_dies(llmperf_jetstream):
    cmd = CMD[:-1] + [json.dumps({{"exit_after_requests": 1}})]
    server = llmperf_jetstream(cmd, **SEED)
    server.generate(GenerationRequest(1, 8, 2, "a b c"))
    with pytest.raises(BackendError,
                       match=r"(?s)JetStream server at grpc://127.0.0.1:\\d+ (died|has exited).*exit_after_requests"):
        server.generate(GenerationRequest(1, 8, 2, "a b c"))

def test_long_prompt_is_cut_not_refused(llmperf_jetstream):
    # JetStream's own server keeps the last max_prefill_length tokens (a warning in its log), no gRPC error
    cmd = CMD[:-1] + [json.dumps({{"max_prefill_length": 4}})]
    server = llmperf_jetstream(cmd, **SEED)
    assert server.generate(GenerationRequest(2, 8, 6, "a b c d e f g h")).generated_tokens == 12
    assert "Provided sequence longer than available" in server.process.log_path.read_text()

def test_dies_mid_stream(llmperf_jetstream):
    # JetStream's server SIGKILLs itself when one of its threads raises, after some tokens were streamed
    cmd = CMD[:-1] + [json.dumps({{"exit_after_tokens": 3, "token_delay_ms": 20}})]
    server = llmperf_jetstream(cmd, **SEED)
    with pytest.raises(BackendError,
                       match=r"(?s)JetStream server at grpc://127.0.0.1:\\d+ (died|has exited).*exit_after_tokens=3"):
        server.generate(GenerationRequest(1, 8, 6, "a b c"))

def test_wont_start(llmperf_jetstream):
    with pytest.raises(BackendError,
                       match=r"(?s)exited before it became healthy \\(exit code 1\\).*failed to load checkpoint"):
        llmperf_jetstream([sys.executable, {str(JETSTREAM_DOUBLE)!r}, "--port", "{{port}}", "--fail"])
"""


def test_fixture_lifecycle(pytester, monkeypatch):
    clean_env(monkeypatch)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_js=TEST)
    run_inner(pytester, "-v").assert_outcomes(passed=7)


def test_fixture_attach(pytester, monkeypatch, tmp_path_factory):
    from pytest_llmperf.processes import ProcessRegistry

    from pytest_llmperf.backends.jetstream import health_check

    registry = ProcessRegistry(tmp_path_factory.mktemp("js"))
    port = free_port()
    proc = registry.start("JetStream", [PYTHON, str(JETSTREAM_DOUBLE), "--port", str(port)],
                          url=f"grpc://127.0.0.1:{port}")
    try:
        proc.wait_ready(lambda: health_check(f"127.0.0.1:{port}"), 30)
        clean_env(monkeypatch)
        pytester.makeini("[pytest]\n")
        pytester.makepyfile(test_a="""
from pytest_llmperf.measure.backend import GenerationRequest
def test_a(llmperf_jetstream, llmperf_servers):
    s = llmperf_jetstream(model="x")
    assert s.generate(GenerationRequest(2, 4, 3, "a b c d")).generated_tokens == 6
    assert llmperf_servers.processes == []
""")
        run_inner(pytester, f"--llmperf-jetstream-url=127.0.0.1:{port}").assert_outcomes(passed=1)
    finally:
        registry.stop_all()


def test_updating_a_jetstream_baseline_adds_a_row_to_the_dated_log(pytester, monkeypatch, tmp_path_factory):
    from pytest_llmperf.backends.jetstream import health_check
    from pytest_llmperf.processes import ProcessRegistry

    registry = ProcessRegistry(tmp_path_factory.mktemp("js-log"))
    port = free_port()
    proc = registry.start("JetStream", [PYTHON, str(JETSTREAM_DOUBLE), "--port", str(port)],
                          url=f"grpc://127.0.0.1:{port}")
    try:
        proc.wait_ready(lambda: health_check(f"127.0.0.1:{port}"), 30)
        clean_env(monkeypatch)
        pytester.makeini("[pytest]\n")
        pytester.makepyfile(test_js_log="""
import pytest
@pytest.mark.llmperf(batch_sizes=[1, 2], sequence_length=4, decode_length=3, runs=5, warmups=0)
def test_js(llmperf, llmperf_jetstream):
    llmperf.measure(llmperf_jetstream(model="llama-tiny"))
""")
        args = (f"--llmperf-jetstream-url=127.0.0.1:{port}", "--llmperf-max-load=1000")
        run_inner(pytester, *args, "--llmperf-update").assert_outcomes(passed=1)
        def rows() -> list[str]:
            log = (pytester.path / "reports" / "cpu-throughput-log.md").read_text()
            return [line for line in log.splitlines() if line[:4].isdigit() and line.count(" | ") == 7]

        assert [r.split(" | ")[3] for r in rows()] == ["1", "2"]  # one dated row per batch size
        # gating does not add rows, whatever it decides: the double answers in 2-5 ms, so a verdict against
        # a 5-run baseline is timing noise (once inconclusive in CI at ratio 1.15 [1.05, 1.27])
        run_inner(pytester, *args, "--llmperf-fail-on=none").assert_outcomes(passed=1)
        assert len(rows()) == 2
    finally:
        registry.stop_all()


PORT_TAKEN = f"""
import os, sys
def test_port(llmperf_jetstream):
    llmperf_jetstream([sys.executable, {str(JETSTREAM_DOUBLE)!r}, "--port", "{{port}}"], port=int(os.environ["TAKEN"]))
"""


def test_fixture_port_taken_names_the_holder(pytester, monkeypatch):
    import os
    import socket

    clean_env(monkeypatch)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_port=PORT_TAKEN)
    before = descendants()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv("TAKEN", str(port))
        result = run_inner(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*cannot start the JetStream server on 127.0.0.1:{port}: the port is taken by pid "
                                 f"{os.getpid()}*"])
    assert descendants() - before == set()  # nothing was started


def test_fixture_bad_url_option(pytester, monkeypatch):
    clean_env(monkeypatch)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_bad="def test_bad(llmperf_jetstream):\n    llmperf_jetstream(model='x')\n")
    before = descendants()
    port = free_port()
    result = run_inner(pytester, f"--llmperf-jetstream-url=127.0.0.1:{port}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*cannot reach the JetStream server at 127.0.0.1:{port} (from "
                                 "--llmperf-jetstream-url)*check the address (host:port)*"])
    result = run_inner(pytester, "--llmperf-jetstream-url=http://127.0.0.1:9000")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*JetStream: 'http://127.0.0.1:9000' (from --llmperf-jetstream-url) "
                                 "is not HOST:PORT*"])
    assert descendants() - before == set()


@pytest.mark.slow
def test_processes_started_while_a_grpc_stream_runs_start_clean(tmp_path_factory):
    """A child started while this process's gRPC channel streams must not inherit gRPC: a child forked with a
    preexec_fn ran gRPC's atfork handlers, restarted its pollers and then closed their descriptors before exec
    ('epoll_wait error: Bad file descriptor', an abort or a segfault; 89 of 300 spawns). The JetStream double
    that test_fixture_attach started died that way, on a busy machine."""
    import threading

    from pytest_llmperf.backends.jetstream import health_check
    from pytest_llmperf.processes import ProcessRegistry

    registry = ProcessRegistry(tmp_path_factory.mktemp("js-fork"))
    port = free_port()
    server = registry.start("JetStream", [PYTHON, str(JETSTREAM_DOUBLE), "--port", str(port), "--config",
                                          json.dumps({"token_delay_ms": 0.5})], url=f"grpc://127.0.0.1:{port}")
    backend = None
    stop = threading.Event()
    try:
        server.wait_ready(lambda: health_check(f"127.0.0.1:{port}"), 30)
        backend = JetStreamBackend(f"127.0.0.1:{port}")

        def stream() -> None:
            while not stop.is_set():
                backend.generate(GenerationRequest(2, 4, 8, "a b c d"))

        streaming = threading.Thread(target=stream, daemon=True)
        streaming.start()
        broken = []
        for i in range(60):
            child = registry.start("child", [PYTHON, "-S", "-c", "pass"], url="none", log_name=f"child{i}")
            code = child.popen.wait(timeout=30)
            output = child.log_path.read_text().splitlines()[1:]  # the first line is the command
            if code != 0 or output:
                broken.append((code, output[:2]))
            registry.stop(child)
        assert broken == []
    finally:
        stop.set()
        if backend is not None:
            streaming.join(timeout=30)
            backend.close()
        registry.stop_all()
