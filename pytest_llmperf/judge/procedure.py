"""The gate's decision procedure: one function gives every row its verdict, in every mode, at every look.

A benchmark is measured in *looks*: N units per side (worker processes, or runs in one process), then, for the
batch sizes still undecided, more units, up to a cap. At each look `decide` gives every undecided row (a metric at a
batch size, `judge/stats.py`'s estimate of how much worse it is) one of:

- **regressed**: credibly beyond the tolerance: a lower bound of the slowdown lies above 1 + rtol, *and* the metric
  is worse than its reference at the family-wise level: one-sided p below alpha x w_k / rows in the family
  (Bonferroni over every gated row of the job, or, measured in one process, of the benchmark, and over the looks,
  look k spending the share w_k). So a job of unchanged code ends with a regressed row with probability at most
  alpha however many rows and looks it has, and a slowdown below the tolerance fails rarely.
- **improved**: the mirror image (the same family-wise p, in the improving direction).
- **pass**: shown to be within the tolerance: an upper bound of the slowdown lies below 1 + rtol.
- undecided: measure more; at the last look, **inconclusive**, stating the bound the row did establish and about
  how many units would decide it.

Which bounds decide:

- **A/B in worker processes** (`Schedule.planned`): the interval *shown* for the row. It is a sequential one: each
  look spends the share w_k of its error (1 - CONFIDENCE, 5%), so that all the intervals a row is shown, at every
  look, cover the true ratio together with 95% confidence (Bonferroni over the looks, however they depend on each
  other), and the one it stopped at does, whatever made it stop. A pass says what it shows. The looks are planned:
  the first spends PLANNED_SHARES[0] and measures the job's spreads; the next is put where those spreads say the
  undecided rows will be decided (`plan_next`, within the job's budget) and spends PLANNED_SHARES[1]; a last
  one, at most at the cap, spends what is left, as does a look the budget makes the last.
- **Against stored baselines, and in one process**: the `DECISION_LEVEL` one-sided bounds (80%), at looks after
  every round spending alpha at the doublings and the cap (in one process at doublings of the runs), w_k in
  proportion to their units (Kim and DeMets' t x alpha); between the doublings a row can only pass. The table shows
  the 95% interval. A stored baseline holds a fixed number of units, so an interval at 95% over the looks would
  rarely come within a tolerance of 5% (on synthetic jobs of 3% noise per process against 10 recorded processes,
  14% of the rows of unchanged code stayed undecided at 25): the strict pass is the A/B gate's, whose units grow
  on both sides.

A row decided at one look keeps its verdict; the job stops as soon as every row is decided.

Where an A/B job spends its measuring (`plan_next`): runs per process and processes per side, from this job's own
spreads.

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
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from .stats import Estimate
from .trim import kept
from .verdicts import Verdict

#: Against stored baselines and in one process: the one-sided level of the bounds that decide "within" or
#: "beyond" the tolerance (a row passes when the 80% upper bound of its slowdown is within rtol).
DECISION_LEVEL = 0.2
#: A/B: the confidence of a row's intervals over all its looks together; the interval shown is the one that decides.
CONFIDENCE = 0.95
#: Shares of the error (of the intervals and of alpha) spent at an A/B job's planned looks: the first, the planned
#: one, and the last (what is left: 0.2 where there are three looks, 0.65 where the planned look is the cap). On
#: synthetic jobs at a quiet runner's spreads the first look decided unchanged code and +10% alike (20 s a job);
#: (0.2, 0.5) took 31-48 s, (0.6, 0.3) left more rows open on a shared runner (docs/notes/gate-runs.md).
PLANNED_SHARES = (0.35, 0.45)
#: At most this many planned looks: the first, the planned one, and one more for what they left open.
PLANNED_LOOKS = 3
#: Between the planned looks, an interim look every INTERIM_EVERY rounds spends INTERIM_SHARE (at most INTERIM_LOOKS
#: of them, taken from the last look's share): a row that became clear since the last look is decided there. On
#: synthetic jobs of a shared runner a 10% slowdown was called regressed in 39 s instead of 71 s, unchanged code as
#: often red (docs/notes/gate-runs.md, "The planned looks").
INTERIM_SHARE = 0.01
INTERIM_EVERY = 2
INTERIM_LOOKS = 10
#: Per-unit noise the "can it fail" check assumes: processes on a shared CPU runner scatter 3-10% (docs/notes/noise.md,
#: "What the cpu target measured").
REFERENCE_NOISE = 0.05
#: Past this many units a row is "far beyond the cap" in the inconclusive note.
NEEDED_LIMIT = 10_000


class SettingError(ValueError):
    """A setting under which the gate could never fail a slowdown."""


@dataclass(frozen=True)
class Schedule:
    """When a benchmark is judged: units per side at each look (the last is the cap), the family's alpha, the looks
    that spend it (`spend`, a subset of `looks` holding the cap; empty: every look), and for a planned schedule the
    shares of its planned looks (`shares`, in order, at the units of `planned_at`; the looks between them are interim
    ones, and the last look takes what is left: its bounds are sequential)."""

    looks: tuple[int, ...]
    alpha: float
    family: int = 1  # gated rows judged together (Bonferroni)
    spend: tuple[int, ...] = ()
    shares: tuple[float, ...] = ()
    confidence: float = CONFIDENCE
    planned_at: tuple[int, ...] = ()

    @classmethod
    def doubling(cls, first: int, cap: int, alpha: float, family: int = 1) -> Schedule:
        """first, 2 first, 4 first, ... up to cap (its last look)."""
        looks = [max(first, 1)]
        while looks[-1] < cap:
            looks.append(min(2 * looks[-1], cap))
        return cls(tuple(looks), alpha, max(family, 1))

    @classmethod
    def every_round(cls, first: int, cap: int, alpha: float, family: int = 1) -> Schedule:
        """A look at every unit from `first` to `cap`; alpha spent at the doublings' looks only."""
        doublings = cls.doubling(first, cap, alpha, family)
        return cls(tuple(range(doublings.looks[0], doublings.cap + 1)), alpha, doublings.family, doublings.looks)

    @classmethod
    def planned(cls, first: int, cap: int, alpha: float, family: int = 1) -> Schedule:
        """A first look at `first`, a last one at `cap`; `plan` puts a look between them once the first has
        measured the spreads."""
        first = max(first, 1)
        looks = (first, cap) if cap > first else (first,)
        return cls(looks, alpha, max(family, 1), shares=PLANNED_SHARES, planned_at=(first,))

    @property
    def cap(self) -> int:
        return self.looks[-1]

    @property
    def sequential(self) -> bool:
        """Whether the bounds that decide are the interval shown, sequential over the looks (a planned schedule)."""
        return bool(self.shares)

    @property
    def spending(self) -> tuple[int, ...]:
        """The looks that spend alpha."""
        return self.spend or self.looks

    @property
    def weights(self) -> tuple[float, ...]:
        """Each look's share of alpha (and, planned, of the intervals' error): a planned schedule's shares (the last
        look what they leave), else in proportion to its units among the looks that spend it (0 elsewhere): alpha
        spent linearly in the information (Kim and DeMets' t x alpha), each look's increment applied by Bonferroni,
        so the shares add up to 1 however the looks depend on each other."""
        if self.shares:
            head = tuple(
                self.shares[self.planned_at.index(n)] if n in self.planned_at else INTERIM_SHARE
                for n in self.looks[:-1]
            )
            return (*head, 1.0 - sum(head))
        total = sum(self.spending)
        return tuple(n / total if n in self.spending else 0.0 for n in self.looks)

    def plan(self, units: int, next_look: int) -> Schedule:
        """The schedule with its next planned look after `units` at `next_look` (a planned schedule, whose looks so
        far end at `units`), interim looks before it: at most the cap; the last of PLANNED_LOOKS is the cap's."""
        done = tuple(n for n in self.looks if n <= units)
        last = len(self.planned_at) + 1 >= PLANNED_LOOKS or next_look >= self.cap
        target = self.cap if last else max(next_look, units + 1)
        interim = sum(n not in self.planned_at for n in done)
        between = tuple(range(units + INTERIM_EVERY, target, INTERIM_EVERY))[: max(INTERIM_LOOKS - interim, 0)]
        if last:
            return replace(self, looks=(*done, *between, self.cap))
        return replace(self, looks=(*done, *between, target, self.cap), planned_at=(*self.planned_at, target))

    def interim(self, units: int) -> bool:
        """Whether the look at `units` is an interim one (a planned schedule's, between its planned looks)."""
        return bool(self.shares) and units not in self.planned_at and units != self.cap

    def share(self, look: int, final: bool) -> float:
        """The share look `look` spends: its weight, or, planned, at a last look before the cap (a budget spent)
        what the looks before it left."""
        return 1.0 - sum(self.weights[:look]) if final and self.sequential else self.weights[look]

    def look_of(self, units: int) -> int:
        """The index of the look that `units` per side reached (the last look at or below them)."""
        return max((i for i, n in enumerate(self.looks) if n <= units), default=0)

    def alpha_at(self, look: int) -> float:
        """The level of one row's significance at a look."""
        return self.alpha * self.weights[look] / self.family

    @property
    def alpha_per_test(self) -> float:
        """The level of one row's significance at the cap."""
        return self.alpha_at(len(self.looks) - 1)

    def with_family(self, family: int) -> Schedule:
        return replace(self, family=max(family, 1))

    def next_look(self, units: int) -> int | None:
        """The units of the look after one with `units`, or None at the cap."""
        return next((n for n in self.looks if n > units), None)

    def adjusted(self, p: ArrayLike, look: int, final: bool = False) -> NDArray[np.float64]:
        """p adjusted for the family and the look's share of alpha: compared with alpha."""
        p = np.asarray(p, dtype=float)
        weight = self.share(look, final)
        return np.minimum(1.0, p * self.family / weight) if weight > 0 else np.ones_like(p)


