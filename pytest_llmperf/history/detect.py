"""Change points in one series of per-commit values: ruptures' PELT, then a significance test that keeps only the
change points whose two sides differ beyond noise.

The values are taken as logarithms (the noise of a timing is multiplicative: a step of 5% is the same size at any
level). Outlier jobs (`outliers`) count as the median of their neighbours. PELT (Killick et al. 2012; ruptures'
KernelCPD, its C implementation) finds the segmentation that minimises the segments' cost plus a penalty per change
point: the linear kernel's cost, which is `l2` (squared deviation from the segment's mean), and a penalty of
`penalty * sigma^2 * ln(n)`, sigma the noise of one commit (`noise`). A change point then stays only while
Mann-Whitney's U test of the segment before it against the segment after it gives p < `p_value`: the weakest is
dropped, one at a time, and the tests are made again on the merged segments. A rank test, not a t-test: a short
segment holding one slow job has a large mean, not large ranks.

Whether a change point is confirmed is alarms.py's (a cumulative sum read commit by commit).

Deterministic: PELT is an exact search and nothing is drawn at random. The defaults are measured on the seeded
synthetic histories of tests/history_synthetic.py (scripts/history_methods.py; docs/history.md, "Measured").

ruptures is the `history` extra, imported here only: `RupturesMissing` names the extra to install.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

EXTRA_HINT = (
    "it is installed with pytest-llmperf where it has a wheel (CPython 3.10-3.13 on x86_64 or arm64 Linux, macOS, "
    "Windows); here, pip install 'pytest-llmperf[history]' builds it with a C compiler"
)


class RupturesMissing(ImportError):
    """ruptures (the `history` extra) is not installed; the message is the line to show."""


@dataclass(frozen=True)
class Method:
    """What finds change points; the defaults are the measured choice (docs/history.md)."""

    kernel: str = "linear"  # ruptures' KernelCPD: "linear" is the l2 cost (a shift in mean), computed in C
    penalty: float = 2.0  # times sigma^2 ln(n)
    min_size: int = 3  # commits a segment holds at least
    p_value: float = 0.005  # Mann-Whitney's U test of the two sides of a change point
    confirm_after: int = 4  # commits from a change on (it included) before the cumulative sum may confirm it
    confirm_run_length: float = 4000.0  # commits between false alarms of the cumulative sum, a side
    confirm_guard: int = 8  # the newest commits before a commit that are not yet part of the level it is compared with
    confirm_level: int = 15  # commits (outlier jobs aside) the level holds before the sum starts,
    confirm_level_after_change: int = 10  # or this many where that level starts at a confirmed change
    outlier_sigmas: float = 5.0  # a job this far from its neighbours on both sides is an outlier, set aside

    def describe(self) -> str:
        return (
            f"ruptures KernelCPD(kernel={self.kernel!r}, min_size={self.min_size}) (PELT), penalty {self.penalty:g} "
            f"sigma^2 ln n, Mann-Whitney p < {self.p_value:g}; confirmed by a self-starting CUSUM against half the "
            f"smallest change that matters, for a run length of {self.confirm_run_length:g} commits a side, at "
            f"least {self.confirm_after} commits after the change, against a level of at least {self.confirm_level} "
            f"commits ({self.confirm_level_after_change} after a confirmed change) ending {self.confirm_guard} "
            "commits before the one compared"
        )


DEFAULT_METHOD = Method()


def _ruptures():
    try:
        import ruptures
    except ImportError as exc:
        raise RupturesMissing(f"history analysis skipped: ruptures is not installed ({EXTRA_HINT})") from exc
    return ruptures


def noise(values: Sequence[float]) -> float:
    """The noise of one commit's value, as a relative standard deviation: the interquartile range of the differences
    of neighbouring commits' logarithms / (1.349 sqrt 2). A step moves one difference and an outlier job two, so
    neither moves the quartiles; the median absolute difference would do as well on continuous values, but collapses
    on values that repeat (a job's median of a few process medians takes few distinct values: docs/history.md)."""
    logs = np.log(np.asarray(values, dtype=float))
    if len(logs) < 3:
        return 0.0
    low, high = np.percentile(np.diff(logs), [25, 75])
    return float((high - low) / (1.349 * math.sqrt(2)))


def two_sample_p(before: np.ndarray, after: np.ndarray) -> float:
    """Two-sided p of Mann-Whitney's U test of two segments; 1.0 where a side is empty. Where both sides hold more
    than `EXACT_UP_TO` commits scipy's `mannwhitneyu` takes its normal approximation (tie-corrected, with continuity
    correction), computed here the same way in a few array operations: scipy's call costs about 3 ms in its argument
    handling, and the significance step makes thousands of them on a long real history (docs/history.md, "Cost")."""
    if len(before) == 0 or len(after) == 0:
        return 1.0
    return _rank_sum_p(np.asarray(before, dtype=float), np.asarray(after, dtype=float))


EXACT_UP_TO = 8  # scipy's mannwhitneyu is exact (without ties) where a side holds at most this many, else asymptotic


@lru_cache(maxsize=4096)
def _u_tail(small: int, large: int) -> tuple[float, ...]:
    """P(U >= u) for u = 0 .. small * large, distinct values: U's counts are the coefficients of the Gaussian
    binomial [small + large, small] in q, the product over i of (1 - q^(large + i)) / (1 - q^i), kept to degree
    small * large (exact integers; dividing by 1 - q^i is a running sum at stride i)."""
    top = small * large
    counts = np.zeros(top + 1, dtype=object)
    counts[0] = 1
    for i in range(1, small + 1):
        shift = large + i
        if shift <= top:
            counts[shift:] = counts[shift:] - counts[: top + 1 - shift]
        for r in range(i):
            counts[r::i] = np.cumsum(counts[r::i])
    total = sum(counts)
    tail = np.cumsum(counts[::-1])[::-1]
    return tuple(float(t) / total for t in tail)


def _rank_sum_p(before: np.ndarray, after: np.ndarray) -> float:
    """Mann-Whitney's two-sided p as scipy.stats.mannwhitneyu computes it by default: exact where a side holds at
    most `EXACT_UP_TO` values and none tie, else the normal approximation with tie and continuity corrections."""
    from scipy.special import ndtr

    values = np.concatenate([before, after])
    n1, n2, n = len(before), len(after), len(before) + len(after)
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    edges = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1], [True])))
    counts = np.diff(edges)
    ranks = np.empty(n)
    ranks[order] = np.repeat((edges[:-1] + edges[1:] + 1) / 2.0, counts)  # average ranks of ties, from 1
    u1 = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2.0
    u = max(u1, n1 * n2 - u1)
    if min(n1, n2) <= EXACT_UP_TO and len(counts) == n:  # no ties
        return min(1.0, 2.0 * _u_tail(min(n1, n2), max(n1, n2))[round(u)])
    ties = float((counts**3 - counts).sum())
    spread = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1))))
    if spread == 0.0:
        return 1.0
    return min(1.0, 2.0 * float(ndtr(-(u - n1 * n2 / 2.0 - 0.5) / spread)))


