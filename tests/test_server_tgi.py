"""TGI: the double's fidelity to TGI's API, the backend's measurements, the fixture's lifecycle."""

from __future__ import annotations

import json
import statistics
import re

import httpx
import pytest

from pytest_llmperf.measure.backend import BackendError, GenerationRequest
from pytest_llmperf.backends.tgi import TGIBackend
from pytest_llmperf.backends.tgi import TGILauncherArgs, seed_launcher_args
from pytest_llmperf.measure.metrics import run_values
from pytest_llmperf.backends.models import make_prompt
from pytest_llmperf.processes import free_port
from pytest_llmperf.processes import ProcessRegistry

from .doubles.leaks import assert_gone, descendants, read_pids
from .server_helpers import LAUNCHER, clean_env, run_inner


@pytest.fixture(autouse=True)
def no_leaks():
    before = descendants()
    yield
    assert_gone(descendants() - before)


@pytest.fixture(scope="module")
def tgi(tmp_path_factory):
    """A stand-in TGI (launcher + double) for the module, with a known cost model (its log under pytest's
    temporary directory, which pytest cleans, not left in /tmp)."""
    registry = ProcessRegistry(tmp_path_factory.mktemp("tgi"))
    port = free_port()
    config = {"token_delay_ms": 5.0, "batch_factor": 0.0, "prefill_ms_per_token": 0.5}
    proc = registry.start("TGI", TGILauncherArgs(model_id="double/m").argv(str(LAUNCHER), host="127.0.0.1", port=port),
                          url=f"http://127.0.0.1:{port}", env={"LLMPERF_TGI_DOUBLE_CONFIG": json.dumps(config)})
    proc.wait_ready(lambda: httpx.get(f"{proc.url}/health").status_code == 200, 30)
    yield proc
    registry.stop_all()


def configure(url, **settings):
    httpx.post(f"{url}/_double/config", json=settings).raise_for_status()


# -- fidelity: raw HTTP against the double, checked against TGI's router (lib.rs, server.rs) ------

