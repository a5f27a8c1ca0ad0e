"""When a change point is confirmed (history/alarms.py): the commits after it, outlier jobs aside; the level before
it; a change soon after a confirmed one; a deterministic counter. Seeded series at 1% noise with 10% steps, where
every rule's effect is certain."""

from __future__ import annotations

from pytest_llmperf.history.alarms import Analyses
from pytest_llmperf.history.detect import outliers
from tests.history_synthetic import Case, history


def states(values) -> list[tuple[int, bool]]:
    return [(f.index, f.confirmed) for f in Analyses(values).found()]


def test_a_change_needs_20_commits_of_level_before_it_to_be_confirmed():
    assert states(history(Case(40, 0.01, ((12, 0.10),)), 2)) == [(12, False)]  # 28 commits after it, still provisional
    assert states(history(Case(40, 0.01, ((22, 0.10),)), 2)) == [(22, True)]


def test_a_change_10_commits_after_a_confirmed_one_is_confirmed_and_6_after_is_not():
    assert states(history(Case(60, 0.01, ((25, 0.10), (37, -1 / 11))), 2)) == [(25, True), (37, True)]
    assert states(history(Case(60, 0.01, ((25, 0.10), (31, -1 / 11))), 2)) == [(25, True), (31, False)]


def test_an_outlier_job_is_not_one_of_the_commits_after_a_change():
    values = [*history(Case(40, 0.01), 2), 110.0, 111.0, 109.0, 160.0]  # +10% from 40, then one slow job
    assert outliers(values) == [43] and states(values) == [(40, False)]  # 3 commits after it, not 4
    assert states([*values, 110.5]) == [(40, True)]


def test_a_deterministic_counter_confirms_its_step():
    assert states([100.0] * 30 + [105.0] * 10) == [(30, True)]