def _significant(logs: np.ndarray, points: list[int], p_value: float) -> list[int]:
    """Drop the weakest change point while any has p >= p_value over its neighbouring segments. Dropping a point
    changes the tests of its two neighbours only: those are made again, the others kept."""
    points = list(points)

    def test(i: int) -> float:
        edges = [0, *points, len(logs)]
        return two_sample_p(logs[edges[i] : edges[i + 1]], logs[edges[i + 1] : edges[i + 2]])

    ps = [test(i) for i in range(len(points))]
    while points:
        weakest = int(np.argmax(ps))
        if ps[weakest] < p_value:
            break
        del points[weakest], ps[weakest]
        for i in (weakest - 1, weakest):
            if 0 <= i < len(points):
                ps[i] = test(i)
    return points


OUTLIER_NEIGHBOURS = 3  # commits on each side whose median an outlier is compared with


def outliers(values: Sequence[float], method: Method = DEFAULT_METHOD) -> list[int]:
    """Jobs that differ from the median of the commits before them and from that of the commits after them by more
    than `outlier_sigmas` times the noise, in the same direction: a shift followed by its reverse (Conbench's rule).
    The newest commit has no commits after it: far from those before, it is an outlier until the next commits say
    it started a new level."""
    logs = np.log(np.asarray(values, dtype=float))
    sigma = noise(values)
    if sigma == 0.0 or len(logs) < OUTLIER_NEIGHBOURS + 1:
        return []
    k, n = OUTLIER_NEIGHBOURS, len(logs)
    limit = method.outlier_sigmas * sigma
    windows = np.lib.stride_tricks.sliding_window_view(logs, k)  # windows[w] = logs[w : w + k]
    left = logs[k:] - np.median(windows[: n - k], axis=1)  # point i (>= k) against the k before it
    after = np.full(n - k, np.nan)  # the median of the k after it: fewer near the end, none for the newest
    whole = np.median(windows[k + 1 :], axis=1)
    after[: len(whole)] = whole
    for i in range(max(k, n - k), n - 1):
        after[i - k] = np.median(logs[i + 1 :])
    right = np.where(np.isnan(after), left, logs[k:] - after)
    flagged = (np.abs(left) > limit) & (np.abs(right) > limit) & (left * right > 0)
    return [int(i) + k for i in np.flatnonzero(flagged)]