@dataclass(frozen=True)
class Decisions:
    """Per row: its verdict (None: undecided, measure more units), the one-sided p in the bad direction (the
    good one for "improved") adjusted for the family and looks, the interval of now / reference that decided (the
    look's sequential interval), and for an inconclusive row the units per side that would likely decide it."""

    verdicts: NDArray[np.object_]
    p_adjusted: NDArray[np.float64]
    needed: NDArray[np.int64]
    low: NDArray[np.float64]
    high: NDArray[np.float64]


def decide(estimate: Estimate, *, rtol: ArrayLike, schedule: Schedule, final: bool, units: int) -> Decisions:
    """The verdict of every row at the look that `units` per side reached; `final` at the last look (an undecided
    row is then inconclusive)."""
    rtol = np.asarray(rtol, dtype=float)
    margin = np.log1p(rtol) if estimate.scale == "log" else rtol
    look = schedule.look_of(units)
    if schedule.sequential:
        half = half_width(estimate, (1 - schedule.confidence) * schedule.share(look, final))
    else:
        half = np.where(estimate.se > 0, estimate.t(1 - DECISION_LEVEL) * estimate.se, 0.0)
    worse = schedule.adjusted(estimate.p_worse(), look, final)
    better = schedule.adjusted(estimate.p_better(), look, final)
    regressed = (estimate.bad - half > margin) & (worse < schedule.alpha)
    improved = ~regressed & (estimate.bad + half < -margin) & (better < schedule.alpha)
    passed = ~regressed & ~improved & (estimate.bad + half < margin)
    verdicts = np.full(np.shape(estimate.bad), None, dtype=object)
    verdicts[regressed] = Verdict.REGRESSED
    verdicts[improved] = Verdict.IMPROVED
    verdicts[passed] = Verdict.PASS
    undecided = ~(regressed | improved | passed)
    needed = np.zeros(np.shape(estimate.bad), dtype=np.int64)
    if final:
        verdicts[undecided] = Verdict.INCONCLUSIVE
        needed = np.where(undecided, units_needed(estimate, margin, schedule), 0)
    if schedule.sequential:
        ends = np.sort(np.stack([estimate.ratio(estimate.bad - half), estimate.ratio(estimate.bad + half)]), axis=0)
        low, high = ends[0], ends[1]
    else:
        low, high = estimate.interval(schedule.confidence)
    return Decisions(verdicts, np.where(improved, better, worse), needed, low, high)


