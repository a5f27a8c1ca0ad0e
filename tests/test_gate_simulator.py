"""The gate's job-level figures on synthetic jobs (scripts/gate_simulator.py drives judge/stats.py and
judge/procedure.py look by look, as the controller does): deterministic, seeded, a few seconds. These are not
timing tests; the figures they assert are docs/noise.md's goals, and -s prints them."""

import pytest

from tests.server_helpers import load_script

simulator = load_script("gate_simulator")
Job = simulator.Job

#: (label, job, jobs simulated)
AA = [("A/A clean", Job(), 300), ("A/A disturbed", Job(disturbed=0.1), 300)]


@pytest.mark.parametrize(("label", "job", "jobs"), AA, ids=[a[0] for a in AA])
def test_a_job_of_unchanged_code_is_rarely_red(label, job, jobs):
    figures, _ = simulator.simulate(job, jobs, seed=1)
    print(figures.line(label))
    assert figures.red <= 0.05  # counting every red outcome of the README's recipe (regressed or inconclusive)
    assert figures.any_regressed <= job.alpha  # the family-wise level, over all 360 rows and every look
    assert figures.rows_inconclusive <= 0.01
    assert figures.processes_median < 16  # decided at the first or second look


POWER = [("+10% clean", Job(slowdown=0.10, tests=2), 0.99), ("+10% disturbed", Job(slowdown=0.10, tests=2,
                                                                                     disturbed=0.1), 0.95),
         ("+5% clean", Job(slowdown=0.05, tests=2), 0.90)]


@pytest.mark.parametrize(("label", "job", "power"), POWER, ids=[p[0] for p in POWER])
def test_a_slowdown_is_caught_per_row(label, job, power):
    figures, _ = simulator.simulate(job, 100, seed=2)
    print(figures.line(label))
    assert figures.rows_regressed >= power


def test_a_slowdown_under_the_tolerance_rarely_fails_a_row():
    figures, _ = simulator.simulate(Job(slowdown=0.0225, tests=2), 100, seed=3)  # 75% of rtol 0.03
    print(figures.line("+2.25%"))
    assert figures.rows_regressed <= 0.05


def test_stored_baselines_read_drift_as_a_slowdown_and_ab_does_not():
    stored, _ = simulator.simulate(Job(mode="stored", drift=0.05, tests=4), 100, seed=4)
    ab, _ = simulator.simulate(Job(drift=0.05, tests=4), 100, seed=4)
    print(stored.line("stored, 5% drift"), ab.line("A/B, 5% drift"), sep="\n")
    assert stored.any_regressed > 0.5 and ab.red <= 0.05
