"""Scheduler decisions with injected costs (never the clock)."""

import itertools
import random

import pytest

pytest.importorskip("torch")

from pytest_llmperf.offload.costs import CostModel, LinearFit, fixed_costs  # noqa: E402
from pytest_llmperf.offload.scheduler import Scheduler  # noqa: E402

FIDDLER = fixed_costs(7, 70)


@pytest.mark.parametrize("schedule", ["makespan", "fiddler"])
@pytest.mark.parametrize("n", range(1, 31))
def test_costs_7_and_70_put_a_non_resident_expert_on_cpu_exactly_below_10_tokens(schedule, n):
    counts = [3, 0, n, 5, 0, 0, 1, 2]  # expert 2 is the only non-resident one with tokens
    resident = [True, True, False, True, True, False, True, True]
    plan = Scheduler(FIDDLER, schedule).plan(counts, resident)
    assert plan.resident == (0, 3, 6, 7)
    assert (plan.cpu, plan.fetch) == (((2,), ()) if n < 10 else ((), (2,)))


def test_fiddler_schedule_applies_the_rule_to_every_expert_and_runs_sequentially():
    rng = random.Random(1)
    for _ in range(200):
        counts = [rng.randint(0, 25) for _ in range(16)]
        resident = [rng.random() < 0.3 for _ in range(16)]
        plan = Scheduler(FIDDLER, "fiddler").plan(counts, resident)
        assert plan.sequential
        assert set(plan.cpu) == {e for e in range(16) if not resident[e] and 0 < counts[e] < 10}
        assert set(plan.fetch) == {e for e in range(16) if not resident[e] and counts[e] >= 10}


def test_experts_without_tokens_are_not_run_anywhere():
    plan = Scheduler(FIDDLER).plan([0, 0, 4, 0], [True, False, False, False])
    assert plan.resident == () and plan.cpu == (2,) and plan.fetch == ()


@pytest.mark.parametrize("schedule,side", [("cpu", "cpu"), ("fetch", "fetch")])
def test_forced_schedules(schedule, side):
    counts, resident = [1, 50, 3, 0, 9], [False, False, True, False, False]
    plan = Scheduler(FIDDLER, schedule).plan(counts, resident)
    assert getattr(plan, side) == (0, 1, 4)
    assert plan.resident == (2,)


def _makespan(cpu_set, counts, resident, costs):
    cpu = sum(costs.cpu_ms(counts[e]) for e in cpu_set)
    fast = sum(costs.resident_ms(counts[e]) for e in range(len(counts)) if resident[e] and counts[e])
    fast += sum(costs.fetch_ms(counts[e]) for e in range(len(counts))
                if not resident[e] and counts[e] and e not in cpu_set)
    return max(cpu, fast)


def test_greedy_makespan_never_worse_than_fiddlers_rule_and_close_to_the_optimum():
    # Measured-style linear costs: CPU is cheap per call but slow per token, fetches cost a copy.
    costs = CostModel(cpu=LinearFit(0.3, 0.9), gpu=LinearFit(0.05, 0.01), h2d_bytes_per_s=2e9, expert_bytes=4_000_000)
    rng = random.Random(7)
    worst = 1.0
    for _ in range(300):
        counts = [rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 40]) for _ in range(8)]
        resident = [rng.random() < 0.25 for _ in range(8)]
        greedy = Scheduler(costs, "makespan").plan(counts, resident)
        rule = Scheduler(costs, "fiddler").plan(counts, resident)
        todo = [e for e in range(8) if counts[e] and not resident[e]]
        best = min(_makespan(set(s), counts, resident, costs)
                   for r in range(len(todo) + 1) for s in itertools.combinations(todo, r))
        assert greedy.makespan_ms == pytest.approx(_makespan(set(greedy.cpu), counts, resident, costs))
        assert greedy.makespan_ms <= max(rule.cpu_ms, rule.fast_ms) + 1e-9
        assert greedy.makespan_ms >= best - 1e-9
        worst = max(worst, greedy.makespan_ms / best if best else 1.0)
    assert worst < 4 / 3 + 1e-9  # LPT's bound on two machines; it is usually 1.0 here


def test_greedy_balances_what_the_per_expert_rule_piles_on_the_cpu():
    # Nine experts of 9 tokens: the rule sends all to CPU (9*63 = 567); balancing fetches some.
    plan = Scheduler(FIDDLER, "makespan").plan([9] * 9, [False] * 9)
    assert plan.fetch and plan.cpu
    assert plan.makespan_ms < 9 * 63


def test_scales_to_many_experts():
    rng = random.Random(3)
    counts = [rng.randint(0, 6) for _ in range(256)]
    resident = [rng.random() < 0.2 for _ in range(256)]
    plan = Scheduler(fixed_costs(1.0, 4.0)).plan(counts, resident)
    used = [*plan.resident, *plan.cpu, *plan.fetch]
    assert sorted(used) == [e for e in range(256) if counts[e]]


def test_bad_schedule_and_mismatched_counts_are_errors():
    with pytest.raises(ValueError, match="makespan, fiddler, cpu, fetch"):
        Scheduler(FIDDLER, "fastest")
    with pytest.raises(ValueError, match="3 token counts for 2 experts"):
        Scheduler(FIDDLER).plan([1, 2, 3], [True, False])
