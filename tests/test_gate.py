"""The statistical gate on synthetic samples with fixed seeds."""

import numpy as np
import pytest

from pytest_llmperf.judge import gate


def _verdict(base, cur, *, better="lower", rtol=0.05, alpha=0.01):
    return gate.decide([gate.compare("m", 1, base, cur, better=better, rtol=rtol, with_ci=False)], alpha)[0]


def test_false_alarm_rate_over_1000_aa_pairs_is_at_most_alpha():
    rng = np.random.default_rng(20261122)
    alpha = 0.01
    # rtol=0 isolates the test itself: the tolerance can only lower the rate further.
    alarms = sum(_verdict(rng.lognormal(0, 0.03, 10), rng.lognormal(0, 0.03, 10), rtol=0.0, alpha=alpha).verdict
                 == gate.REGRESSED for _ in range(1000))
    assert alarms / 1000 <= alpha


def test_detects_a_ten_percent_shift_at_three_percent_noise_with_ten_runs():
    rng = np.random.default_rng(7)
    hits = sum(_verdict(rng.lognormal(0, 0.03, 10), rng.lognormal(np.log(1.10), 0.03, 10)).verdict == gate.REGRESSED
               for _ in range(1000))
    assert hits / 1000 >= 0.95


def test_throughput_down_is_a_regression_and_up_an_improvement():
    rng = np.random.default_rng(3)
    base = rng.lognormal(np.log(100), 0.02, 10)
    assert _verdict(base, base * 0.8, better="higher").verdict == gate.REGRESSED
    assert _verdict(base, base * 1.25, better="higher").verdict == gate.IMPROVED
    assert _verdict(base, base * 0.8, better="lower").verdict == gate.IMPROVED


def test_a_significant_change_within_tolerance_passes():
    rng = np.random.default_rng(4)
    base = rng.lognormal(0, 0.005, 10)
    result = _verdict(base, base * 1.03, rtol=0.05)
    assert result.p_worse < 0.01 and result.verdict == gate.PASS


def test_hodges_lehmann_ratio_and_interval_cover_the_true_shift():
    rng = np.random.default_rng(5)
    base = rng.lognormal(0, 0.03, 20)
    ratio, low, high = gate.hodges_lehmann_ratio(base, rng.lognormal(np.log(1.2), 0.03, 20))
    assert low < 1.2 < high and abs(ratio - 1.2) < 0.03


def test_benjamini_hochberg_adjusts_across_one_tests_metrics():
    rng = np.random.default_rng(6)
    comparisons = [gate.compare(f"m{i}", 1, rng.lognormal(0, 0.03, 10), rng.lognormal(0, 0.03, 10), better="lower",
                                rtol=0.0, with_ci=False) for i in range(20)]
    decided = gate.decide(comparisons, 0.01)
    assert all(d.p_adjusted >= d.p_worse for d in decided)


def test_min_attainable_p_tells_when_runs_are_too_few():
    assert gate.min_attainable_p(3, 3) == pytest.approx(0.05)
    assert gate.min_attainable_p(10, 10) < 1e-4


def test_a_deterministic_counter_ties_with_its_stored_baseline(tmp_path):
    # 51/184 stored with fewer digits than computed now must still tie, not read as a complete shift.
    from pytest_llmperf.judge.baselines import BaselineEntry, BaselineStore, stored_value

    store = BaselineStore(tmp_path, "cpu")
    store.write("t.py", BaselineEntry("k", {1: {"hit_rate": [[51 / 184] * 10]}}, unit="run"))
    stored = BaselineStore(tmp_path, "cpu").get("t.py", "k").batches[1]["hit_rate"]
    result = gate.compare("hit_rate", 1, stored, [stored_value(51 / 184)] * 10, better="higher", rtol=0.0)
    assert result.ratio == 1.0 and result.p_worse >= 0.5  # all tied: no evidence either way


def test_a_confirmation_look_on_a_busy_machine_is_refused_not_passed():
    from pytest_llmperf.judge.verdicts import REFUSED, Row, confirm
    from pytest_llmperf.judged import kind_of

    def row(metric, verdict, note=""):
        return Row("t", "m.py::t", metric, 2, 1.0, 1.5, 1.5, 1.4, 1.6, 0.001, 0.002, verdict, note)

    first = [row("prefill_ms", "pass"), row("decode_token_ms", gate.REGRESSED)]
    busy = [row("*", REFUSED, "machine busy: other processes used 1.20 cores during the runs")]
    rows = confirm(first, busy, flagged=[2])
    # seen in a fresh-clone run: the busy second look's only row was dropped, the batch kept no row, and the test
    # passed, "judged 1 of 1", having compared nothing
    assert [(r.metric, r.verdict) for r in rows] == [("*", REFUSED)] and "confirmation look" in rows[0].note
    assert kind_of(type("Outcome", (), {"status": "compared", "rows": rows})()) == REFUSED