def half_width(estimate: Estimate, error: float) -> NDArray[np.float64]:
    """Half the two-sided interval of the bad effect whose error is `error` (inf where no error is spent)."""
    if error <= 0:
        return np.full(np.shape(estimate.bad), np.inf)
    return np.where(estimate.se > 0, estimate.t(1 - error / 2) * estimate.se, 0.0)


def regression_bound(decision_high: float, decision_low: float, better: str) -> float:
    """The largest regression a row's interval leaves possible, as a fraction (0.088: no regression beyond 8.8%):
    for a latency the upper end of now / reference above 1, for a throughput how far below 1 the lower end lies."""
    return decision_high - 1.0 if better == "lower" else 1.0 - decision_low


def units_needed(estimate: Estimate, margin: NDArray[np.floating], schedule: Schedule) -> NDArray[np.int64]:
    """About how many units per side would decide each row at one more look spending what the cap spent (normal
    approximation: the standard error shrinks with the square root of the units), at most NEEDED_LIMIT."""
    last = len(schedule.looks) - 1
    level = (1 - schedule.confidence) * schedule.weights[last] / 2 if schedule.sequential else DECISION_LEVEL
    z_decide = stats.norm.ppf(1 - level)
    z_alpha = stats.norm.ppf(1 - schedule.alpha_per_test)
    beyond = estimate.bad > margin  # the bound must clear the margin and the worse-than-reference test pass
    target = np.where(
        beyond,
        np.minimum((estimate.bad - margin) / z_decide, estimate.bad / z_alpha),
        (margin - estimate.bad) / z_decide,
    )
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        units = np.maximum(estimate.n_current, 1) * (estimate.se / target) ** 2
    units = np.where((target > 0) & np.isfinite(units), np.ceil(units), NEEDED_LIMIT)
    # the normal approximation is optimistic at few units: never fewer than one more than measured
    return np.clip(units, np.asarray(estimate.n_current) + 1, NEEDED_LIMIT).astype(np.int64)


