"""The analysis of series: their change points with states and marks, creep since the anchor, and a warning where
a series is too noisy for the smallest change that matters. What the report, the command line and the gate read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .alarms import DEFAULT_MIN_EFFECT, MIN_COMMITS, Analyses
from .creep import Creep, creep
from .detect import DEFAULT_METHOD, Method, noise, outliers, two_sample_p
from .records import Mark
from .series import Series

MAX_COMMITS = 200  # the newest commits of a series analysed
MARK_REACH = 2  # commits a change may move between analyses and keep its mark


@dataclass(frozen=True)
class Change:
    series_key: str
    label: str
    index: int  # into the analysed points: the first commit of the new level
    last_good: str
    first_bad: str
    before: float  # the segment's level before and after (geometric means)
    after: float
    change: float  # after / before - 1
    direction: int
    state: str  # provisional | confirmed
    commits_after: int
    p_value: float
    mark: str | None = None  # expected | false_positive, a person's word
    env_changed: bool = False  # the software fingerprint differs across the change
    machine_changed: bool = False  # the hardware fingerprint differs across the change
    # the newest level (from the newest confirmed change on) against `before`, - 1, where a confirmed change came
    # after this one; None where this change's own level is the newest
    now: float | None = None

    @property
    def kind(self) -> str:
        return "regression" if self.change * self.direction < 0 else "improvement"

    def fails(self, min_effect: float) -> bool:
        """A confirmed, unmarked regression at least the smallest change that matters, and still in effect: where a
        confirmed change came after it, the newest level is still that much worse than the level before it. A
        regression fixed since (the series back at its level) no longer fails: it stays listed, with `now`."""
        still = self.now is None or (self.now * self.direction < 0 and abs(self.now) >= min_effect)
        return (
            self.state == "confirmed"
            and self.mark is None
            and self.kind == "regression"
            and abs(self.change) >= min_effect
            and still
        )


@dataclass
class SeriesAnalysis:
    series: Series
    first: int  # index of the first analysed point in series.points
    points: list[int]  # change point indices into series.points
    changes: list[Change]
    outliers: list[int]  # indices into series.points
    noise: float
    creep: Creep | None = None
    warnings: list[str] = field(default_factory=list)


def level(values: Sequence[float]) -> float:
    """A segment's level: the geometric mean of its values."""
    return float(math.exp(np.mean(np.log(values))))


def analyze_series(
    series: Series,
    *,
    method: Method = DEFAULT_METHOD,
    min_effect: float = DEFAULT_MIN_EFFECT,
    anchor: str | None = None,
    marks: Sequence[Mark] = (),
) -> SeriesAnalysis:
    first = max(0, len(series.points) - MAX_COMMITS)
    points = series.points[first:]
    values = [p.value for p in points]
    if not all(math.isfinite(v) and v > 0 for v in values):  # the analysis works on logs: on ratios of values
        result = SeriesAnalysis(series, first, [], [], [], float("nan"))
        result.warnings.append(
            f"{series.id.label()}: holds values that are zero, negative or not finite: not analysed (changes are "
            "found as ratios)"
        )
        return result
    sigma = noise(values)
    result = SeriesAnalysis(series, first, [], [], [], sigma)
    if len(values) < MIN_COMMITS:
        return result
    analyses = Analyses(values, method, min_effect)
    found = analyses.found()
    set_aside = outliers(values, method)
    result.outliers = [first + i for i in set_aside]
    result.points = [first + f.index for f in found]
    edges = [0, *[f.index for f in found], len(values)]
    keep = [i for i in range(len(values)) if i not in set(set_aside)]
    for n, f in enumerate(found):
        before = [values[i] for i in keep if edges[n] <= i < edges[n + 1]]
        after = [values[i] for i in keep if edges[n + 1] <= i < edges[n + 2]]
        lo, hi = points[f.index - 1], points[f.index]
        change = Change(
            series.key,
            series.id.label(),
            first + f.index,
            lo.commit_sha,
            hi.commit_sha,
            level(before),
            level(after),
            level(after) / level(before) - 1,
            series.direction,
            "confirmed" if f.confirmed else "provisional",
            f.commits_after,
            two_sample_p(np.log(before), np.log(after)),
            env_changed=lo.env_fp != hi.env_fp,
            machine_changed=lo.machine_fp != hi.machine_fp,
        )
        result.changes.append(_marked(change, points, marks))
    _since_newest_confirmed(result.changes, [values[i] for i in keep], keep, first)
    start = next((i for i, p in enumerate(points) if p.commit_sha == anchor), 0) if anchor else 0
    result.creep = creep(values, anchor=start, min_drift=min_effect / 2, p_value=method.p_value, set_aside=set_aside)
    if sigma > min_effect:
        result.warnings.append(
            f"{series.id.label()}: its noise from commit to commit ({sigma:.1%}) is larger than the smallest change "
            f"that matters ({min_effect:.0%}): changes of that size cannot be told from noise here"
        )
    return result


def _since_newest_confirmed(changes: list[Change], kept: Sequence[float], at: Sequence[int], first: int) -> None:
    """Set `now` on each change that a confirmed change came after: the level of the commits from the newest
    confirmed change on (outliers aside: `kept` at indices `at`) against the change's level before."""
    newest = max((c.index for c in changes if c.state == "confirmed"), default=None)
    if newest is None:
        return
    since = [v for v, i in zip(kept, at) if first + i >= newest]
    if not since:
        return
    current = level(since)
    for n, change in enumerate(changes):
        if change.index < newest:
            changes[n] = Change(**{**change.__dict__, "now": current / change.before - 1})


def _marked(change: Change, points: Sequence, marks: Sequence[Mark]) -> Change:
    """The change with the mark a person put on it, or on a change of the same series within MARK_REACH commits."""
    index = {p.commit_sha: i for i, p in enumerate(points)}
    for mark in marks:
        near = mark.commit_sha in index and abs(index[mark.commit_sha] - index[change.first_bad]) <= MARK_REACH
        if mark.series_key == change.series_key and near:
            return Change(**{**change.__dict__, "mark": mark.state})
    return change


def analyze(
    series: Mapping[str, Series],
    *,
    method: Method = DEFAULT_METHOD,
    min_effect: float = DEFAULT_MIN_EFFECT,
    anchor: str | None = None,
    marks: Sequence[Mark] = (),
) -> list[SeriesAnalysis]:
    """Every series, in a stable order (by label)."""
    return [
        analyze_series(s, method=method, min_effect=min_effect, anchor=anchor, marks=marks)
        for s in sorted(series.values(), key=lambda s: s.id.label())
    ]
