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

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

EXTRA_HINT = "pip install 'pytest-llmperf[history]'"


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
    """Two-sided p of Mann-Whitney's U test of two segments (exact for small ones); 1.0 where a side is empty."""
    from scipy.stats import mannwhitneyu

    if len(before) == 0 or len(after) == 0:
        return 1.0
    p = float(mannwhitneyu(before, after, alternative="two-sided").pvalue)
    return p if math.isfinite(p) else 1.0


def _significant(logs: np.ndarray, points: list[int], p_value: float) -> list[int]:
    """Drop the weakest change point while any has p >= p_value over its neighbouring segments."""
    points = list(points)
    while points:
        edges = [0, *points, len(logs)]
        ps = [
            two_sample_p(logs[edges[i] : edges[i + 1]], logs[edges[i + 1] : edges[i + 2]]) for i in range(len(points))
        ]
        weakest = int(np.argmax(ps))
        if ps[weakest] < p_value:
            break
        del points[weakest]
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