@pytest.mark.slow
def test_stream_events_have_tgis_shape(tgi):
    body = {"inputs": "a b c d", "parameters": {"max_new_tokens": 3, "details": True}}
    with httpx.stream("POST", f"{tgi.url}/generate_stream", json=body) as response:
        assert response.headers["content-type"] == "text/event-stream"
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data:{") for line in lines)  # axum: `data:` then JSON, no space
    events = [json.loads(line[5:]) for line in lines]
    assert [e["index"] for e in events] == [1, 2, 3]
    assert set(events[0]) == {"index", "token", "generated_text", "details"}
    assert set(events[0]["token"]) == {"id", "text", "logprob", "special"}
    assert events[0]["details"] is None and events[0]["generated_text"] is None
    last = events[-1]
    assert last["generated_text"] == "".join(e["token"]["text"] for e in events)
    assert last["details"] == {"finish_reason": "length", "generated_tokens": 3, "seed": None, "input_length": 4}


@pytest.mark.slow
def test_compat_route_info_health_and_validation(tgi):
    out = httpx.post(tgi.url, json={"inputs": "a b", "parameters": {"max_new_tokens": 2, "details": True}}).json()
    assert isinstance(out, list) and out[0]["details"]["generated_tokens"] == 2  # `/` wraps in a list
    single = httpx.post(f"{tgi.url}/generate", json={"inputs": "a b", "parameters": {"max_new_tokens": 2}}).json()
    assert set(single) == {"generated_text"}  # details only when asked
    info = httpx.get(f"{tgi.url}/info").json()
    assert info["model_id"] == "double/m" and info["router"] == "text-generation-router"
    assert {"max_input_tokens", "max_total_tokens", "max_concurrent_requests", "version"} <= set(info)
    assert httpx.get(f"{tgi.url}/health").status_code == 200
    bad = httpx.post(f"{tgi.url}/generate", json={"inputs": "a " * 1000, "parameters": {"max_new_tokens": 600}})
    assert bad.status_code == 422
    assert bad.json() == {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1512. "
                                   "Given: 1000 `inputs` tokens and 600 `max_new_tokens`", "error_type": "validation"}


TRUNCATE_ERROR = {"error": "Input validation error: `truncate` must be strictly positive and less than 1000. "
                           "Given: 1024", "error_type": "validation"}


def sse_events(url, body):
    with httpx.stream("POST", url, json=body) as response:
        assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
        return [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]


@pytest.mark.slow
def test_validation_error_is_a_422_on_generate_and_an_event_on_generate_stream(tgi):
    # router/src/server.rs: /generate answers (422, {"error", "error_type"}); /generate_stream validates
    # inside the event stream, so the status is 200 and the event carries the error
    body = {"inputs": "a " * 1100, "parameters": {"max_new_tokens": 8, "truncate": 1024, "details": True}}
    bad = httpx.post(f"{tgi.url}/generate", json=body)
    assert bad.status_code == 422 and bad.json() == TRUNCATE_ERROR
    assert sse_events(f"{tgi.url}/generate_stream", body) == [TRUNCATE_ERROR]
    assert sse_events(tgi.url, {**body, "stream": True}) == [TRUNCATE_ERROR]  # `/` with stream is generate_stream
    zero = httpx.post(f"{tgi.url}/generate", json={**body, "parameters": {"max_new_tokens": 2, "truncate": 0}})
    assert zero.status_code == 422 and "Given: 0" in zero.json()["error"]


@pytest.mark.slow
def test_truncate_keeps_the_last_tokens_and_counts_against_the_limits(tgi):
    body = {"inputs": "a " * 1100, "parameters": {"max_new_tokens": 2, "truncate": 1000, "details": True}}
    assert sse_events(f"{tgi.url}/generate_stream", body)[-1]["details"]["input_length"] == 1000
    over = {**body, "parameters": {"max_new_tokens": 600, "truncate": 1000}}
    assert sse_events(f"{tgi.url}/generate_stream", over) == [
        {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1512. Given: 1000 `inputs` "
                  "tokens and 600 `max_new_tokens`", "error_type": "validation"}]


@pytest.mark.slow
def test_overloaded_is_a_429_on_generate_and_an_event_on_generate_stream(tgi):
    configure(tgi.url, max_concurrent_requests=0)
    try:
        body = {"inputs": "a b", "parameters": {"max_new_tokens": 2}}
        busy = httpx.post(f"{tgi.url}/generate", json=body)
        assert busy.status_code == 429 and busy.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
        assert sse_events(f"{tgi.url}/generate_stream", body) == [{"error": "Model is overloaded",
                                                                   "error_type": "overloaded"}]
    finally:
        configure(tgi.url, max_concurrent_requests=128)


@pytest.mark.slow
def test_huggingface_hub_raises_its_validation_error_from_the_stream_event(tgi, monkeypatch):
    from huggingface_hub import InferenceClient, constants
    from huggingface_hub.errors import ValidationError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(model=tgi.url)  # kept: a collected client closes its streams
    with pytest.raises(ValidationError, match="`truncate` must be strictly positive and less than 1000"):
        list(client.text_generation("a b c", stream=True, details=True, max_new_tokens=2, truncate=1024))


@pytest.mark.slow
def test_huggingface_hub_client_parses_the_double(tgi, monkeypatch):
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # tox sets HF_HUB_OFFLINE=1; this is loopback

    client = InferenceClient(model=tgi.url)
    events = list(client.text_generation("a b c", stream=True, details=True, max_new_tokens=4))
    assert len(events) == 4 and events[-1].details.generated_tokens == 4
    assert events[-1].details.finish_reason == "length"
    out = client.text_generation("a b c", details=True, max_new_tokens=2)
    assert out.details.generated_tokens == 2


# -- the backend ----------------------------------------------------------------------------------

def request(bs, decode=8):
    return GenerationRequest(batch_size=bs, sequence_length=16, decode_length=decode, prompt=make_prompt(16))


@pytest.mark.slow
def test_backend_times_every_token_and_counts_from_details(tgi):
    backend = TGIBackend(tgi.url)
    try:
        backend.generate(request(1))  # warmup: opens the connection
        sample = backend.generate(request(3))
        assert sample.batch_size == 3 and len(sample.token_times_ns) == 3
        assert all(len(times) == 8 for times in sample.token_times_ns)
        assert sample.generated_tokens == 24 and sample.prefill_ns is None and sample.decode_steps_ns == []
        for times in sample.token_times_ns:
            assert times == sorted(times)
            assert times[-1] >= 7 * 5_000_000  # the double sleeps 5 ms before each later token
        assert sample.end_to_end_ns >= max(t[-1] for t in sample.token_times_ns)
        assert backend.last_finish_reasons == ["length"] * 3
        assert backend.describe()["model"] == "double/m"
    finally:
        backend.close()
        backend.close()


@pytest.mark.slow
def test_each_request_is_sent_on_its_own_and_reports_its_ids_and_the_prompt_kept(tgi):
    backend = TGIBackend(tgi.url)
    try:
        sample = backend.generate(request(2))
        assert len(sample.sent_ns) == 2 and all(0 <= s < t[0] for s, t in zip(sample.sent_ns, sample.token_times_ns))
        assert [len(ids) for ids in sample.output_ids] == [8, 8] and sample.output_ids[0] == sample.output_ids[1]
        assert sample.output_texts[0] == "".join(f" {w}" for w in sample.output_texts[0].split())
        assert backend.describe()["deterministic_outputs"] is False
        with pytest.raises(BackendError, match=r"the server kept 4 prompt tokens \(details.input_length\), the "
                                               r"scenario asks for sequence_length=16: truncate=sequence_length "
                                               r"keeps the prompt's last tokens but cannot lengthen it"):
            backend.generate(GenerationRequest(1, 16, 8, "a b c d"))
    finally:
        backend.close()


@pytest.mark.slow
def test_a_stream_the_server_drops_is_a_failed_request(tgi):
    configure(tgi.url, drop_after=3, drop_every=2)
    backend = TGIBackend(tgi.url)
    try:
        sample = backend.generate(request(2))
        assert len(sample.token_times_ns) == 1 and sample.generated_tokens == 8
        assert len(sample.failed_requests) == 1 and "the stream broke after 3 of 8 tokens" in sample.failed_requests[0]
    finally:
        configure(tgi.url, drop_after=None)
        backend.close()


@pytest.mark.slow
def test_backend_sees_a_slowdown_in_itl_not_ttft(tgi):
    backend = TGIBackend(tgi.url)
    try:
        backend.generate(request(1))
        base = [run_values(backend.generate(request(1))) for _ in range(3)]
        configure(tgi.url, token_delay_ms=50.0)
        slow = [run_values(backend.generate(request(1))) for _ in range(3)]
    finally:
        configure(tgi.url, token_delay_ms=5.0)
        backend.close()
    # 10x the delay, judged at 2x on medians: a busy machine stretched the 5 ms steps to ~8 ms, never to 25
    median = statistics.median
    assert median(s["itl_ms"] for s in slow) > 2 * median(b["itl_ms"] for b in base)
    assert median(s["throughput_tokens_per_s"] for s in slow) < median(b["throughput_tokens_per_s"] for b in base)


@pytest.mark.slow
def test_early_eos_fails_the_run_unless_allowed(tgi):
    configure(tgi.url, eos_after=3)
    strict, lax = TGIBackend(tgi.url), TGIBackend(tgi.url, require_full_length=False)
    try:
        with pytest.raises(BackendError, match=r"generated 4 tokens \(finish_reason=eos_token\), not decode_length=8"
                                               r".*cannot ignore the end-of-sequence token"):
            strict.generate(request(2))
        sample = lax.generate(request(2))
        assert sample.generated_tokens == 8  # 3 words + the EOS token, per sequence, as TGI counts them
    finally:
        configure(tgi.url, eos_after=None)
        strict.close()
        lax.close()


@pytest.mark.slow
def test_server_error_event_is_a_backend_error_and_oom_is_out_of_memory(tgi):
    from pytest_llmperf.measure.backend import OutOfMemory

    configure(tgi.url, error_after=2)
    backend = TGIBackend(tgi.url)
    try:
        with pytest.raises(OutOfMemory, match="out of memory at batch size 2"):
            backend.generate(request(2))
    finally:
        configure(tgi.url, error_after=None)
        backend.close()


def stats(url):
    return httpx.get(f"{url}/_double/stats").json()


@pytest.mark.slow
@pytest.mark.parametrize(("sequence", "decode", "batch", "expected"), [
    (1024, 8, 1, r"truncate=sequence_length=1024 exceeds the server's max_input_tokens=1000 \(GET /info\).*"
                 r"Start TGI with --max-input-tokens 1024 or more"),
    (900, 700, 1, r"sequence_length \+ decode_length = 1600 exceeds the server's max_total_tokens=1512 .*"
                  r"--max-total-tokens 1600 or more"),
    (16, 8, 129, r"batch size 129 \(concurrent requests\) exceeds the server's max_concurrent_requests=128 .*"
                 r"--max-concurrent-requests 129 or more"),
])
def test_a_request_beyond_the_servers_limits_names_the_launcher_argument(tgi, sequence, decode, batch, expected):
    backend = TGIBackend(tgi.url)
    try:
        before = stats(tgi.url)["requests"]
        with pytest.raises(BackendError, match=expected):
            backend.generate(GenerationRequest(batch, sequence, decode, make_prompt(sequence)))
        assert stats(tgi.url)["requests"] == before  # refused before sending B requests TGI would reject
    finally:
        backend.close()


def test_transport_errors_are_told_from_server_answers():
    import httpx2
    from huggingface_hub.errors import InferenceTimeoutError, OverloadedError, ValidationError

    from pytest_llmperf.backends.tgi import is_transport_error

    # AsyncInferenceClient raises httpx2's errors, whose text need not say "connect"
    assert is_transport_error(httpx2.ReadError("boom"))
    assert is_transport_error(httpx2.RemoteProtocolError("incomplete chunked read"))
    assert is_transport_error(httpx2.ConnectError("refused"))
    assert is_transport_error(ConnectionResetError())
    assert not is_transport_error(ValidationError("Input validation error: connect"))  # TGI answered
    assert not is_transport_error(OverloadedError("Model is overloaded"))
    assert not is_transport_error(InferenceTimeoutError("Inference call timed out"))  # slow, not unreachable


def test_bad_url_is_a_clear_error():
    port = free_port()
    with pytest.raises(BackendError, match=rf"cannot reach the TGI server at http://127.0.0.1:{port} "
                                           r"\(from --llmperf-tgi-url\).*unset it"):
        TGIBackend(f"http://127.0.0.1:{port}", source="--llmperf-tgi-url")


def test_not_a_tgi_server():
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Other(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "11")
            self.end_headers()
            self.wfile.write(b'{"hello":1}')

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(BackendError, match="no model_id.*Is this a text-generation-inference server"):
            TGIBackend(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()


# -- launcher arguments -------------------------------------------------------------------------

@pytest.mark.parametrize(("sequence", "decode", "max_input", "max_total"), [
    (1024, 8, 1024, 1512),  # seed 000: the seed's 1000 would reject truncate=1024 at the router
    (100, 8, 1000, 1512),  # seed 001's short sequences: the seed's own limits
    (2048, 16, 2048, 2064),
])
def test_seed_launcher_limits_admit_the_scenario(sequence, decode, max_input, max_total):
    args = seed_launcher_args("m", sequence_length=sequence, decode_length=decode)
    assert (args.max_input_tokens, args.max_total_tokens) == (max_input, max_total)
    assert args.max_input_tokens < args.max_total_tokens <= args.max_batch_total_tokens  # the launcher's own rules


@pytest.mark.slow
def test_seed_launcher_args_serve_the_seed_scenario_through_the_router(tmp_path):
    """Seed 000's scenario (sequence 1024, decode 8) on the stand-in launcher with seed_launcher_args."""
    registry = ProcessRegistry(tmp_path)
    port = free_port()
    args = seed_launcher_args("double/m", sequence_length=1024, decode_length=8)
    proc = registry.start("TGI", args.argv(str(LAUNCHER), host="127.0.0.1", port=port), url=f"http://127.0.0.1:{port}",
                          env={"LLMPERF_TGI_DOUBLE_CONFIG": json.dumps({"token_delay_ms": 1.0})})
    backend = None
    try:
        proc.wait_ready(lambda: httpx.get(f"{proc.url}/health").status_code == 200, 30)
        backend = TGIBackend(proc.url, launcher_args=args, process=proc)
        assert backend.generate(GenerationRequest(2, 1024, 8, make_prompt(1024))).generated_tokens == 16
    finally:
        if backend is not None:
            backend.close()
        registry.stop_all()


@pytest.mark.slow
def test_stand_in_launcher_checks_the_limits_as_the_launcher_does(tmp_path):
    registry = ProcessRegistry(tmp_path)
    port = free_port()
    argv = TGILauncherArgs("double/m", max_input_tokens=1024, max_total_tokens=1000).argv(str(LAUNCHER),
                                                                                           host="127.0.0.1", port=port)
    proc = registry.start("TGI", argv, url=f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(BackendError, match=r"(?s)exited before it became healthy \(exit code 1\).*"
                                               r"`max_input_tokens`\(1024\) must be < `max_total_tokens`\(1000\)"):
            proc.wait_ready(lambda: httpx.get(f"{proc.url}/health").status_code == 200, 30)
    finally:
        registry.stop_all()


def test_launcher_argv_has_the_seed_arguments_and_per_server_ports():
    args = seed_launcher_args("bigscience/bloomz-7b1-mt", num_shard=2, quantize="bitsandbytes")
    argv = args.argv("tgl", host="127.0.0.1", port=8080, prometheus_port=9001, shard_uds_path="/tmp/x",
                     master_port=29501)
    text = " ".join(argv)
    assert text.startswith("tgl --model-id bigscience/bloomz-7b1-mt --hostname 127.0.0.1 --port 8080 "
                           "--prometheus-port 9001 --shard-uds-path /tmp/x --master-port 29501")
    for part in ("--num-shard 2", "--quantize bitsandbytes", "--max-input-tokens 1024", "--max-total-tokens 1512",
                 "--max-batch-total-tokens 32000", "--max-concurrent-requests 128", "--max-waiting-tokens 20"):
        assert part in text
    assert "--revision" not in text and "--trust-remote-code" not in text
    assert TGILauncherArgs("m", sharded=False, trust_remote_code=True, extra_args=("--x",)).argv(
        "l", host="h", port=1)[-4:] == ["--sharded", "false", "--trust-remote-code", "--x"]
    with pytest.raises(BackendError, match="--quantize 'int3' is not one of"):
        TGILauncherArgs("m", quantize="int3")


# -- the fixture, through pytest ------------------------------------------------------------------

FIXTURE_TEST = """
import os, pytest
from pytest_llmperf.measure.backend import GenerationRequest

def req(bs):
    return GenerationRequest(bs, 8, 4, "a b c d e f g h i j")

def test_start(llmperf_tgi):
    server = llmperf_tgi(model_id="double/m", num_shard=2, max_total_tokens=512)
    assert llmperf_tgi(model_id="double/m", num_shard=2, max_total_tokens=512) is server  # reused
    assert server.generate(req(2)).generated_tokens == 8
    assert server.describe()["launcher_args"]["num_shard"] == 2
    assert server.describe()["variant"] == "num_shard=2 quantize=none"  # the sweep grid's column label
    open(os.environ["PIDS_OUT"], "a").write(str(server.process.pid) + "\\n")
    if os.environ.get("FAIL_TEST"):
        assert False, "the test failed on purpose"
"""


@pytest.fixture
def project(pytester, monkeypatch, tmp_path):
    clean_env(monkeypatch)
    monkeypatch.setenv("PATH", f"{LAUNCHER.parent}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("LLMPERF_TGI_DOUBLE_PID_FILE", str(tmp_path / "pids"))
    monkeypatch.setenv("PIDS_OUT", str(tmp_path / "server-pids"))
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_fixture=FIXTURE_TEST)
    return pytester


def test_fixture_starts_reuses_and_stops_everything(project, tmp_path):
    run_inner(project).assert_outcomes(passed=1)
    args = read_pids(tmp_path / "pids")
    assert len(args) == 3  # one launcher, two shards: started once, reused
    assert_gone(args, within_s=2)


def test_fixture_stops_the_server_when_the_test_fails(project, tmp_path, monkeypatch):
    monkeypatch.setenv("FAIL_TEST", "1")
    run_inner(project).assert_outcomes(failed=1)
    assert_gone(read_pids(tmp_path / "pids"), within_s=2)


def test_fixture_launcher_missing_names_the_option(project):
    result = run_inner(project, "-o", "llmperf_tgi_launcher=/nonexistent/tgl")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*'/nonexistent/tgl' not found (llmperf_tgi_launcher)*--llmperf-tgi-url=URL*"])


def test_fixture_server_that_exits_early_shows_the_log_tail(project, monkeypatch):
    monkeypatch.setenv("LLMPERF_TGI_DOUBLE_MODE", "exit")
    result = run_inner(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*TGI server at http://127.0.0.1:* exited before it became healthy (exit code 1)*",
                                 "*last lines of the log:*", "*Shard 0 failed to start*"])


def test_fixture_server_dying_mid_run_is_reported_with_its_log(project, monkeypatch, tmp_path):
    monkeypatch.setenv("LLMPERF_TGI_DOUBLE_MODE", "exit-after:1")
    result = run_inner(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*TGI server at http://127.0.0.1:* died*",
                                 "*router: exiting after * requests (exit_after_requests)*"])
    assert_gone(read_pids(tmp_path / "pids"), within_s=2)


def test_fixture_port_taken_names_the_holder(project, pytester):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        pytester.makepyfile(test_port=f"""
def test_port(llmperf_tgi):
    llmperf_tgi(model_id="double/m", port={port})
""")
        result = run_inner(pytester, "test_port.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*cannot start the TGI server on 127.0.0.1:{port}: the port is taken by pid*"])


