"""When a change point is an alarm: `provisional` when found, `confirmed` once the commits after it say, beyond the
noise of a series analysed after every commit, that the level moved by a size that matters.

A job analyses its series at every commit, so a rule that a single analysis passes at a given rate is tried a
hundred times in a hundred commits: noise near the newest commits makes change points that last an analysis or
two. Counted that way (`first_confirmations`), the change points of one analysis are not a rate a user sees
(docs/history.md, "Measured"). A change point is confirmed when, in the analysis of the series as it stands:
- at least the method's `confirm_after` commits, outlier jobs aside, have been measured from it on (up to the next
  change point): a slow job at the newest commit is not a level;
- the analyses of the series cut at each of its last `confirm_looks` lengths all find it, within `SAME_POINT`;
- Student's t-test of those commits against the level before it gives p < `confirm_p`: the point was placed where
  the two sides differ most, and is tried again at every commit;
- their cumulative sum against that level, less half the smallest change that matters a commit (`min_effect`),
  reaches Page's decision interval for an average run length of `confirm_run_length` commits between false alarms
  at the series' noise (`decision_interval`): the sequential test made for a change of at least `min_effect`. A
  change smaller than half of it is never confirmed (it stays provisional; creep reports a drift of that size),
  so noise in a quiet series, where a significant change can be tiny, confirms nothing;
- that level holds at least `confirm_level` commits (outlier jobs aside), or `confirm_level_after_change` where it
  starts at a confirmed change: a level of a few commits is too easily a stretch of noise on its own.
Each is computed from the store's rows, not remembered: the same store always gives the same states.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .detect import DEFAULT_METHOD, Method, change_points, noise, outliers, student_p

SAME_POINT = 1  # commits a change point may move between analyses and still be the same
#: Series shorter than this are not analysed: too few commits to tell a level from noise.
MIN_COMMITS = 8
DEFAULT_MIN_EFFECT = 0.05  # the smallest change that matters: the A/B gate's tolerance
SIEGMUND_SHIFT = 1.166  # Siegmund's correction of a CUSUM's decision interval for its overshoot (in sigmas)


@lru_cache(maxsize=256)
def decision_interval(reference: float, run_length: float) -> float:
    """Page's CUSUM decision interval h, in sigmas, for a reference of `reference` sigmas a commit and an average
    run length of `run_length` commits between false alarms (one side), by Siegmund's approximation
    ARL = (exp(2 k b) - 2 k b - 1) / (2 k^2), b = h + 1.166 (Siegmund, "Sequential Analysis", 1985), solved in
    logarithms, which are monotone in b. Beyond a reference of a few sigmas h is 0; the bounds keep floats finite."""
    from scipy.optimize import brentq

    k = min(max(reference, 1e-3), 1e3)

    def excess(b: float) -> float:
        x = 2 * k * b
        return math.log(math.expm1(x) - x) - math.log(2 * k * k * run_length)

    high = min(math.sqrt(run_length) + 1, 700 / (2 * k))  # ARL >= b^2; exp(700) is still a float
    return max(0.0, float(brentq(excess, 1e-3 / k, high)) - SIEGMUND_SHIFT)


@dataclass(frozen=True)
class Found:
    index: int  # the first commit of the new level
    confirmed: bool
    commits_after: int  # commits measured from the change on (it included)


class Analyses:
    """Change points of the series cut after each commit, each computed once."""

    def __init__(
        self, values: Sequence[float], method: Method = DEFAULT_METHOD, min_effect: float = DEFAULT_MIN_EFFECT
    ) -> None:
        self.values = list(values)
        self.method = method
        self.reference = math.log1p(min_effect) / 2  # a commit's allowance, in logs: half the smallest change
        self._done: dict[int, list[int]] = {}
        self._set_aside: dict[int, frozenset[int]] = {}
        self._noise: dict[int, float] = {}

    def at(self, length: int) -> list[int]:
        if length not in self._done:
            values = self.values[:length]
            self._done[length] = (
                change_points(values, self.method, self.set_aside(length)) if length >= MIN_COMMITS else []
            )
        return self._done[length]

    def set_aside(self, length: int) -> frozenset[int]:
        """The outlier jobs of the series cut at `length`."""
        if length not in self._set_aside:
            self._set_aside[length] = frozenset(outliers(self.values[:length], self.method))
        return self._set_aside[length]

    def noise(self, length: int) -> float:
        """The noise of one commit (detect.noise) of the series cut at `length`, outlier jobs aside."""
        if length not in self._noise:
            aside = self.set_aside(length)
            self._noise[length] = noise([v for j, v in enumerate(self.values[:length]) if j not in aside])
        return self._noise[length]

    def _beyond_reference(self, before: list[float], after: list[float], length: int) -> bool:
        """Page's CUSUM of the commits since the change against the level before it, in the change's direction: the
        sum of (shift - reference) over the commits after reaches the decision interval at the series' noise."""
        if self.method.confirm_run_length <= 0:  # switched off (scripts/history_methods.py measures without it)
            return True
        shift, sigma = abs(float(np.mean(after)) - float(np.mean(before))), self.noise(length)
        if sigma == 0.0:  # a deterministic counter: no noise to sum against
            return shift >= self.reference
        # rounded: h moves slowly with the reference, and a series' analyses then share decision_interval's cache
        h = decision_interval(round(self.reference / sigma, 3), self.method.confirm_run_length)
        return len(after) * (shift - self.reference) >= h * sigma

    def found(self, length: int | None = None) -> list[Found]:
        """The change points of the series cut at `length` (all of it by default), each with its state."""
        length = len(self.values) if length is None else length
        points = self.at(length)
        states: dict[int, bool] = {}
        return [Found(i, self._confirmed(k, points, length, states), length - i) for k, i in enumerate(points)]

    def _confirmed(self, k: int, points: list[int], length: int, states: dict[int, bool]) -> bool:
        """Whether the k-th change point of the analysis at `length` is confirmed (module docstring)."""
        if k not in states:
            method, i = self.method, points[k]
            start, end = points[k - 1] if k else 0, points[k + 1] if k + 1 < len(points) else length
            logs, aside = np.log(np.asarray(self.values[:length], dtype=float)), self.set_aside(length)
            before = [logs[j] for j in range(start, i) if j not in aside]
            after = [logs[j] for j in range(i, end) if j not in aside]
            looks = range(length - 1, length - method.confirm_looks, -1)
            states[k] = (
                len(after) >= method.confirm_after
                and all(any(abs(j - i) <= SAME_POINT for j in self.at(n)) for n in looks)
                and (
                    len(before) >= method.confirm_level
                    or (
                        k > 0
                        and len(before) >= method.confirm_level_after_change
                        and self._confirmed(k - 1, points, length, states)
                    )
                )
                and student_p(before, after) < method.confirm_p
                and self._beyond_reference(before, after, length)
            )
        return states[k]


def first_confirmations(
    values: Sequence[float],
    method: Method = DEFAULT_METHOD,
    *,
    start: int = MIN_COMMITS,
    merge: int = 3,
    min_effect: float = DEFAULT_MIN_EFFECT,
) -> list[tuple[int, int]]:
    """Replay the series as if analysed after every commit: (length when first confirmed, index) of each alarm,
    an alarm within `merge` commits of one already raised being the same one (one alarm per change). This is the
    count a user sees: a job at every commit, each alarm once, however long it lasted."""
    analyses = Analyses(values, method, min_effect)
    raised: list[tuple[int, int]] = []
    for length in range(start, len(values) + 1):
        for f in analyses.found(length):
            if f.confirmed and not any(abs(f.index - i) <= merge for _, i in raised):
                raised.append((length, f.index))
    return raised
