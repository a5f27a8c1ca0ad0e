"""End to end against JetStream's own server (google-jetstream 0.2.2 and its mock engine), started by llmperf_jetstream.

Run by `tox -e jetstream` (jax 0.4.38 and JetStream's server code in a venv of its own); not part of
`tox -e test`, whose venv has only JetStream's gRPC stubs: there the fixture's server exits at import.
The server is scripts/jetstream_mock_server.py: JetStream's `server_lib.run` with its mock engine,
bound to 127.0.0.1 and with the engine's per-step fake work shrunk (docs/servers.md).

The mock engine's vocabulary is chr()/ord(): each prompt character is a token and prefill keeps the
last 32 (BOS included); each generated id is ~1.5x the one before, so a text prompt's stream breaks
(the server kills itself) after ~20 tokens. Decode lengths here stay at 8.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import psutil
import pytest

from pytest_llmperf.measure.backend import BackendError, GenerationRequest
from pytest_llmperf.backends.jetstream import health_check, stubs
from pytest_llmperf.backends.models import make_prompt
from pytest_llmperf.measure.metrics import run_values
from pytest_llmperf.processes import free_port
from pytest_llmperf.processes import ProcessRegistry

from .server_helpers import JETSTREAM_DOUBLE, PYTHON, SCRIPTS, clean_env, load_script

pytestmark = pytest.mark.slow  # each test starts a real server (through its fixture)

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = SCRIPTS / "jetstream_mock_server.py"
SEQ, DECODE = 8, 8
# seed 002's columns for the mock: config_lib's test engine has 8 slots and a 32-token cache/prefill
MOCK = dict(model="jetstream-mock", device="cpu", dtype="float32", server_batch_size=8, cache_length=32,
            max_input_length=32, max_output_length=DECODE)


def command(*extra: str) -> list[str]:
    return [PYTHON, str(LAUNCHER), "--port", "{port}", *extra]


def req(bs: int, decode: int = DECODE, prompt: str | None = None) -> GenerationRequest:
    return GenerationRequest(bs, SEQ, decode, prompt if prompt is not None else make_prompt(SEQ))


@pytest.fixture(scope="module")
def mock(llmperf_jetstream):
    return llmperf_jetstream(command(), **MOCK)


def test_the_server_listens_on_loopback_only(mock):
    listening = [c.laddr for c in psutil.Process(mock.process.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening, "the server process listens on nothing"
    assert {a.ip for a in listening} <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening  # not JetStream's [::]


def test_the_launcher_shrinks_the_fake_work_and_refuses_code_without_the_literal():
    launcher = load_script("jetstream_mock_server")
    launcher.stand_in_seqio()
    from jetstream.engine import mock_engine

    class Engine:  # copies of the engine's jitted functions, so this process's TestEngine stays as shipped
        pass

    for name in ("prefill", "generate"):
        wrapped = getattr(mock_engine.TestEngine, name).__wrapped__
        setattr(Engine, name,
                types.SimpleNamespace(__wrapped__=types.FunctionType(wrapped.__code__, wrapped.__globals__)))
    assert launcher.shrink_fake_work(Engine, 16) == ["prefill", "generate"]
    for name in ("prefill", "generate"):
        consts = getattr(Engine, name).__wrapped__.__code__.co_consts
        assert 16 in consts and launcher.REAL_FAKE_SIZE not in consts
    with pytest.raises(SystemExit, match="no 4096 fake-work literal"):  # already patched: not JetStream 0.2.2's code
        launcher.shrink_fake_work(Engine, 16)


def frames(target: str, request) -> list[tuple[int, bool]] | str:
    """Each DecodeResponse as (number of token_ids, has text), or the gRPC status code name."""
    import grpc

    pb2, pb2_grpc = stubs()
    with grpc.insecure_channel(target) as channel:
        try:
            return [(len(m.stream_content.samples[0].token_ids), bool(m.stream_content.samples[0].text))
                    for m in pb2_grpc.OrchestratorStub(channel).Decode(request, timeout=60)]
        except grpc.RpcError as exc:
            return exc.code().name


def probes() -> dict[str, tuple[object, list[tuple[int, bool]]]]:
    pb2, _ = stubs()

    def text(s: str, n: int):
        return pb2.DecodeRequest(max_tokens=n, text_content=pb2.DecodeRequest.TextContent(text=s))

    return {  # name: (request, the frames JetStream sends)
        "text": (text("a b c", 6), [(1, True)] * 6 + [(0, False)]),
        "token ids": (pb2.DecodeRequest(max_tokens=6,
                                        token_content=pb2.DecodeRequest.TokenContent(token_ids=[5, 6, 7])),
                      [(1, False)] * 6 + [(0, False)]),
        "prompt over max_prefill_length": (text("x " * 40, 4), [(1, True)] * 4 + [(0, False)]),
        "max_tokens=0": (text("a", 0), [(0, False)]),
    }


def test_the_double_frames_decode_as_the_real_server_does(mock, tmp_path):
    """The same requests to JetStream's server and to tests/doubles/jetstream_double.py: same messages."""
    real = {name: frames(mock.target, request) for name, (request, _) in probes().items()}
    registry = ProcessRegistry(tmp_path)
    port = free_port()
    double = registry.start("JetStream double", [PYTHON, str(JETSTREAM_DOUBLE), "--port", str(port), "--config",
                                                 json.dumps({"max_prefill_length": 32})],
                            url=f"grpc://127.0.0.1:{port}")
    try:
        double.wait_ready(lambda: health_check(f"127.0.0.1:{port}"), 30)
        doubled = {name: frames(f"127.0.0.1:{port}", request) for name, (request, _) in probes().items()}
    finally:
        registry.stop_all()
    assert real == {name: expected for name, (_, expected) in probes().items()}
    assert doubled == real