def test_fixture_attaches_by_url_and_checks_the_model(project, tgi, pytester):
    pytester.makepyfile(test_attach="""
import pytest
from pytest_llmperf.measure.backend import BackendError

def test_attach(llmperf_tgi, llmperf_servers):
    server = llmperf_tgi(model_id="double/m")
    assert server.process is None and server.describe()["attached"]
    assert server.generate(__import__("pytest_llmperf.measure.backend").measure.backend.GenerationRequest(
        1, 4, 2, "a b c d e")).generated_tokens == 2
    assert llmperf_servers.processes == []  # nothing started
    lax = llmperf_tgi(model_id="double/m", require_full_length=False)
    assert lax is not server and not lax.require_full_length and server.require_full_length
    assert llmperf_tgi(model_id="double/m") is server
    with pytest.raises(BackendError, match="serves 'double/m', this test asks for 'other'"):
        llmperf_tgi(model_id="other")
""")
    run_inner(pytester, "test_attach.py", f"--llmperf-tgi-url={tgi.url}").assert_outcomes(passed=1)


def test_fixture_bad_url_option(project, pytester):
    pytester.makepyfile(test_bad="def test_bad(llmperf_tgi):\n    llmperf_tgi()\n")
    result = run_inner(pytester, "test_bad.py", "--llmperf-tgi-url=ftp://x")
    assert "llmperf: bad value for --llmperf-tgi-url: expected an http:// or https:// URL" in result.stderr.str()
    port = free_port()
    result = run_inner(pytester, "test_bad.py", f"--llmperf-tgi-url=http://127.0.0.1:{port}")
    result.stdout.fnmatch_lines([f"*cannot reach the TGI server at http://127.0.0.1:{port} (from --llmperf-tgi-url)*"])


