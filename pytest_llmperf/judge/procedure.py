"""The gate's decision procedure: one function gives every row its verdict, in every mode, at every look.

A benchmark is measured in *looks*: N units per side (worker processes, or runs in one process), then, for the
batch sizes still undecided, more units, up to a cap. In worker processes a test is looked at after every round
from the first look on; measured in one process, at doublings of its runs. At each look `decide` gives every
undecided row (a metric at a batch size, `judge/stats.py`'s estimate of how much worse it is) one of:

- **regressed**: credibly beyond the tolerance. The estimate's `DECISION_LEVEL` lower bound lies above
  1 + rtol, *and* the metric is worse than its reference at the family-wise level: one-sided p below
  alpha x w_k / rows in the family, Bonferroni over every gated row of the job (or, measured in one process,
  of the benchmark) and over the looks that spend alpha: the doublings (5, 10, 20 units) and the cap (25),
  look k spending the share w_k in proportion to its units (1/12, 2/12, 4/12, 5/12: alpha spent linearly in
  the information, most where most is known). So a job of unchanged code ends with a regressed row with
  probability at most alpha however many rows and looks it has, and a slowdown below the tolerance fails
  rarely (its lower bound must clear 1 + rtol).
- **improved**: the mirror image (the same family-wise p, in the improving direction).
- **pass**: shown to be within the tolerance: the `DECISION_LEVEL` upper bound lies below 1 + rtol. The looks
  between the doublings spend no alpha: there a row can only pass. A row of unchanged code that 5 processes
  leave open can pass at the 6th or any later one instead of waiting for the 10th: 11 processes per test on
  average instead of 17 at seed 000's noise, for half a point of power (docs/notes/noise.md, "A look after every
  round").
- undecided: measure more; at the cap, **inconclusive**, with the number of units that would decide it.

A row decided at one look keeps its verdict; the job stops as soon as every row is decided.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from .stats import Estimate
from .trim import kept
from .verdicts import Verdict

#: One-sided level of the bounds that decide "within" or "beyond" the tolerance: a row passes when the 80%
#: upper bound of its slowdown is within rtol. The family-wise error is controlled by alpha (above); this
#: level trades processes for how often a slowdown near the tolerance is called either way.
DECISION_LEVEL = 0.2
#: Per-unit noise the "can it fail" check assumes: processes on a shared CPU runner scatter 3-10% (docs/notes/noise.md,
#: "What the cpu target measured").
REFERENCE_NOISE = 0.05
#: Past this many units a row is "far beyond the cap" in the inconclusive note.
NEEDED_LIMIT = 10_000


class SettingError(ValueError):
    """A setting under which the gate could never fail a slowdown."""


@dataclass(frozen=True)
class Schedule:
    """When a benchmark is judged: units per side at each look (the last is the cap), the family's alpha, and the
    looks that spend it (`spend`, a subset of `looks` holding the cap; empty: every look)."""

    looks: tuple[int, ...]
    alpha: float
    family: int = 1  # gated rows judged together (Bonferroni)
    spend: tuple[int, ...] = ()

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

    @property
    def cap(self) -> int:
        return self.looks[-1]

    @property
    def spending(self) -> tuple[int, ...]:
        """The looks that spend alpha."""
        return self.spend or self.looks

    @property
    def weights(self) -> tuple[float, ...]:
        """Each look's share of alpha, in proportion to its units among the looks that spend it (0 elsewhere):
        alpha spent linearly in the information (Kim and DeMets' t * alpha), each look's increment applied by
        Bonferroni, so the shares add up to alpha however the looks depend on each other."""
        total = sum(self.spending)
        return tuple(n / total if n in self.spending else 0.0 for n in self.looks)

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
        return Schedule(self.looks, self.alpha, max(family, 1), self.spend)

    def next_look(self, units: int) -> int | None:
        """The units of the look after one with `units`, or None at the cap."""
        return next((n for n in self.looks if n > units), None)

    def adjusted(self, p: ArrayLike, look: int) -> NDArray[np.float64]:
        """p adjusted for the family and the look's share of alpha: compared with alpha (1 where the look spends
        none)."""
        p = np.asarray(p, dtype=float)
        weight = self.weights[look]
        return np.minimum(1.0, p * self.family / weight) if weight > 0 else np.ones_like(p)


@dataclass(frozen=True)
class Decisions:
    """Per row: its verdict (None: undecided, measure more units), the one-sided p in the bad direction (the
    good one for "improved") adjusted for the family and looks, and for an inconclusive row the units per side
    that would likely decide it."""

    verdicts: NDArray[np.object_]
    p_adjusted: NDArray[np.float64]
    needed: NDArray[np.int64]


def decide(estimate: Estimate, *, rtol: ArrayLike, schedule: Schedule, final: bool, units: int) -> Decisions:
    """The verdict of every row at the look that `units` per side reached; `final` at the cap (an undecided row
    is then inconclusive)."""
    rtol = np.asarray(rtol, dtype=float)
    margin = np.log1p(rtol) if estimate.scale == "log" else rtol
    bound = np.where(estimate.se > 0, estimate.t(1 - DECISION_LEVEL) * estimate.se, 0.0)
    look = schedule.look_of(units)
    worse = schedule.adjusted(estimate.p_worse(), look)
    better = schedule.adjusted(estimate.p_better(), look)
    regressed = (estimate.bad - bound > margin) & (worse < schedule.alpha)
    improved = ~regressed & (estimate.bad + bound < -margin) & (better < schedule.alpha)
    passed = ~regressed & ~improved & (estimate.bad + bound < margin)
    verdicts = np.full(np.shape(estimate.bad), None, dtype=object)
    verdicts[regressed] = Verdict.REGRESSED
    verdicts[improved] = Verdict.IMPROVED
    verdicts[passed] = Verdict.PASS
    undecided = ~(regressed | improved | passed)
    needed = np.zeros(np.shape(estimate.bad), dtype=np.int64)
    if final:
        verdicts[undecided] = Verdict.INCONCLUSIVE
        needed = np.where(undecided, units_needed(estimate, margin, schedule), 0)
    return Decisions(verdicts, np.where(improved, better, worse), needed)


def units_needed(estimate: Estimate, margin: NDArray[np.floating], schedule: Schedule) -> NDArray[np.int64]:
    """About how many units per side would decide each row (normal approximation: the standard error shrinks
    with the square root of the units), at most NEEDED_LIMIT."""
    z_decide = stats.norm.ppf(1 - DECISION_LEVEL)
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
    h = kept(schedule.cap)
    if h < 2 or (reference is not None and smallest_rank_sum_p(reference, schedule.cap) >= schedule.alpha_per_test):
        return math.inf
    paired = reference is None
    se = noise * math.sqrt(1 / h if paired else 2 / h)
    df = h - 1 if paired else 2 * h - 2
    t_decide = stats.t.ppf(1 - DECISION_LEVEL, df)
    t_alpha = stats.t.ppf(1 - schedule.alpha_per_test, df)
    return math.expm1(max(math.log1p(rtol) + t_decide * se, t_alpha * se))


def can_fail(schedule: Schedule, rtol: float, *, reference: int | None) -> bool:
    """Whether a slowdown to twice the tolerance (2 x (1 + rtol), e.g. 2.06x at rtol 0.03) could be called
    regressed at the cap when units scatter by REFERENCE_NOISE (A/B pairs: `reference` None; else against a
    stored baseline of `reference` units)."""
    return smallest_detectable(schedule, rtol, reference=reference) < 2 * (1 + rtol) - 1


def capped_at(schedule: Schedule, cap: int) -> Schedule:
    """The schedule with its looks below `cap` and a last look at `cap` (which spends alpha)."""
    return Schedule(
        (*tuple(n for n in schedule.looks if n < cap), cap),
        schedule.alpha,
        schedule.family,
        (*tuple(n for n in schedule.spending if n < cap), cap),
    )


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
