"""The gate's job-level figures on synthetic jobs (scripts/gate_simulator.py drives judge/stats.py and
judge/procedure.py look by look, as the controller does): deterministic, seeded, a few seconds. These are not
timing tests; the figures they assert are issue 21's goals (docs/notes/noise.md, "The gate per CI job"), and -s
prints them.

Two settings: the shipped A/B defaults (rtol 0.05, 5 to 25 processes, read from the plugin) and rtol 0.03 with a
cap of 40, where a +5% slowdown lies beyond the tolerance and must be caught (at rtol 0.05 it is the tolerance
itself, a row either verdict may take)."""

import pytest

from tests.server_helpers import load_script

# hundreds of simulated jobs a test: about 30 s in all, out of the fast loop (tox -e fast)
pytestmark = pytest.mark.slow
simulator = load_script("gate_simulator")
Job = simulator.Job
SHIPPED = Job.shipped()

#: (label, job, jobs simulated)
AA = [("A/A clean, rtol 0.03", Job(), 300), ("A/A disturbed, rtol 0.03", Job(disturbed=0.1), 300),
      ("A/A clean, shipped", Job.shipped(), 300), ("A/A disturbed, shipped", Job.shipped(disturbed=0.1), 300)]


def test_the_shipped_job_is_the_plugins_a_b_default():
    assert (SHIPPED.rtol, SHIPPED.processes, SHIPPED.max_processes) == (0.05, 5, 25)


def test_the_default_cap_adds_a_last_look_only_where_trimming_keeps_more_units():
    from pytest_llmperf.orchestrate.session import default_cap

    # 5 units trim 1 per tail (3 kept) where 4 keep 4; 10 keep 6 as 8 do; from 3 on the fifth look keeps more
    assert [default_cap(first) for first in range(1, 7)] == [4, 8, 15, 20, 25, 30]


@pytest.mark.parametrize(("label", "job", "jobs"), AA, ids=[a[0] for a in AA])
def test_a_job_of_unchanged_code_is_rarely_red(label, job, jobs):
    figures, _ = simulator.simulate(job, jobs, seed=1)
    print(figures.line(label))
    assert figures.red <= 0.05  # counting every red outcome of the README's recipe (regressed or inconclusive)
    assert figures.any_regressed <= job.alpha  # the family-wise level, over all 360 rows and every look
    assert figures.rows_inconclusive <= 0.01
    assert figures.processes_median < 16  # decided at the first or second look


POWER = [("+10% clean, rtol 0.03", Job(slowdown=0.10, tests=2), 0.99),
         ("+10% disturbed, rtol 0.03", Job(slowdown=0.10, tests=2, disturbed=0.1), 0.95),
         ("+5% clean, rtol 0.03", Job(slowdown=0.05, tests=2), 0.90),
         ("+10% clean, shipped", Job.shipped(slowdown=0.10, tests=2), 0.99),
         ("+10% disturbed, shipped", Job.shipped(slowdown=0.10, tests=2, disturbed=0.1), 0.95)]


@pytest.mark.parametrize(("label", "job", "power"), POWER, ids=[p[0] for p in POWER])
def test_a_slowdown_is_caught_per_row(label, job, power):
    figures, _ = simulator.simulate(job, 200, seed=2)
    print(figures.line(label))
    assert figures.rows_regressed >= power


@pytest.mark.parametrize("job", [Job(slowdown=0.0225, tests=2), Job.shipped(slowdown=0.0375, tests=2)],
                         ids=["rtol 0.03", "shipped"])
def test_a_slowdown_under_the_tolerance_rarely_fails_a_row(job):
    figures, _ = simulator.simulate(job, 100, seed=3)  # 75% of the tolerance
    print(figures.line(f"+{job.slowdown:.2%} at rtol {job.rtol}"))
    assert figures.rows_regressed <= 0.05


def test_stored_baselines_read_drift_as_a_slowdown_and_ab_does_not():
    stored, _ = simulator.simulate(Job(mode="stored", drift=0.05, tests=4), 100, seed=4)
    ab, _ = simulator.simulate(Job(drift=0.05, tests=4), 100, seed=4)
    print(stored.line("stored, 5% drift"), ab.line("A/B, 5% drift"), sep="\n")
    assert stored.any_regressed > 0.5 and ab.red <= 0.05


def test_a_look_after_every_round_takes_fewer_processes_than_doublings_at_the_same_level():
    # seed 000's shape and noise here (one test of 18 rows, sd 6% per process): rows left open at 5 pass sooner
    job = Job.shipped(tests=1, rows=18, noise=0.06)
    every, _ = simulator.simulate(job, 1000, seed=5)
    doubling, _ = simulator.simulate(Job(**{**job.__dict__, "looks": "doubling"}), 1000, seed=5)
    print(every.line("every round"), doubling.line("doublings"), sep="\n")
    assert every.processes_mean < 0.8 * doubling.processes_mean
    assert every.any_regressed <= job.alpha and every.red <= doubling.red
