"""The gate's statistics (judge/stats.py) and decision procedure (judge/procedure.py) on synthetic values with
fixed seeds: against scipy's own tests where one exists, and each rule of a verdict on a case built for it."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from pytest_llmperf.judge import procedure, stats
from pytest_llmperf.judge.procedure import Schedule, SettingError, check_can_fail, decide
from pytest_llmperf.judge.verdicts import Verdict

ONE_LOOK = Schedule((10,), alpha=0.01)


def verdict(estimate, *, rtol=0.05, schedule=ONE_LOOK, final=True):
    return decide(estimate, rtol=rtol, schedule=schedule, final=final, units=schedule.cap).verdicts[()]


def test_unpaired_is_yuens_trimmed_t_with_mann_whitneys_exact_p_as_scipy_computes_them():
    rng = np.random.default_rng(1)
    for n_ref, n_cur in ((12, 9), (8, 8), (5, 20)):
        ref, cur = rng.lognormal(0, 0.05, n_ref), rng.lognormal(0.04, 0.05, n_cur)
        ref, cur = ref[stats.screen(np.log(ref))], cur[stats.screen(np.log(cur))]  # as the estimate screens them
        estimate = stats.unpaired(ref, cur, better="lower")
        assert estimate.dropped == 0
        expected = scipy_stats.ttest_ind(np.log(cur), np.log(ref), trim=0.2, equal_var=False)
        assert estimate.bad / estimate.se == pytest.approx(expected.statistic)
        assert estimate.df == pytest.approx(expected.df)
        rank = scipy_stats.mannwhitneyu(cur, ref, alternative="greater", method="exact")
        assert estimate.p_worse() == pytest.approx(rank.pvalue, rel=1e-9)
        throughput = stats.unpaired(1 / ref, 1 / cur, better="higher")
        assert throughput.p_worse() == pytest.approx(rank.pvalue, rel=1e-9)


def test_paired_without_trimming_is_the_one_sample_t_test():
    rng = np.random.default_rng(2)
    ref = rng.lognormal(0, 0.05, 4)  # fewer than 5 pairs: nothing trimmed, nothing screened
    cur = ref * rng.lognormal(0.03, 0.02, 4)
    estimate = stats.paired(ref, cur, better="lower")
    expected = scipy_stats.ttest_1samp(np.log(cur) - np.log(ref), 0.0, alternative="greater")
    assert estimate.bad / estimate.se == pytest.approx(expected.statistic)
    assert estimate.p_worse() == pytest.approx(expected.pvalue)


def test_the_p_is_yuens_on_every_unit_since_setting_units_aside_favours_the_medians_side():
    # 400,000 A/A rows of 10 normal pairs: the screen sets a unit aside in about 8% of them, always the one
    # farthest from the median, so the rest lean the median's way; p-values of screened units fall below 1e-4
    # several times too often, Yuen's on every unit (trimming both tails alike) within a factor of 2.5
    rng = np.random.default_rng(11)
    effects = rng.normal(0, 0.05, (400_000, 10))
    estimate = stats.paired(np.ones(effects.shape), np.exp(effects), better="lower")
    screened = scipy_stats.t.sf(estimate.bad / estimate.se, estimate.df)
    assert 0.05 < (estimate.dropped > 0).mean() < 0.12
    assert (screened <= 1e-4).mean() > 5e-4
    assert (estimate.p_worse() <= 1e-4).mean() < 2.5e-4
    rows = estimate.dropped == 0  # where nothing was set aside, the p is the screened estimate's own
    assert estimate.p_worse()[rows] == pytest.approx(screened[rows])


def test_a_disturbed_unit_is_set_aside_and_no_more_than_a_quarter():
    rng = np.random.default_rng(3)
    values = rng.normal(0, 0.03, 12)
    values[4] += math.log(1.6)  # a process slowed 1.6x by a burst
    keep = stats.screen(values)
    assert not keep[4] and keep.sum() == 11
    noisy = rng.standard_cauchy(12)  # everything far out: noise, not three disturbed units
    assert stats.screen(noisy).sum() >= 12 - 12 // 4
    assert stats.screen(values[:4]).all()  # too few units for a scale
    assert stats.screen(np.array([1.0, 1.0, 1.0, 1.0, 1.0, 2.0])).all()  # no spread: no scale to call it on


def test_a_disturbed_process_neither_decides_nor_blocks_the_verdict():
    rng = np.random.default_rng(4)
    ref = rng.lognormal(0, 0.03, 10)
    cur = ref * rng.lognormal(math.log(1.10), 0.02, 10)
    cur[3] /= 1.8  # its B process ran 1.8x faster than the code: an A process hit by a burst, seen in the pair
    estimate = stats.paired(ref, cur, better="lower")
    assert estimate.dropped == 2 and estimate.ratio() == pytest.approx(1.10, abs=0.02)
    assert verdict(estimate) == Verdict.REGRESSED


def test_higher_is_better_reads_a_drop_as_worse():
    base = np.full(10, 100.0) * np.exp(np.random.default_rng(5).normal(0, 0.01, 10))
    worse = stats.unpaired(base, base * 0.8, better="higher")
    assert worse.bad > 0 and worse.ratio() == pytest.approx(0.8) and verdict(worse) == Verdict.REGRESSED
    better = stats.unpaired(base, base * 1.25, better="higher")
    assert verdict(better) == Verdict.IMPROVED
    assert verdict(stats.unpaired(base, base * 0.8, better="lower")) == Verdict.IMPROVED


def test_a_change_within_tolerance_passes_even_when_significant():
    base = np.exp(np.random.default_rng(6).normal(0, 0.002, 10))
    estimate = stats.unpaired(base, base * 1.02, better="lower")
    assert estimate.p_worse() == pytest.approx(1 / math.comb(20, 10))  # every current unit above every baseline one
    assert verdict(estimate, rtol=0.05) == Verdict.PASS


def test_beyond_tolerance_but_not_significant_for_the_family_is_undecided_then_inconclusive():
    rng = np.random.default_rng(7)
    ref, cur = rng.lognormal(0, 0.1, 6), rng.lognormal(math.log(1.12), 0.1, 6)
    estimate = stats.unpaired(ref, cur, better="lower")
    schedule = Schedule((6, 12, 24), alpha=0.01, family=50)
    assert decide(estimate, rtol=0.03, schedule=schedule, final=False, units=6).verdicts[()] is None
    final = decide(estimate, rtol=0.03, schedule=schedule, final=True, units=24)
    assert final.verdicts[()] == Verdict.INCONCLUSIVE and 6 < int(final.needed[()]) < procedure.NEEDED_LIMIT


def test_improved_uses_the_adjusted_p():
    rng = np.random.default_rng(8)
    ref, cur = rng.lognormal(0, 0.05, 10), rng.lognormal(math.log(0.85), 0.05, 10)
    estimate = stats.unpaired(ref, cur, better="lower")
    assert 0.01 / 10_000 < estimate.p_better() < 0.01
    alone = decide(estimate, rtol=0.03, schedule=Schedule((10,), 0.01, family=1), final=True, units=10)
    many = decide(estimate, rtol=0.03, schedule=Schedule((10,), 0.01, family=10_000), final=True,
                  units=10)
    assert alone.verdicts[()] == Verdict.IMPROVED and many.verdicts[()] != Verdict.IMPROVED
    assert alone.p_adjusted[()] == pytest.approx(estimate.p_better())  # an improved row shows its direction's p


def test_constant_values_decide_without_a_test():
    same = stats.unpaired([51 / 184] * 10, [51 / 184] * 10, better="higher")
    assert same.se == 0 and verdict(same) == Verdict.PASS
    worse = stats.unpaired([2.0] * 5, [3.0] * 5, better="lower")
    assert verdict(worse) == Verdict.REGRESSED


def test_a_counter_that_is_zero_compares_on_the_linear_scale_and_zero_references_have_no_scale():
    zeros = stats.unpaired([0.0] * 8, [0.0] * 8, better="lower")
    assert zeros.scale == "linear" and verdict(zeros) == Verdict.PASS
    fetches = stats.unpaired([0.0, 2.0, 4.0, 2.0, 2.0], [6.0, 8.0, 6.0, 7.0, 6.0], better="lower")
    assert fetches.scale == "linear" and verdict(fetches) == Verdict.REGRESSED
    with pytest.raises(stats.NoScale):
        stats.unpaired([0.0] * 5, [0.0, 0.0, 1.0, 0.0, 0.0], better="lower")


def test_the_interval_covers_the_true_ratio():
    rng = np.random.default_rng(9)
    covered = 0
    for _ in range(400):
        estimate = stats.unpaired(rng.lognormal(0, 0.03, 10), rng.lognormal(math.log(1.2), 0.03, 10), better="lower")
        low, high = estimate.interval()
        covered += low < 1.2 < high
    assert covered / 400 >= 0.92


def test_looks_double_to_the_cap_and_alpha_is_spent_over_rows_and_looks_in_proportion_to_their_units():
    schedule = Schedule.doubling(5, 40, 0.01, family=18)
    assert schedule.looks == (5, 10, 20, 40) and schedule.cap == 40
    assert schedule.weights == pytest.approx((5 / 75, 10 / 75, 20 / 75, 40 / 75)) and sum(schedule.weights) == 1
    assert schedule.alpha_per_test == pytest.approx(0.01 * 40 / 75 / 18)  # at the cap
    assert [schedule.look_of(n) for n in (1, 5, 9, 10, 20, 39, 40, 41)] == [0, 0, 0, 1, 2, 2, 3, 3]
    assert schedule.adjusted(1e-4, 0) == pytest.approx(1e-4 * 18 * 75 / 5)
    assert schedule.next_look(10) == 20 and schedule.next_look(40) is None
    assert Schedule.doubling(5, 12, 0.01).looks == (5, 10, 12)


def test_workers_look_after_every_round_spending_alpha_only_at_the_doublings():
    schedule = Schedule.every_round(5, 25, 0.01, family=18)
    assert schedule.looks == tuple(range(5, 26)) and schedule.spend == (5, 10, 20, 25)
    spent = dict(zip(schedule.looks, schedule.weights))
    assert [spent[n] for n in (5, 10, 20, 25)] == pytest.approx([5 / 60, 10 / 60, 20 / 60, 25 / 60])
    assert sum(schedule.weights) == pytest.approx(1) and spent[6] == spent[19] == 0
    assert schedule.alpha_per_test == pytest.approx(0.01 * 25 / 60 / 18)
    assert schedule.next_look(5) == 6 and schedule.next_look(25) is None
    assert list(schedule.adjusted([1e-12, 0.5], schedule.looks.index(7))) == [1, 1]  # no alpha to spend there
    assert procedure.capped_at(schedule, 12).spend == (5, 10, 12)  # the capped schedule's last look spends


def test_a_look_that_spends_no_alpha_passes_a_row_within_tolerance_and_regresses_none():
    schedule = Schedule.every_round(5, 25, 0.01, family=1)
    within = stats.paired(np.full(7, 100.0), np.full(7, 100.0) * (1 + np.linspace(-0.01, 0.01, 7)), better="lower")
    assert decide(within, rtol=0.05, schedule=schedule, final=False, units=7).verdicts[()] == Verdict.PASS
    rng = np.random.default_rng(3)
    ref = rng.lognormal(0, 0.01, 10)
    doubled = stats.paired(ref, 2 * ref * rng.lognormal(0, 0.01, 10), better="lower")
    assert decide(doubled, rtol=0.05, schedule=schedule, final=False, units=9).verdicts[()] is None
    assert decide(doubled, rtol=0.05, schedule=schedule, final=False, units=10).verdicts[()] == Verdict.REGRESSED


def test_an_ab_schedule_plans_its_second_look_and_the_last_spends_what_is_left():
    schedule = Schedule.planned(8, 40, 0.01, family=6)
    assert schedule.looks == (8, 40) and schedule.weights == pytest.approx((0.35, 0.65))
    planned = schedule.plan(8, 15)  # interim looks every 2 rounds before the planned one, 1% each
    assert planned.looks == (8, 10, 12, 14, 15, 40) and planned.planned_at == (8, 15)
    assert planned.weights == pytest.approx((0.35, 0.01, 0.01, 0.01, 0.45, 0.17)) and sum(planned.weights) == 1
    assert planned.interim(12) and not planned.interim(15) and not planned.interim(40)
    last = planned.plan(15, 22)  # a third planned look is the last: at the cap, interim looks up to 10 in all
    assert last.looks == (8, 10, 12, 14, 15, 17, 19, 21, 23, 25, 27, 29, 40) and last.weights[-1] == pytest.approx(0.1)
    assert schedule.plan(8, 60).looks[-1] == 40 and schedule.plan(8, 3).looks == (8, 9, 40)
    # a budget spent before the cap: that look is the last, and spends what the looks before it left
    assert planned.share(4, final=True) == pytest.approx(0.62) and planned.share(4, final=False) == pytest.approx(0.45)
    assert planned.adjusted(1e-4, 4, final=True) == pytest.approx(1e-4 * 6 / 0.62)


def test_a_pass_is_shown_an_interval_within_the_tolerance_at_the_looks_share_of_5_percent():
    rng = np.random.default_rng(3)
    ref = rng.lognormal(0, 0.02, (8, 5))
    schedule = Schedule.planned(8, 40, 0.01, family=6)
    estimate = stats.nested(ref, ref * rng.lognormal(0.0, 0.02, (8, 5)), better="lower")
    decision = decide(estimate, rtol=0.05, schedule=schedule, final=False, units=8)
    assert decision.verdicts[()] == Verdict.PASS and decision.high[()] < 1.05
    t = scipy_stats.t.ppf(1 - 0.05 * 0.35 / 2, 7)  # the first look spends 35% of the 5%
    assert math.log(decision.high[()]) == pytest.approx(float(estimate.bad + t * estimate.se))
    plain_low, plain_high = estimate.interval()
    assert decision.low[()] < plain_low and decision.high[()] > plain_high  # wider than one look's 95%
    slow = stats.nested(ref, ref * 1.04 * rng.lognormal(0.0, 0.04, (8, 5)), better="lower")
    late = decide(slow, rtol=0.05, schedule=schedule, final=True, units=8)
    assert late.verdicts[()] == Verdict.INCONCLUSIVE and late.high[()] > 1.05  # its bound, not a pass
    assert procedure.regression_bound(late.high[()], late.low[()], "lower") == pytest.approx(late.high[()] - 1)


def test_nested_with_one_run_a_process_is_the_paired_t_on_the_pairs():
    rng = np.random.default_rng(2)
    ref = rng.lognormal(0, 0.05, (6, 1))
    cur = ref * rng.lognormal(0.03, 0.02, (6, 1))
    estimate = stats.nested(ref, cur, better="lower")
    expected = scipy_stats.ttest_1samp(np.log(cur[:, 0]) - np.log(ref[:, 0]), 0.0, alternative="greater")
    assert estimate.bad / estimate.se == pytest.approx(expected.statistic)
    assert estimate.p_worse() == pytest.approx(expected.pvalue) and estimate.df == 5


def test_nested_weighs_a_pair_whose_runs_agree_above_one_whose_runs_scatter():
    rng = np.random.default_rng(3)
    quiet = np.exp(rng.normal(0, 0.01, (6, 10)))
    ref, cur = quiet.copy(), quiet * np.exp(rng.normal(0, 0.01, (6, 10)))
    cur[0] *= np.exp(rng.normal(0.1, 0.3, 10))  # a process whose runs a burst scattered (and slowed)
    estimate = stats.nested(ref, cur, better="lower")
    means = stats.process_means(np.log(cur))[0] - stats.process_means(np.log(ref))[0]
    assert means.mean() > 0.03 and abs(means[1:].mean()) < 0.001  # the pairs' plain mean is pulled by it
    assert abs(float(estimate.bad)) < 0.2 * means.mean()  # the weighted one much less
    assert float(estimate.spread.within) > 0.05


def test_nested_intervals_hold_their_level_where_processes_differ_and_where_runs_scatter():
    # 4,000 A/A rows each (seeded): 95% and 99.5% intervals miss about as often as they say (measured: within
    # 0.75-1.3 times; the margins below are wider than the sampling error, about +-0.35% and +-0.11%)
    rng = np.random.default_rng(11)
    for between, within, pairs, runs in ((0.03, 0.02, 8, 3), (0.0, 0.10, 8, 12), (0.03, 0.10, 15, 5)):
        shape = (4000, pairs, runs)
        shared = rng.normal(0, 0.2, (4000, pairs, 1))
        ref = np.exp(shared + rng.normal(0, between, (4000, pairs, 1)) + rng.normal(0, within, shape))
        cur = np.exp(shared + rng.normal(0, between, (4000, pairs, 1)) + rng.normal(0, within, shape))
        estimate = stats.nested(ref, cur, better="lower")
        for level, most in ((0.95, 0.065), (0.995, 0.0075)):
            low, high = estimate.interval(level)
            assert np.mean((low > 1) | (high < 1)) < most


def test_a_schedule_that_cannot_fail_a_2x_slowdown_is_refused_naming_the_cap_that_can():
    with pytest.raises(SettingError, match=r"cannot fail.*twice the tolerance.*at least (\d+) units per side") as found:
        check_can_fail(Schedule((2,), 0.01, family=18), 0.03, reference=None, what="processes=2")
    need = int(found.value.args[0].rsplit("at least ", 1)[1].split()[0])
    check_can_fail(Schedule((need,), 0.01, family=18), 0.03, reference=None, what="ok")
    check_can_fail(Schedule.doubling(5, 40, 0.01, family=360), 0.03, reference=None, what="the default")


def test_against_a_stored_baseline_the_rank_tests_smallest_p_must_reach_the_level():
    # a baseline of 3 runs and 3 now: Mann-Whitney's smallest p is 1/20, never below 0.01 / 6 rows
    with pytest.raises(SettingError, match=r"at least (\d+) units per side at the last look, and a baseline recorded "
                                           r"with as many \(it holds 3\)") as found:
        check_can_fail(Schedule((3,), 0.01, family=6), 0.05, reference=3, what="runs=3")
    need = int(found.value.args[0].split("at least ")[1].split()[0])
    assert procedure.smallest_rank_sum_p(3, 3) == pytest.approx(1 / 20)
    assert procedure.smallest_rank_sum_p(need, need) < 0.01 * need / (need + 3) / 6  # the cap's level
    check_can_fail(Schedule.doubling(5, 20, 0.01, family=36), 0.05, reference=10, what="the GPU default")
    check_can_fail(Schedule.doubling(3, 12, 0.01, family=3), 0.05, reference=6, what="processes=3, recorded 6")