class PrefixOutliers:
    """`outliers(values[:length])` for each length in turn, without recomputing the whole prefix: a job's distance
    from the median of the commits before it is fixed once it is measured, and from that of the commits after it
    once those are; only the noise, the limit they are held to, moves with the prefix (its neighbour differences are
    kept sorted as it grows, so its quartiles are read, not recomputed). The same flags as `outliers` at every
    length (tests/test_history_alarms.py asserts it); the sequential read of alarms.py asks at every commit."""

    def __init__(self, values: Sequence[float], method: Method = DEFAULT_METHOD) -> None:
        self.logs = np.log(np.asarray(values, dtype=float))
        self.limit_sigmas = method.outlier_sigmas
        k, n = OUTLIER_NEIGHBOURS, len(self.logs)
        self.left = np.zeros(n)
        self.score = np.zeros(n)  # min of the two distances where both exist and agree in sign, else 0
        if n > k:
            windows = np.lib.stride_tricks.sliding_window_view(self.logs, k)
            self.left[k:] = self.logs[k:] - np.median(windows[: n - k], axis=1)
            if n > 2 * k:
                right = self.logs[k : n - k] - np.median(windows[k + 1 :], axis=1)
                left = self.left[k : n - k]
                self.score[k : n - k] = np.where(left * right > 0, np.minimum(np.abs(left), np.abs(right)), 0.0)
        self.by_score = np.argsort(-self.score, kind="stable").tolist()
        self.scores = self.score.tolist()
        self.diffs = np.diff(self.logs).tolist()
        self._sorted: list[float] = []  # the first `_length - 1` differences, sorted
        self._length = 1

    def _noise(self, length: int) -> float:
        """`noise(values[:length])`: the quartiles of the differences, kept sorted as the prefix grows."""
        if length < self._length or length - self._length > len(self._sorted):  # back, or far ahead: sort anew
            self._sorted, self._length = sorted(self.diffs[: max(length - 1, 0)]), max(length, 1)
        for d in self.diffs[self._length - 1 : length - 1]:
            bisect.insort(self._sorted, d)
        self._length = max(self._length, length)
        if length < 3:
            return 0.0
        return (_percentile(self._sorted, 75) - _percentile(self._sorted, 25)) / (1.349 * math.sqrt(2))

    def at(self, length: int) -> set[int]:
        """The outlier jobs of the series cut at `length`."""
        k = OUTLIER_NEIGHBOURS
        sigma = self._noise(length)
        if sigma == 0.0 or length < k + 1:
            return set()
        limit = self.limit_sigmas * sigma
        settled = length - k  # jobs before it have their k commits after them in the prefix
        found = set()
        for i in self.by_score:  # the highest scores first: few exceed the limit
            if self.scores[i] <= limit:
                break
            if k <= i < settled:
                found.add(int(i))
        for i in range(max(k, settled), length):
            left = self.left[i]
            right = left if i == length - 1 else self.logs[i] - statistics.median(self.logs[i + 1 : length].tolist())
            if abs(left) > limit and abs(right) > limit and left * right > 0:
                found.add(i)
        return found


def _percentile(ordered: list[float], q: float) -> float:
    """numpy's default (linear) percentile of an already sorted list."""
    h = (len(ordered) - 1) * q / 100
    low = int(h)
    return ordered[low] + (h - low) * (ordered[low + 1] - ordered[low]) if low + 1 < len(ordered) else ordered[low]


def change_points(
    values: Sequence[float], method: Method = DEFAULT_METHOD, set_aside: Collection[int] | None = None
) -> list[int]:
    """Indices where a new level starts (the first commit after each change), oldest first. Each outlier job
    (`outliers`, or `set_aside` where the caller has them) counts as the median of its neighbours: it moves no
    level, and the series keeps its length."""
    logs = np.log(np.asarray(values, dtype=float))
    for i in outliers(values, method) if set_aside is None else sorted(set_aside):
        logs[i] = float(
            np.median(
                np.delete(logs[max(0, i - OUTLIER_NEIGHBOURS) : i + 1 + OUTLIER_NEIGHBOURS], min(i, OUTLIER_NEIGHBOURS))
            )
        )
    return _change_points(np.exp(logs), method)


def _change_points(values: Sequence[float], method: Method) -> list[int]:
    logs = np.log(np.asarray(values, dtype=float))
    n = len(logs)
    if n < 2 * method.min_size:
        return []
    sigma = noise(values)
    if sigma == 0.0:  # constant neighbours (a deterministic counter): any difference at all is a level
        sigma = max(float(np.std(logs)), 1e-12)
    algo = _ruptures().KernelCPD(kernel=method.kernel, min_size=method.min_size).fit(logs.reshape(-1, 1))
    found = [int(b) for b in algo.predict(pen=method.penalty * sigma**2 * math.log(n))[:-1]]
    return _significant(logs, found, method.p_value)
