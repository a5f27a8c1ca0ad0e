"""Where an A/B job spends its measuring: runs per process and processes per side, from this job's own spreads.

A pair's effect (judge/stats.py, `nested`) scatters by tau^2 + 2 sigma^2 / n: tau the processes' own differences,
sigma one run's scatter within its process, n the runs each process takes. A round costs its fixed part c0 (starting
both workers, their warmups) plus n c1 (c1: one run of the batch size on both sides). Runs are worth taking while
they are cheaper than the processes' scatter they cannot remove: the cost of a given variance is least at

    n* = sqrt(2 sigma^2 c0 / (tau^2 c1))            (Cochran's optimum for two-stage sampling)

so more runs where the processes agree (tau small) and the runs scatter, more processes where the processes
differ. The processes then follow from the interval the next look needs to decide each undecided row: its estimate
lies `distance` from the tolerance, and the look's interval must clear it with room for the estimate to move,
se <= distance / (z_look + z_power); the pairs measured so far hold 1 / se_now^2 of that information, each new pair
1 / (tau^2 + 2 sigma^2 / n*).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scipy import stats

from .procedure import Schedule

#: Power the planned look aims at: the chance that a row whose estimate stays where it is gets decided there.
PLANNED_POWER = 0.9
#: A row whose estimate sits at the tolerance cannot be decided by any number of processes: it is planned as if it
#: lay this fraction of the tolerance away (it then takes what the budget allows).
LEAST_DISTANCE = 0.25
#: Runs per process grow at most this many times from one look to the next: tau estimated as 0 from five pairs is
#: often a few percent, and a round of thirty runs is a long bet on it.
GROWTH = 4


@dataclass(frozen=True)
class Need:
    """One undecided row at a look: its batch size, the two levels of its noise (judge/stats.py's Spread, log
    scale) and how far its estimate lies from the tolerance (log scale)."""

    batch_size: int
    between: float  # tau
    within: float  # sigma: one run, within its process
    distance: float
    margin: float  # the tolerance on the same scale
    se: float  # the estimate's standard error now


@dataclass(frozen=True)
class Costs:
    """Seconds of one round of a test: its fixed part, and one run of each batch size on both sides."""

    fixed: float
    run: Mapping[int, float]


def runs_per_process(needs: Sequence[Need], costs: Costs, *, least: int, most: int) -> dict[int, int]:
    """Runs per process for each batch size with an undecided row: n* for its row that asks for most, within
    [least, most]."""
    chosen: dict[int, int] = {}
    for need in needs:
        run = costs.run.get(need.batch_size)
        if not run or run <= 0 or not math.isfinite(need.within):
            n = least
        elif need.between <= 0:
            n = most
        else:
            n = math.ceil(math.sqrt(2 * need.within**2 * max(costs.fixed, 0.0) / (need.between**2 * run)))
        chosen[need.batch_size] = max(chosen.get(need.batch_size, least), min(max(n, least), most))
    return chosen


def pair_variance(need: Need, runs: int) -> float:
    """The variance of one pair's effect of this row at `runs` runs per process."""
    within = need.within if math.isfinite(need.within) else 0.0
    return need.between**2 + 2 * within**2 / max(runs, 1)


def pairs_needed(needs: Sequence[Need], runs: Mapping[int, int], *, done: int, error: float, limit: int) -> int:
    """The processes per side (`done` so far) at which a look spending `error` (its interval's two-sided error) is
    likely to decide every row of `needs` (PLANNED_POWER) when the next ones take `runs` runs, at most `limit`."""
    z_power = stats.norm.ppf(PLANNED_POWER)
    most = done + 1
    for need in needs:
        distance = max(need.distance, LEAST_DISTANCE * need.margin)
        variance = pair_variance(need, runs.get(need.batch_size, 1))
        if not (math.isfinite(variance) and variance > 0 and math.isfinite(need.se) and need.se > 0):
            return limit
        total = done
        for _ in range(8):  # the t's degrees of freedom follow the pairs: a few rounds of fixed point
            z = stats.t.ppf(1 - error / 2, max(total - 1, 1)) + z_power
            more = (1 / (distance / z) ** 2 - 1 / need.se**2) * variance
            total = done + max(math.ceil(more), 1)
            if total >= limit:
                return limit
        most = max(most, total)
    return min(most, limit)


def round_seconds(costs: Costs, runs: Mapping[int, int]) -> float:
    """What one round of a test costs at `runs` runs per process of each batch size it measures."""
    return costs.fixed + sum(costs.run.get(b, 0.0) * n for b, n in runs.items())


def plan_next(
    needs: Sequence[Need],
    costs: Costs,
    schedule: Schedule,
    *,
    look: int,
    runs_now: int,
    least: int,
    most: int,
    affordable: Callable[[Mapping[int, int]], int],
) -> tuple[Schedule, dict[int, int]]:
    """After look `look` of a planned schedule: the schedule with its next look where the undecided rows (`needs`)
    are likely decided, at most where the budget affords (`affordable`: the most processes per side at given runs
    per process), and the runs per process of each of their batch sizes (at most GROWTH times `runs_now`)."""
    runs = runs_per_process(needs, costs, least=least, most=min(most, max(GROWTH * runs_now, least)))
    shares, planned = schedule.shares, len(schedule.planned_at)
    share = shares[planned] if planned < len(shares) else 1 - sum(shares)
    units = schedule.looks[look]
    limit = max(affordable(runs), units + 1)
    return schedule.plan(
        units, pairs_needed(needs, runs, done=units, error=(1 - schedule.confidence) * share, limit=limit)
    ), runs
