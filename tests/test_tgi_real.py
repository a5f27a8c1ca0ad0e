"""The real text-generation-inference, started by the llmperf_tgi fixture: the claims the TGI
backend and the double rest on (one SSE event per token, `details.generated_tokens`, how the
router reports validation errors on /generate and /generate_stream), checked where TGI exists.

Runs only where the `text-generation-launcher` on PATH is TGI's own (not the stand-in in
tests/doubles/bin) and LLMPERF_TGI_REAL_MODEL names a local model directory small enough for the
machine (a tiny Llama or GPT-2); skipped with the reason otherwise. LLMPERF_TGI_REAL_ARGS adds
launcher arguments (e.g. `--dtype bfloat16`, or what a CPU build of TGI needs).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import httpx
import pytest

from pytest_llmperf.measure.backend import BackendError, GenerationRequest
from pytest_llmperf.backends.models import make_prompt

STAND_IN = Path(__file__).parent / "doubles" / "bin" / "text-generation-launcher"
MAX_INPUT, MAX_TOTAL = 64, 128


def why_not() -> str | None:
    """Why the real-TGI tests cannot run here, or None when they can."""
    found = shutil.which("text-generation-launcher")
    if found is None:
        return "no text-generation-launcher on PATH: install text-generation-inference to run the real-TGI tests"
    path = Path(found).resolve()
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if path == STAND_IN.resolve() or b"Stand-in for TGI's `text-generation-launcher`" in head:
        return f"the text-generation-launcher on PATH ({found}) is this project's stand-in, not TGI"
    model = os.environ.get("LLMPERF_TGI_REAL_MODEL")
    if not model:
        return ("TGI's launcher is installed, but LLMPERF_TGI_REAL_MODEL is not set: point it at a small local "
                "model directory (e.g. a tiny Llama)")
    if not Path(model).is_dir():
        return f"LLMPERF_TGI_REAL_MODEL={model!r} is not a directory"
    return None


pytestmark = [pytest.mark.skipif(why_not() is not None, reason=str(why_not())), pytest.mark.slow]  # a real server


@pytest.fixture(scope="module")
def tgi(llmperf_tgi):
    # A real model may stop at its end token: TGI's HTTP API has no ignore_eos.
    return llmperf_tgi(model_id=os.environ["LLMPERF_TGI_REAL_MODEL"], max_input_tokens=MAX_INPUT,
                       max_total_tokens=MAX_TOTAL, max_batch_prefill_tokens=4 * MAX_TOTAL, require_full_length=False,
                       extra_args=shlex.split(os.environ.get("LLMPERF_TGI_REAL_ARGS", "")))


def test_one_event_per_token_and_the_count_from_details(tgi):
    tgi.generate(GenerationRequest(1, 16, 8, make_prompt(16)))  # warmup
    sample = tgi.generate(GenerationRequest(2, 16, 8, make_prompt(16)))
    assert len(sample.token_times_ns) == 2 and all(sample.token_times_ns)
    assert sample.generated_tokens == sum(len(t) for t in sample.token_times_ns)  # one event per token
    assert all(times == sorted(times) for times in sample.token_times_ns)
    assert set(tgi.last_finish_reasons) <= {"length", "eos_token", "stop_sequence"}
    assert tgi.info["max_input_tokens"] == MAX_INPUT and tgi.info["max_total_tokens"] == MAX_TOTAL


def test_the_router_reports_validation_errors_as_the_double_does(tgi):
    body = {"inputs": make_prompt(MAX_INPUT * 2), "parameters": {"max_new_tokens": 4, "truncate": MAX_INPUT + 1}}
    expected = (f"Input validation error: `truncate` must be strictly positive and less than {MAX_INPUT}. "
                f"Given: {MAX_INPUT + 1}")
    answer = httpx.post(f"{tgi.url}/generate", json=body, timeout=60)
    assert answer.status_code == 422 and answer.json() == {"error": expected, "error_type": "validation"}
    with httpx.stream("POST", f"{tgi.url}/generate_stream", json=body, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]
    assert events == [{"error": expected, "error_type": "validation"}]


def test_a_scenario_beyond_the_launcher_limits_names_the_flag(tgi):
    with pytest.raises(BackendError, match=rf"exceeds the server's max_input_tokens={MAX_INPUT} .*"
                                           rf"--max-input-tokens {MAX_INPUT + 1} or more"):
        tgi.generate(GenerationRequest(1, MAX_INPUT + 1, 4, make_prompt(MAX_INPUT + 1)))