def test_interrupted_session_stops_the_server(project, tmp_path, pytester):
    pytester.makepyfile(test_interrupt="""
import os, signal, time
def test_interrupt(llmperf_tgi):
    llmperf_tgi(model_id="double/m", num_shard=2)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
""")
    result = run_inner(pytester, "test_interrupt.py", subprocess=True)
    assert "KeyboardInterrupt" in result.stdout.str() or "Interrupted" in result.stdout.str()
    pids = read_pids(tmp_path / "pids")
    assert len(pids) == 3
    assert_gone(pids, within_s=5)


GATED_TEST = """
import pytest

@pytest.mark.llmperf(batch_sizes=[1, 2], sequence_length=16, decode_length=8, runs=8, warmups=1, max_runs=16)
def test_tgi_gate(llmperf, llmperf_tgi):
    llmperf.measure(llmperf_tgi(model_id="double/m"))
"""


@pytest.mark.serial  # times a server's tokens and asserts the verdict: alone, after the parallel tests
def test_the_gate_catches_a_slower_tgi_and_the_report_has_the_server_tables(pytester, monkeypatch, tmp_path):
    clean_env(monkeypatch)
    monkeypatch.setenv("PATH", f"{LAUNCHER.parent}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("LLMPERF_TGI_DOUBLE_CONFIG", json.dumps({"token_delay_ms": 4.0, "batch_factor": 0.0}))
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_gated=GATED_TEST)
    # The machine is shared: without a high --llmperf-max-load a busy neighbour gets the runs refused
    # (as in test_plugin); the 3x slower tokens below stand far above that noise.
    busy_ok = "--llmperf-max-load=1000"
    run_inner(pytester, "--llmperf-update", busy_ok).assert_outcomes(passed=1)
    report = (pytester.path / "reports" / "cpu.md").read_text()
    assert re.search(r"\| Time to first token +\| 1 ", report) and re.search(r"\| Time per output token +\| 1 ", report)
    assert "| Token count" in report and "server details.generated_tokens" in report
    monkeypatch.setenv("LLMPERF_TGI_DOUBLE_CONFIG", json.dumps({"token_delay_ms": 12.0, "batch_factor": 0.0}))
    result = run_inner(pytester, busy_ok)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*itl_ms*"])
    assert "regress" in result.stdout.str().lower()


@pytest.mark.slow
def test_hf_hub_offline_mode_does_not_block_a_tgi_server(tgi, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert constants.is_offline_mode()
    backend = TGIBackend(tgi.url)
    try:
        assert backend.generate(request(1)).generated_tokens == 8
    finally:
        backend.close()
