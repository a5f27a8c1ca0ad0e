"""Runs that take long or never end: a campaign of many processes says how long it will take (S11); a generate()
that hangs in the pytest process is stopped at llmperf_worker_timeout, as a worker process is (S12)."""

import signal

import pytest

from pytest_llmperf.judge.procedure import Schedule
from pytest_llmperf.orchestrate import progress
from pytest_llmperf.orchestrate.benchmark import Overtime, deadline


def plan(first, cap):
    return Schedule.doubling(first, cap, 0.01)


def test_a_long_campaign_is_estimated_from_its_first_round():
    line = progress.campaign_estimate(3.0, [plan(1000, 8000), plan(5, 40)])
    assert line == ("at 3.0 s per round, the first look's 1000 rounds take about 50 min, up to 400 min if "
                    "rows stay undecided (the cap, llmperf_max_processes); fewer processes (--llmperf-processes) "
                    "take less. Ctrl-C stops cleanly")
    assert progress.campaign_estimate(3.0, [plan(5, 40)]) is None  # 15 s: nothing to announce
    assert "up to" not in progress.campaign_estimate(3.0, [plan(400, 400)])
    assert progress.campaign_estimate(3.0, []) is None
    budgeted = progress.campaign_estimate(60.0, [plan(8, 40)], budget_s=780.0)  # an A/B job's budget
    assert "about 8 min, up to 13 min if rows stay undecided (the cap or the budget, --llmperf-budget)" in budgeted


def test_the_estimate_is_said_after_the_first_round(project, run, monkeypatch):
    monkeypatch.setattr(progress, "LONG_FIRST_LOOK_S", 0)  # every campaign is long
    project.makepyfile(test_x="""
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend())
""")
    result = run("--llmperf-processes=3", "--llmperf-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmperf: process 1 of 6 *",  # an update records twice --llmperf-processes
                                 "llmperf: at * s per round, the first look's 6 rounds take about * min; fewer "
                                 "processes (--llmperf-processes) take less. Ctrl-C stops cleanly",
                                 "llmperf: process 2 of 6 *"])


HANGS = """
import time
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

class Hangs(SimulatedBackend):
    def generate(self, request):
        if self.calls >= 2:
            try:
                time.sleep(120)  # a hung server call; long enough to fail this test if nothing stops it
            except Exception:  # and a backend that swallows errors
                pass
        return super().generate(request)

@pytest.mark.llmperf(batch_sizes=[1], runs=5, warmups=0)
def test_hangs(llmperf):
    llmperf.measure(Hangs())

@pytest.mark.llmperf(batch_sizes=[1], runs=5, warmups=0)
def test_after(llmperf):
    llmperf.measure(SimulatedBackend())
"""


def test_a_generate_that_hangs_in_this_process_is_stopped_at_the_worker_timeout(project, run):
    project.makepyfile(test_x=HANGS)
    result = run("--llmperf-update", "-o", "llmperf_worker_timeout=2")
    result.assert_outcomes(failed=1, passed=1)  # the next benchmark still runs
    result.stdout.fnmatch_lines(["*test_hangs: the measurement did not finish within 2 s (llmperf_worker_timeout, "
                                 "here for a benchmark measured in this pytest process), so it was stopped*"])
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_deadline_leaves_an_alarm_another_plugin_owns_alone():
    def theirs(signum, frame):
        raise AssertionError("not ours to fire")

    previous = signal.signal(signal.SIGALRM, theirs)
    try:
        with deadline(0.01) as armed:
            assert not armed
        assert signal.getsignal(signal.SIGALRM) is theirs
    finally:
        signal.signal(signal.SIGALRM, previous)
    with pytest.raises(Overtime):
        with deadline(0.05) as armed:
            assert armed
            signal.pause()
