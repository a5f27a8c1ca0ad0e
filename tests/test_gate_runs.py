"""The A/B gate on whole synthetic jobs of runs (scripts/ab_job_simulator.py drives judge/stats.py's `nested`,
judge/procedure.py's planned looks, runs and processes as the campaign does), at the noise
measured on this project's runner (docs/notes/gate-runs.md) and with between-process drift injected. Seeded; the
margins are the measured figures' (docs/notes/gate-runs.md) with room for a few jobs either way. -s prints them."""

import pytest

from tests.server_helpers import load_script

pytestmark = pytest.mark.slow  # a few hundred simulated jobs a test
simulator = load_script("ab_job_simulator")
Job, NOISES = simulator.Job, simulator.NOISES


def run(label, job, jobs, seed):
    figures = simulator.simulate(job, jobs, seed)
    print(figures.line(label))
    return figures


def test_the_simulated_job_is_the_plugins_a_b_default():
    job = Job.shipped()
    assert (job.rtol, job.first, job.runs, job.cap) == (0.05, 8, 3, 40)


def test_on_a_quiet_runner_unchanged_code_passes_and_a_10_percent_slowdown_regresses_at_the_first_look():
    same = run("quiet, unchanged", Job.shipped(noise=NOISES["quiet"]), 200, 1)
    slow = run("quiet, +10%", Job.shipped(noise=NOISES["quiet"], slowdown=0.10), 200, 2)
    assert same.red <= 0.02 and same.regressed == 0  # measured: 0 of 200
    assert slow.regressed >= 0.98  # measured: 200 of 200
    assert same.processes_median == slow.processes_median == 8  # decided at the first look
    assert max(same.missed_rows, slow.missed_rows) <= 0.04  # 95% intervals over the looks: measured 1.8%


def test_on_a_busy_runner_a_row_that_cannot_be_decided_is_inconclusive_never_regressed():
    for name in ("shared", "busy"):
        same = run(f"{name}, unchanged", Job.shipped(noise=NOISES[name]), 200, 3)
        slow = run(f"{name}, +10%", Job.shipped(noise=NOISES[name], slowdown=0.10), 200, 4)
        assert same.regressed <= 0.01  # alpha, over every row and look of the job (measured: 0 of 200)
        assert same.rows_inconclusive > 0.1  # the budget spent (measured: 18-60% of rows)
        assert slow.regressed >= 0.9  # some row regressed (measured: 95.5-100%)
        assert max(same.missed_rows, slow.missed_rows) <= 0.05


def test_intervals_hold_the_truth_where_the_machine_drifts_between_processes():
    drifting = simulator.Noise(within=0.05, between=0.03, drift=0.03)
    for slowdown in (0.0, 0.10):
        figures = run(f"drift 3% a round, +{slowdown:.0%}", Job.shipped(noise=drifting, slowdown=slowdown), 300, 5)
        assert figures.missed_rows <= 0.05  # measured: 2.8% and 4.1% of rows
        assert figures.regressed <= 0.01 if not slowdown else figures.regressed >= 0.9


def test_more_runs_where_processes_agree_and_their_runs_scatter():
    from pytest_llmperf.judge import procedure

    costs = procedure.Costs(fixed=0.7, run={1: 0.08, 4: 0.26})
    agree = procedure.Need(1, between=0.005, within=0.15, distance=0.03, margin=0.049, se=0.04)
    differ = procedure.Need(4, between=0.06, within=0.02, distance=0.03, margin=0.049, se=0.03)
    runs = procedure.runs_per_process([agree, differ], costs, least=3, most=30)
    assert runs[1] >= 20 and runs[4] == 3  # processes that agree: runs are cheap information; that differ: they are not
    needed = [procedure.pairs_needed([n], runs, done=8, error=0.0225, limit=100) for n in (agree, differ)]
    assert 8 < needed[0] < needed[1] < 100  # more processes where they differ
    assert procedure.pairs_needed([agree], runs, done=8, error=0.0225, limit=12) == 12  # within the budget's limit