def smallest_rank_sum_p(reference_units: int, units: int) -> float:
    """The smallest p Mann-Whitney's exact test gives: every current unit worse than every reference unit."""
    return 1.0 / math.comb(reference_units + units, units)


def smallest_detectable(
    schedule: Schedule, rtol: float, *, reference: int | None, noise: float = REFERENCE_NOISE
) -> float:
    """The slowdown (e.g. 0.3 for 30%) this schedule calls regressed at its cap with even odds, when units
    scatter by `noise` (log sd per unit; per pair for A/B: `reference` None). Against a stored baseline of
    `reference` units, none where Mann-Whitney's exact test cannot reach the cap's level at all."""
    paired = reference is None
    h = schedule.cap if paired else kept(schedule.cap)  # A/B pairs are weighted, not trimmed (judge/stats.py)
    if h < 2 or (reference is not None and smallest_rank_sum_p(reference, schedule.cap) >= schedule.alpha_per_test):
        return math.inf
    se = noise * math.sqrt(1 / h if paired else 2 / h)
    df = h - 1 if paired else 2 * h - 2
    level = (1 - schedule.confidence) * schedule.weights[-1] / 2 if schedule.sequential else DECISION_LEVEL
    t_decide = stats.t.ppf(1 - level, df)
    t_alpha = stats.t.ppf(1 - schedule.alpha_per_test, df)
    return math.expm1(max(math.log1p(rtol) + t_decide * se, t_alpha * se))


def can_fail(schedule: Schedule, rtol: float, *, reference: int | None) -> bool:
    """Whether a slowdown to twice the tolerance (2 x (1 + rtol), e.g. 2.06x at rtol 0.03) could be called
    regressed at the cap when units scatter by REFERENCE_NOISE (A/B pairs: `reference` None; else against a
    stored baseline of `reference` units)."""
    return smallest_detectable(schedule, rtol, reference=reference) < 2 * (1 + rtol) - 1


def capped_at(schedule: Schedule, cap: int) -> Schedule:
    """The schedule with its looks below `cap` and a last look at `cap` (which spends alpha)."""
    below = tuple(n for n in schedule.looks if n < cap)
    spend = (*tuple(n for n in schedule.spending if n < cap), cap) if schedule.spend else ()
    return replace(schedule, looks=(*below, cap), spend=spend)


def smallest_cap(schedule: Schedule, rtol: float, *, reference: int | None) -> int:
    """The fewest units at the cap with which the schedule can fail (a stored baseline holding as many, where it
    holds fewer)."""
    for cap in range(max(schedule.cap, 2), NEEDED_LIMIT):
        baseline = None if reference is None else max(reference, cap)
        if can_fail(capped_at(schedule, cap), rtol, reference=baseline):
            return cap
    return NEEDED_LIMIT


def check_can_fail(schedule: Schedule, rtol: float, *, reference: int | None, what: str) -> None:
    """Refuse a setting that could not fail even a slowdown to twice its tolerance (at REFERENCE_NOISE per
    unit), naming the cap that could. `reference`: the units a stored baseline holds (None: A/B pairs)."""
    if can_fail(schedule, rtol, reference=reference):
        return
    need = smallest_cap(schedule, rtol, reference=reference)
    # the cap alone may not be enough: a stored baseline of few units limits Mann-Whitney's smallest p
    short = reference is not None and not can_fail(capped_at(schedule, need), rtol, reference=reference)
    baseline = f", and a baseline recorded with as many (it holds {reference})" if short else ""
    raise SettingError(
        f"{what} cannot fail: judging {schedule.family} gated row(s) over looks at "
        f"{list(schedule.spending)} units per side (alpha {schedule.alpha:g}, Bonferroni over rows "
        f"and looks), a slowdown to {2 * (1 + rtol):.2f}x (twice the tolerance) would not be called regressed when "
        f"units scatter by {REFERENCE_NOISE:.0%}. Allow at least {need} units per side at the last look{baseline}"
    )


def family_size(rows_per_benchmark: Sequence[int]) -> int:
    """The family of a job: every gated row of every benchmark judged together."""
    return max(sum(rows_per_benchmark), 1)


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
