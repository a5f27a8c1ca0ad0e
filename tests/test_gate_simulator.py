"""The gate against stored baselines on synthetic jobs (scripts/gate_simulator.py drives judge/stats.py and
judge/procedure.py look by look, as the controller does): deterministic, seeded, a few seconds. These are not timing
tests; -s prints the figures. A/B jobs, whose runs are tested pair by pair: tests/test_gate_runs.py."""

import pytest

from tests.server_helpers import load_script

pytestmark = pytest.mark.slow  # hundreds of simulated jobs a test, out of the fast loop (tox -e fast)
simulator = load_script("gate_simulator")
Job = simulator.Job


def test_the_shipped_job_is_the_plugins_stored_default():
    job = Job.shipped()
    assert (job.rtol, job.processes, job.max_processes, job.baseline_processes) == (0.05, 5, 25, 10)


def test_the_default_cap_adds_a_last_look_only_where_trimming_keeps_more_units():
    from pytest_llmperf.orchestrate.session import default_cap

    # 5 units trim 1 per tail (3 kept) where 4 keep 4; 10 keep 6 as 8 do; from 3 on the fifth look keeps more
    assert [default_cap(first) for first in range(1, 7)] == [4, 8, 15, 20, 25, 30]


@pytest.mark.parametrize("disturbed", [0.0, 0.1], ids=["clean", "disturbed"])
def test_unchanged_code_is_never_called_regressed_beyond_alpha(disturbed):
    job = Job.shipped(disturbed=disturbed)
    figures, _ = simulator.simulate(job, 300, seed=1)
    print(figures.line(f"A/A {disturbed:.0%} disturbed"))
    assert figures.any_regressed <= job.alpha  # the family-wise level, over all 360 rows and every look
    assert figures.rows_inconclusive <= 0.002  # measured: 0.03-0.04%


def test_a_slowdown_is_caught_per_row():
    figures, _ = simulator.simulate(Job.shipped(slowdown=0.10, tests=2), 100, seed=2)
    print(figures.line("+10% clean"))
    assert figures.rows_regressed >= 0.99  # measured: 99.8%


def test_a_stored_baseline_reads_an_aged_baseline_as_a_slowdown():
    # the reason pull requests are gated A/B: a baseline recorded 5% faster (another hour) fails unchanged code
    figures, _ = simulator.simulate(Job.shipped(drift=0.05, tests=4), 100, seed=4)
    print(figures.line("stored, 5% drift"))
    assert figures.any_regressed > 0.5
