"""Energy, clocks and throttling through a fake NVML (measure/gpu.py), TPOT, and the run-quality notes
(judge/quality.py) that the report and the terminal summary show beside the verdicts."""

import pytest

from pytest_llmperf.judge.quality import quality_notes
from pytest_llmperf.measure import gpu
from pytest_llmperf.measure.metrics import run_values
from pytest_llmperf.measure.records import BatchResult, BenchmarkResult, RunSample


class FakeNvml:
    """Two GPUs; counters advance as the test says (NVML's total energy is in millijoules)."""

    NVML_CLOCK_SM = 1

    def __init__(self):
        self.energy_mj = [1_000_000, 2_000_000]
        self.reasons = [0x1, 0x0]  # idle bit: not a slowdown
        self.clocks = [1980, 1410]

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self.energy_mj[h]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons[h]

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        return self.clocks[h]


def test_energy_is_the_counter_difference_over_every_gpu_and_clocks_the_lowest():
    nvml = FakeNvml()
    meter = gpu.GpuMeter(nvml)
    meter.start()
    nvml.energy_mj = [1_150_000, 2_050_000]  # +150 J and +50 J
    assert meter.stop() == {"energy_j": 200.0, "throttle_reasons": 0.0, "sm_clock_mhz": 1410.0}


def test_a_power_cap_at_the_start_or_the_end_of_a_run_is_kept_and_named():
    nvml = FakeNvml()
    meter = gpu.GpuMeter(nvml)
    nvml.reasons = [0x4, 0x0]  # software power cap at the start
    meter.start()
    nvml.reasons = [0x0, 0x40]  # hardware thermal slowdown at the end
    mask = int(meter.stop()["throttle_reasons"])
    assert gpu.throttle_names(mask) == ["software power cap", "hardware thermal slowdown"]


def test_without_nvml_or_without_an_energy_counter_nothing_is_made_up():
    assert gpu.GpuMeter(None).stop() == {}
    nvml = FakeNvml()
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda h: (_ for _ in ()).throw(RuntimeError("not supported"))
    meter = gpu.GpuMeter(nvml)
    meter.start()
    assert "energy_j" not in meter.stop()