def test_the_backend_counts_the_real_stream(mock, record_property):
    mock.generate(req(1))  # warmup: jax compiles prefill and generate on first use
    for bs in (1, 2, 4, 8, 16):  # 16: twice the mock's 8 slots, the rest wait in the prefill queue
        sample = mock.generate(req(bs))
        assert sample.generated_tokens == bs * DECODE  # token_ids summed; the final empty message is not one
        assert [len(t) for t in sample.token_times_ns] == [DECODE] * bs  # one token per message
        assert all(t == sorted(t) for t in sample.token_times_ns)
        assert sample.end_to_end_ns >= max(t[-1] for t in sample.token_times_ns)
        values = run_values(sample)
        assert values["ttft_ms"] > 0 and values["itl_ms"] > 0
        record_property(f"bs{bs}", {k: round(values[k], 2) for k in ("ttft_ms", "itl_ms", "e2e_ms")})
    d = mock.describe()
    assert (d["backend"], d["server_batch_size"], d["cache_length"], d["attached"]) == ("jetstream", 8, 32, False)


# A test of the backend, not of the machine: max_load=inf, so a busy neighbour cannot get its baseline refused.
@pytest.mark.llmperf(batch_sizes=[1, 4, 8], sequence_length=SEQ, decode_length=DECODE, runs=5, warmups=1,
                     max_load=float("inf"))
def test_llmperf_measures_the_real_server(llmperf, mock):
    result = llmperf.measure(mock)
    assert [b.batch_size for b in result.batches] == [1, 4, 8] and all(b.ok for b in result.batches)
    for batch in result.batches:
        assert len(batch.samples) >= 5
        assert all(s.generated_tokens == batch.batch_size * DECODE for s in batch.samples)
        assert run_values(batch.samples[0])["throughput_tokens_per_s"] > 0
    outcome = llmperf.session.outcomes[-1]
    assert outcome.status in ("created", "updated", "compared"), outcome.messages  # recorded, not refused


def test_seed002_suite_writes_the_dated_log(pytester, monkeypatch):
    """benchmarks/test_seed002_jetstream.py as shipped, starting the mock through LLMPERF_JETSTREAM_COMMAND."""
    clean_env(monkeypatch)
    env = {"COMMAND": f"{PYTHON} {LAUNCHER} --port {{port}}", "MODEL": "jetstream-mock", "DEVICE": "cpu",
           "DTYPE": "float32", "BATCH_SIZE": "8", "CACHE_LENGTH": "32", "MAX_INPUT": str(SEQ),
           "MAX_OUTPUT": str(DECODE)}
    for name, value in env.items():
        monkeypatch.setenv(f"LLMPERF_JETSTREAM_{name}", value)
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(
        str(ROOT / "benchmarks" / "test_seed002_jetstream.py"), "-p", "no:cacheprovider", "--llmperf-device=cpu",
        "--llmperf-update", "--llmperf-max-load=1000", f"--llmperf-report-dir={reports}",
        f"--llmperf-baseline-dir={pytester.path / 'baselines'}", timeout=300)
    result.assert_outcomes(passed=1)
    rows = [line.split(" | ") for line in (reports / "cpu-throughput-log.md").read_text().splitlines()
            if line[:4].isdigit() and line.count(" | ") == 7]
    assert len(rows) == 1, rows  # one dated row: batch size 8
    assert rows[0][3] == "8" and "jetstream-mock" in (reports / "cpu-throughput-log.md").read_text()
    assert json.loads((reports / "cpu-throughput-log.json").read_text())


def test_the_real_server_killing_itself_mid_stream_is_reported(llmperf_jetstream):
    # A fresh server (another command): past ~20 tokens the mock's next id is beyond chr()'s range, its
    # detokenize thread raises, and JetStream SIGKILLs its own process while the stream is open.
    server = llmperf_jetstream(command("--fake-work-size", "32"), **MOCK)
    with pytest.raises(BackendError, match=r"(?s)JetStream server at grpc://127.0.0.1:\d+ (died|has exited).*"
                                           r"chr\(\) arg not in range"):
        server.generate(req(1, decode=30, prompt="a b"))


def test_a_launcher_that_cannot_start_fails_with_the_log_tail(llmperf_jetstream):
    with pytest.raises(BackendError, match=r"(?s)exited before it became healthy \(exit code 2\).*invalid choice"):
        llmperf_jetstream(command("--config", "NoSuchServer"), **MOCK)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
