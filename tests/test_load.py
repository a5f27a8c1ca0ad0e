"""The busy-machine check: foreign CPU load is measured, and a busy side is refused, never judged."""

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from pytest_llmperf.judge.procedure import Schedule
from pytest_llmperf.judge.rows import Reference, judge_rows
from pytest_llmperf.judge.verdicts import Verdict
from pytest_llmperf.measure import runner
from pytest_llmperf.backends.simulated import SimulatedBackend
from pytest_llmperf.judge.baselines import BaselineEntry
from pytest_llmperf.measure.runner import LoadMeter
from pytest_llmperf.measure.metrics import values_by_metric
from pytest_llmperf.measure.scenario import Scenario


def test_meter_counts_a_process_outside_our_tree_and_not_our_own_work():
    # The shell exits at once, so the spinner is re-parented: not our child, foreign load.
    code = "import time\nt = time.time()\nwhile time.time() - t < 2.0: pass"
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{code}" >/dev/null 2>&1 &'], check=True)
    time.sleep(0.2)
    meter = LoadMeter()
    time.sleep(1.0)
    assert meter.stop() > 0.5

    time.sleep(2.0)  # let the spinner finish


def test_our_own_cpu_time_is_subtracted_from_the_machines(monkeypatch):
    """Injected readings: the machine was busy 1.5 s of CPU over 1 s, 1.0 s of it ours: 0.5 foreign cores."""
    readings = {"system": iter([10.0, 11.5]), "own": iter([3.0, 4.0, 4.0]), "wall": iter([100.0, 101.0])}
    monkeypatch.setattr(runner, "_system_busy_seconds", lambda: next(readings["system"]))
    monkeypatch.setattr(runner, "_own_cpu_seconds", lambda process: next(readings["own"]))
    monkeypatch.setattr(runner, "time", SimpleNamespace(monotonic=lambda: next(readings["wall"]),
                                                      thread_time=time.thread_time))
    assert LoadMeter().stop() == pytest.approx(0.5)


def _rows(current_load, baseline_load, max_load=0.5):
    scenario = Scenario(batch_sizes=(1,), runs=10)
    base = runner.measure(SimulatedBackend(seed=1), scenario, key="k", nodeid="t::k", module="t")
    now = runner.measure(SimulatedBackend(seed=2, decode_slowdown=2.0), scenario, key="k", nodeid="t::k", module="t")
    now.batches[0].foreign_load = current_load
    runs = values_by_metric(base.batches[0].samples)  # one process: its runs
    entry = BaselineEntry("k", {1: runs}, foreign_load={1: baseline_load}, unit="run")
    return judge_rows(now, Reference(entry, "the baseline"), scenario, splits_prefill=True,
                      schedule=Schedule((10,), 0.01), final=True, max_load=max_load)


def test_a_busy_current_run_is_refused_not_failed():
    rows = _rows(current_load=1.5, baseline_load=0.0)
    assert [r.verdict for r in rows] == [Verdict.REFUSED]
    assert "other processes used 1.50 cores" in rows[0].note


def test_a_baseline_recorded_on_a_busy_machine_is_refused():
    rows = _rows(current_load=0.0, baseline_load=1.2)
    assert [r.verdict for r in rows] == [Verdict.REFUSED] and "baseline measured on a busy machine" in rows[0].note


def test_a_quiet_machine_is_judged():
    rows = _rows(current_load=0.1, baseline_load=0.1)
    assert "regressed" in {r.verdict for r in rows}


class BurstyMeter:
    """Stands in for LoadMeter: scripted loads, one per run."""

    def __init__(self, loads):
        self.loads = iter(loads)

    def __call__(self):
        return self

    def stop(self):
        return next(self.loads)


def test_runs_taken_while_the_machine_was_busy_are_retaken(monkeypatch):
    monkeypatch.setattr(runner, "LoadMeter", BurstyMeter([0.0, 1.5, 0.1, 1.2, 0.0]))
    backend = SimulatedBackend()
    request = runner.request_for(Scenario(), 1)
    taken = runner.take_runs(backend, request, runs=3, warmups=0, max_load=0.25)
    assert taken.retaken == 2 and len(taken.samples) == 3 and backend.calls == 5
    assert abs(taken.foreign_load - 0.1 / 3) < 1e-9


def test_retakes_are_bounded_and_the_load_is_reported(monkeypatch):
    monkeypatch.setattr(runner, "LoadMeter", BurstyMeter([2.0] * 10))
    taken = runner.take_runs(SimulatedBackend(), runner.request_for(Scenario(), 1), runs=2, warmups=0, max_load=0.25)
    assert taken.retaken == 2 and len(taken.samples) == 2 and taken.foreign_load == 2.0


def test_a_busy_thread_of_our_own_is_a_sibling_not_a_foreign_process():
    import threading

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    meter = LoadMeter()
    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    clock = time.pthread_getcpuclockid(thread.ident)  # the neighbour's own CPU time, read from here
    time.sleep(1.0)  # this thread sleeps: what runs is the neighbour
    before = time.clock_gettime(clock)
    reading = meter.reading()
    after = time.clock_gettime(clock)
    stop.set()
    thread.join()
    # The meter must count the neighbour's CPU time as ours, however much of a core it got (0.49 of one here
    # while other jobs kept the machine busy).
    assert before > 0.1
    assert before - 0.05 <= reading.sibling_cores * reading.wall_s <= after + 0.05
    assert reading.busy_cores >= reading.sibling_cores
    assert reading.wall_s >= 1.0
