"""Metric definitions and the measurement loop, with injected clocks and a simulated engine."""

import pytest

from pytest_llmperf.measure import metrics
from pytest_llmperf.measure import runner
from pytest_llmperf.measure.backend import Backend, GenerationRequest
from pytest_llmperf.backends.simulated import SimulatedBackend
from pytest_llmperf.measure.backend import FakeClock
from pytest_llmperf.measure.records import RunSample
from pytest_llmperf.measure.scenario import Scenario

MS = 1_000_000


def test_tgi_definitions_reproduce_seed_000():
    # Seed 000, batch 1: prefill 139.82 ms -> 7.15 tokens/secs; decode 28.75 ms/token -> 34.78 tokens/secs.
    steps = [int(28.75 * MS)] * 7
    times = [int(139.82 * MS)]
    for s in steps:
        times.append(times[-1] + s)
    sample = RunSample(1, [times], times[-1], prefill_ns=int(139.82 * MS), decode_steps_ns=steps)
    values = metrics.run_values(sample)
    assert values["prefill_tokens_per_s"] == pytest.approx(7.15, abs=0.01)
    assert values["decode_tokens_per_s"] == pytest.approx(34.78, abs=0.01)
    assert values["decode_total_ms"] == pytest.approx(201.25, abs=0.01)
    assert values["itl_ms"] == pytest.approx(28.75)


def test_ttft_and_itl_exclude_and_include_the_right_tokens():
    sample = RunSample(2, [[10 * MS, 12 * MS, 15 * MS], [20 * MS, 21 * MS]], 21 * MS, generated_tokens=5)
    values = metrics.run_values(sample)
    assert values["ttft_ms"] == pytest.approx(15)  # mean of first-token times
    assert values["itl_ms"] == pytest.approx((2 + 3 + 1) / 3)  # gaps after the first token only
    assert values["throughput_tokens_per_s"] == pytest.approx(5 / 0.021)
    assert "prefill_ms" not in values  # a server cannot split prefill


def test_percentiles_need_enough_runs():
    summary = metrics.summarize(list(range(1, 11)))
    assert summary.percentiles[50] == pytest.approx(5.5)
    assert summary.percentiles[90] is not None and summary.percentiles[90] < 10  # not the max
    assert summary.percentiles[99] is None  # 10 runs cannot give a p99


class ClockedBackend(Backend):
    """Reads an injected clock the way a real engine does; each reading advances it by 1 ms."""

    def __init__(self):
        super().__init__(FakeClock(step=MS))
        self.calls = 0

    def generate(self, request: GenerationRequest) -> RunSample:
        self.calls += 1
        start = self.clock()
        times = [self.clock() - start for _ in range(request.decode_length)]
        return RunSample(request.batch_size, [times] * request.batch_size, times[-1], prefill_ns=times[0],
                         decode_steps_ns=[b - a for a, b in zip(times, times[1:])])

    def describe(self):
        return {"backend": "clocked"}


def test_warmups_are_run_and_discarded():
    backend = ClockedBackend()
    result = runner.measure(backend, Scenario(batch_sizes=(1, 2), runs=3, warmups=2, decode_length=4),
                            key="k", nodeid="t.py::k", module="t.py")
    assert backend.calls == 2 * (3 + 2)
    assert [len(b.samples) for b in result.batches] == [3, 3]
    assert all(s.decode_steps_ns == [MS] * 3 for b in result.batches for s in b.samples)


def test_a_failing_batch_is_recorded_and_the_sweep_goes_on():
    backend = SimulatedBackend(fail_at={2: "CUDA error: device-side assert"})
    result = runner.measure(backend, Scenario(batch_sizes=(1, 2, 4), runs=2), key="k", nodeid="t::k", module="t")
    assert [b.status for b in result.batches] == ["ok", "error", "ok"]
    assert "device-side assert" in result.batches[1].error


def test_out_of_memory_stops_the_sweep_and_marks_larger_batches():
    backend = SimulatedBackend(oom_from_batch=4)
    result = runner.measure(backend, Scenario(batch_sizes=(1, 2, 4, 8), runs=2), key="k", nodeid="t::k", module="t")
    assert [b.status for b in result.batches] == ["ok", "ok", "oom", "oom"]
    assert result.batches[3].skipped and not result.batches[2].skipped


def test_unknown_knob_is_rejected_with_the_known_ones():
    with pytest.raises(Exception, match="has no knob"):
        runner.measure(SimulatedBackend(), Scenario(knobs={"threads": 2}), key="k", nodeid="t::k", module="t")


def test_per_metric_rtol_in_the_marker_falls_back_to_the_sessions_rtol():
    from pathlib import Path

    from pytest_llmperf.measure.keywords import build_scenario
    from pytest_llmperf.orchestrate.options import Settings

    settings = Settings(runs=10, warmups=1, max_runs=30, alpha=0.01, rtol=0.6, max_load=0.25)
    scenario = build_scenario(settings.for_test({"rtol": {"prefill_ms": 0.1}}))
    assert scenario.rtol_for("prefill_ms") == 0.1
    assert scenario.rtol_for("decode_token_ms") == 0.6
    assert build_scenario(settings.for_test({"rtol": {"default": 0.2}})).rtol_for("decode_token_ms") == 0.2
