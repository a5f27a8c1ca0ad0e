"""The goals of issue 38 on seeded synthetic histories (tests/history_synthetic.py), through the code the plugin
runs at the end of a job (history/analysis.py, alarms.py, detect.py). Seeded: each figure is the same on
every run; the measured figures and their margins are in docs/history.md ("Measured")."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_llmperf.history.alarms import Analyses, first_confirmations
from pytest_llmperf.history.analysis import analyze_series
from pytest_llmperf.history.series import build
from tests.history_rows import history_rows
from tests.history_synthetic import Case, history

SEEDS = range(100)


@pytest.mark.parametrize("cv", [0.01, 0.03, 0.05, 0.10])
def test_one_analysis_of_pure_noise_confirms_at_most_a_tenth_of_an_alarm_per_100_commits(cv):
    confirmed = sum(f.confirmed for s in SEEDS for f in Analyses(history(Case(100, cv), s)).found())
    assert confirmed / len(SEEDS) <= 0.1  # measured: 0, 4, 5 and 2 in 100 histories of 100 commits


def test_pure_noise_analysed_at_every_commit_confirms_at_most_a_tenth_of_an_alarm_per_100_commits():
    """The rate a user sees: a job analyses its series at every commit, each alarm counted once however long it
    lasted. 25 histories of 100 commits at each CV, seeds 0-99 between them; the count over 400 histories at each CV
    is docs/history.md's (0.00, 0.04, 0.07 and 0.05 per 100 commits)."""
    alarms = {
        cv: sum(len(first_confirmations(history(Case(100, cv), s))) for s in range(25 * k, 25 * k + 25))
        for k, cv in enumerate((0.01, 0.03, 0.05, 0.10))
    }
    assert sum(alarms.values()) / 100 <= 0.1  # measured: 2 in these 100 histories (0, 0, 1 and 1 by CV)


def test_a_5pc_step_at_3pc_noise_is_found_within_2_commits_and_often_exactly():
    near = exact = 0
    for s in SEEDS:
        points = Analyses(history(Case(60, 0.03, ((30, 0.05),)), s)).at(60)
        best = min(points, key=lambda i: abs(i - 30), default=None)
        near += best is not None and abs(best - 30) <= 2
        exact += best == 30
    assert near >= 80 and exact >= 50  # measured: 91 and 58 of 100


def test_three_2pc_steps_are_flagged_as_creep_with_their_cumulative_size():
    flagged, drifts = 0, []
    for s in SEEDS:
        runs, rows = history_rows(history(Case(60, 0.03, ((15, 0.02), (30, 0.02), (45, 0.02))), s))
        (series,) = build(runs, rows).values()
        found = analyze_series(series, min_effect=0.05).creep
        if found is not None and found.flagged:
            flagged += 1
            drifts.append(found.drift)
    inside = np.mean([0.04 <= d <= 0.08 for d in drifts])
    assert flagged >= 85 and inside >= 0.9  # measured: 96 of 100, 93% of them between 4% and 8%


def _alarm_near(analyses: Analyses, at: int) -> bool:
    """A confirmed alarm within 2 commits of `at` in the analysis made while `at` was the newest commit or after any
    of the 8 commits that follow it."""
    lengths = range(at + 1, min(at + 10, len(analyses.values) + 1))
    return any(f.confirmed and abs(f.index - at) <= 2 for n in lengths for f in analyses.found(n))


def test_a_30pc_outlier_job_adds_no_confirmed_alarm_wherever_it_is():
    """Noise alone raises an alarm near some commit now and then: the histories with an alarm near the job are
    found with the job and without it (the same noise), and the job must not add any."""
    positions = (10, 50, 90, 99)
    spiked, clean = set(), set()
    for at in positions:
        for s in SEEDS:
            if _alarm_near(Analyses(history(Case(100, 0.03, outliers=((at, 0.30),)), s)), at):
                spiked.add((at, s))
            if _alarm_near(Analyses(history(Case(100, 0.03), s)), at):
                clean.add((at, s))
    assert spiked <= clean and len(clean) <= 0.03 * len(SEEDS) * len(positions)  # measured: the same 1 of 400
    for s in SEEDS:  # while the job is the newest commit, or one of the newest three, nothing is confirmed near it
        analyses = Analyses(history(Case(100, 0.03, outliers=((99, 0.30),)), s))
        assert not any(f.confirmed and f.index >= 97 for f in analyses.found())


def test_a_5pc_step_is_confirmed_within_8_commits_after_it_in_most_histories():
    """The issue's goal is 75%. Confirmed by the 8th commit of the new level and placed within 2 commits of the step:
    not met at a false-alarm rate of 0.1 per 100 commits analysed at every commit (65% of seeds 0-399, median 6-7:
    the trade measured in docs/history.md, "Measured"); confirmed by then wherever placed: 76% of seeds 0-399. This
    holds both figures as measured here, on seeds 0-99."""
    placed, anywhere = [], []
    for s in SEEDS:
        values = history(Case(60, 0.03, ((40, 0.05),)), s)
        confirmed = [(length - 40, i) for length, i in first_confirmations(values, start=41)]
        placed.append(next((d for d, i in confirmed if abs(i - 40) <= 2), 99))
        anywhere.append(confirmed[0][0] if confirmed else 99)
    assert np.mean(np.array(placed) <= 8) >= 0.65 and np.median(placed) <= 7  # measured: 69 of 100, median 6
    assert np.mean(np.array(anywhere) <= 8) >= 0.75  # measured: 80 of 100


@pytest.mark.parametrize(("cv", "warned"), [(0.10, True), (0.01, False)])
def test_a_series_noisier_than_the_smallest_change_that_matters_is_warned_about(cv, warned):
    runs, rows = history_rows(history(Case(60, cv), 3))
    (series,) = build(runs, rows).values()
    warnings = analyze_series(series, min_effect=0.05).warnings
    assert bool(warnings) == warned
    if warned:
        assert "larger than the smallest change that matters (5%)" in warnings[0]


def test_the_same_store_gives_the_same_changes():
    runs, rows = history_rows(history(Case(80, 0.03, ((30, 0.08), (55, -0.06))), 7))
    first, second = (analyze_series(next(iter(build(runs, rows).values()))) for _ in range(2))
    assert first.changes == second.changes and [c.first_bad for c in first.changes]