def test_open_nvml_without_the_library_yields_none(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with gpu.open_nvml() as nvml:
        assert nvml is None


def test_energy_per_token_and_tpot_as_vllm_defines_it():
    # two requests of 5 tokens: first at 10 ms, last at 50 ms and 30 ms -> TPOT 10 ms and 5 ms, mean 7.5 ms
    ms = 1_000_000
    sample = RunSample(batch_size=2, token_times_ns=[[10 * ms, 20 * ms, 30 * ms, 40 * ms, 50 * ms],
                                                     [10 * ms, 15 * ms, 20 * ms, 25 * ms, 30 * ms]],
                       end_to_end_ns=1000 * ms, generated_tokens=10, gpu={"energy_j": 2.5, "sm_clock_mhz": 1400.0})
    values = run_values(sample)
    assert values["tpot_ms"] == pytest.approx(7.5)
    assert values["energy_j_per_token"] == pytest.approx(0.25)
    sample.end_to_end_ns = 999 * ms  # shorter than ten of the counter's 100 ms steps: no figure of its own
    assert "energy_j_per_token" not in run_values(sample)
    assert values["sm_clock_mhz"] == 1400.0
    assert "energy_j_per_token" not in run_values(RunSample(batch_size=1, token_times_ns=[[1, 2]], end_to_end_ns=2))


def result_of(samples, decode_length=4):
    return BenchmarkResult(key="t", nodeid="m.py::t", module="m.py", scenario={"decode_length": decode_length},
                           backend={}, batches=[BatchResult(1, samples=samples)])


def run(prefill_ms, tokens=4, process=0, throttle=0.0):
    ms = 1_000_000
    return RunSample(batch_size=1, token_times_ns=[[ms, 2 * ms, 3 * ms, 4 * ms]], end_to_end_ns=4 * ms,
                     prefill_ns=int(prefill_ms * ms), decode_steps_ns=[ms] * 3, generated_tokens=tokens,
                     process=process, gpu={"throttle_reasons": throttle} if throttle else {})


def test_steady_runs_have_nothing_to_say():
    assert quality_notes(result_of([run(10.0), run(10.2), run(9.9)])) == []


def test_scattered_runs_within_a_process_are_called_noisy():
    notes = quality_notes(result_of([run(10.0), run(14.0), run(7.0)]))
    assert len(notes) == 1 and notes[0].startswith("prefill_ms at batch size 1: runs within a process scatter by a "
                                                   "robust CV of")


def test_one_disturbed_run_or_process_is_not_noise():
    steady = [run(10.0 + 0.1 * i, process=p) for p in (1, 2, 3) for i in range(4)]
    assert quality_notes(result_of(steady + [run(30.0, process=1)])) == []  # one slow run
    assert quality_notes(result_of(steady + [run(v, process=4) for v in (5.0, 15.0, 9.0, 20.0)])) == []


def test_throttled_runs_and_short_runs_are_named():
    notes = quality_notes(result_of([run(10.0, throttle=0x4), run(10.0), run(10.0, tokens=2)]))
    assert notes[:2] == ["batch size 1: the GPU throttled during 1 of 3 runs (software power cap)",
                     "batch size 1: 1 of 3 runs generated fewer tokens than asked (as few as 2 of 4)"]


def clocked(sample, reasons, clock, top=1980.0):
    sample.gpu = {"throttle_reasons": float(reasons), "sm_clock_mhz": clock, "sm_clock_max_mhz": top}
    return sample


def test_a_power_cap_at_full_clock_is_not_throttling_but_one_that_cost_clock_speed_is():
    # what an H100 reported while decoding a 7B model: software power cap at 1965 of 1980 MHz (docs/gpu.md)
    assert quality_notes(result_of([clocked(run(10.0), 0x4, 1965.0) for _ in range(3)])) == []
    notes = quality_notes(result_of([clocked(run(10.0), 0x4, 1965.0), clocked(run(10.0), 0x4, 1500.0),
                                     clocked(run(10.0), 0x0, 1980.0)]))
    assert notes == ["batch size 1: the GPU throttled during 1 of 3 runs (software power cap; SM clock as low as "
                     "1500 of 1980 MHz)"]
    thermal = quality_notes(result_of([clocked(run(10.0), 0x40, 1975.0)]))  # a thermal slowdown counts always
    assert thermal == ["batch size 1: the GPU throttled during 1 of 1 runs (hardware thermal slowdown; SM clock as "
                       "low as 1975 of 1980 MHz)"]


def test_the_maximum_clock_is_read_beside_the_clock():
    nvml = FakeNvml()
    nvml.nvmlDeviceGetMaxClockInfo = lambda h, kind: [1980, 1755][h]
    meter = gpu.GpuMeter(nvml)
    meter.start()
    assert meter.stop()["sm_clock_max_mhz"] == 1755.0  # of the GPU whose clock is lowest (1410 MHz)


def test_short_runs_have_no_energy_of_their_own_and_the_report_sums_the_runs():
    from pytest_llmperf.report.markdown import energy_table

    samples = [run(10.0) for _ in range(3)]
    for sample, joules in zip(samples, (0.0, 3.0, 1.0)):  # the counter steps coarsely: 0 J in one short run
        sample.gpu = {"energy_j": joules, "sm_clock_mhz": 1965.0, "sm_clock_max_mhz": 1980.0, "throttle_reasons": 4.0}
    assert all("energy_j_per_token" not in run_values(s) for s in samples)  # 4 ms runs: too short for their own
    table = energy_table(result_of(samples))
    assert "| 1          | 0.3333 J/token | 4.0 J / 12 tokens / 3 runs | 1965 MHz        | none      |" in table
    assert energy_table(result_of([run(10.0)])) is None  # no NVML, no table: never estimated


ENGINE = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], runs=5, warmups=0, max_runs=5)
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend(seed=1, noise={noise}))
"""


def test_a_noisy_benchmark_says_so_in_the_summary_and_the_report(pytester, monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # not the suite's --llmperf-processes=1
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=ENGINE.format(noise=0.3))
    result = pytester.runpytest("--llmperf-device=cpu", "--llmperf-processes=1", "--llmperf-max-load=inf",
                                "--llmperf-update", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["run quality: test_engine: * at batch size 1: runs within a process scatter by a "
                                 "robust CV of *"])
    assert "- run quality: " in (pytester.path / "reports" / "cpu.md").read_text()
