"""The analysis of series: their change points with states and marks, creep since the anchor, and a warning where
a series is too noisy for the smallest change that matters. What the report, the command line and the gate read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .alarms import DEFAULT_MIN_EFFECT, MIN_COMMITS, Analyses, Found
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
    # the commit of the first job, from the one that confirmed this change on, at which it measured a regression of
    # at least the smallest change that matters (`_reached`); None: it never did, or it is no confirmed regression
    reached_at: str | None = None

    @property
    def kind(self) -> str:
        return "regression" if self.change * self.direction < 0 else "improvement"

    def fails(self, min_effect: float) -> bool:
        """A confirmed, unmarked regression that measured at least the smallest change that matters at some job since
        it was confirmed (`reached_at`), and is still in effect: where a confirmed change came after it, the newest
        level is still that much worse than the level before it. Once it fails, it fails at every later job until it
        is marked or undone, however its size moves with the commits since: a job is not red, then green, then red
        again for one regression. A regression fixed since stays listed, with `now`, and no longer fails."""
        still = self.now is None or (self.now * self.direction < 0 and abs(self.now) >= min_effect)
        return (
            self.state == "confirmed"
            and self.mark is None
            and self.kind == "regression"
            and self.reached_at is not None
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
    reached = _reached(values, keep, found, series.direction, min_effect)
    # the level now: from the newest confirmed change on, what every change before it is read against (`now`)
    newest = max((f.index for f in found if f.confirmed), default=len(values))
    since = [values[i] for i in keep if i >= newest]
    current = level(since) if since else None
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
            now=current / level(before) - 1 if current is not None and f.index < newest else None,
            reached_at=points[reached[f.index]].commit_sha if f.index in reached else None,
        )
        result.changes.append(_marked(change, points, marks))
    start = next((i for i, p in enumerate(points) if p.commit_sha == anchor), 0) if anchor else 0
    result.creep = creep(values, anchor=start, min_drift=min_effect / 2, p_value=method.p_value, set_aside=set_aside)
    if sigma > min_effect:
        result.warnings.append(
            f"{series.id.label()}: its noise from commit to commit ({sigma:.1%}) is larger than the smallest change "
            f"that matters ({min_effect:.0%}): changes of that size cannot be told from noise here"
        )
    return result


def _reached(
    values: Sequence[float], keep: Sequence[int], found: Sequence[Found], direction: int, min_effect: float
) -> dict[int, int]:
    """For each confirmed change (by its index): the newest commit of the first job, from the one that confirmed it
    on, at which it measured a regression of at least `min_effect`. Its size at a job is the commits from it up to
    that job (and not past the next confirmed change) against those from the change confirmed before it, each placed
    where it was when confirmed, outlier jobs aside: read at every job as it was then, so a change that reached it
    keeps it in every later analysis."""
    logs = np.log(np.asarray(values, dtype=float))
    kept = np.zeros(len(logs))
    kept[list(keep)] = 1.0
    sums, counts = np.concatenate([[0.0], np.cumsum(logs * kept)]), np.concatenate([[0.0], np.cumsum(kept)])

    def mean(a: int, b: int) -> float | None:
        return (sums[b] - sums[a]) / (counts[b] - counts[a]) if counts[b] > counts[a] else None

    confirmed = [(f.index, f.signal) for f in found if f.signal is not None]
    signals = [signal for _, signal in confirmed]
    found_at: dict[int, int] = {}
    for n, (index, signal) in enumerate(confirmed):
        before = mean(signals[n - 1].index if n else 0, signal.index)
        end = signals[n + 1].index if n + 1 < len(signals) else len(logs)
        for length in range(signal.length, len(logs) + 1):
            after = mean(signal.index, min(length, end))
            if before is not None and after is not None and -direction * math.expm1(after - before) >= min_effect:
                found_at[index] = length - 1
                break
            if length >= end:  # the commits after the next confirmed change are not this change's
                break
    return found_at


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
