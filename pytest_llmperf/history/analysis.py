"""The analysis of series: their change points with states and marks, creep since the anchor, and a warning where
a series is too noisy for the smallest change that matters; and the events that group the changes of many series at
one place. What the report, the command line and the gate read.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .alarms import (
    DEFAULT_MIN_EFFECT,
    MIN_COMMITS,
    Analyses,
    Found,
    checkpoint_lengths,
    checkpoint_valid,
    checkpoint_written,
    resolution,
)
from .detect import DEFAULT_METHOD, Method, noise, outliers, two_sample_p
from .records import Mark
from .series import Series

MARK_REACH = 2  # commits a change may move between analyses and keep its mark
STEP_NOT_CREEP = 2  # a confirmed change this many times the smallest change that matters is left out of creep


@dataclass(frozen=True)
class Change:
    series_key: str
    label: str
    index: int  # into the series' points: the first commit of the new level
    last_good: str
    first_bad: str
    # the level before and after (medians of the commits, outlier jobs aside): a provisional change's two segments
    # between its neighbouring change points; a confirmed change's level it was confirmed against, and its commits
    # since up to the next change point (at least those it was confirmed with)
    before: float
    after: float
    change: float  # after / before - 1
    direction: int
    state: str  # provisional | confirmed
    commits_after: int
    p_value: float
    mark: str | None = None  # expected | false_positive, a person's word
    env_changed: bool = False  # the software fingerprint differs across the change
    machine_changed: bool = False  # the hardware fingerprint differs across the change
    # where a confirmed change came after this one: the part of it still in effect (`in_effect`), as after / before
    # - 1; None where no confirmed change came after it
    now: float | None = None
    # the commit of the first job, from the one that confirmed this change on, at which it measured a regression of
    # at least the smallest change that matters (`_reached`); None: it never did, or it is no confirmed regression
    reached_at: str | None = None
    # the smallest change the series' noise resolves between the two segments (alarms.resolution), relative
    resolution: float = 0.0
    order: int = 0  # the first bad commit's place among all commits (series.Point.order): events group by it

    @property
    def kind(self) -> str:
        return "regression" if self.change * self.direction < 0 else "improvement"

    @property
    def id(self) -> str:
        return f"{self.series_key}@{self.first_bad[:12]}"

    def fails(self, min_effect: float) -> bool:
        """A confirmed, unmarked regression that measured at least the smallest change that matters at some job since
        it was confirmed (`reached_at`), larger than what the series' noise resolves, and still in effect: where a
        confirmed change came after it, what of it is not undone is still that large. Once it fails, it fails at
        every later job until it is marked or undone, however its size moves with the commits since: a job is not
        red, then green, then red again for one regression. A regression fixed since stays listed, with `now`, and
        no longer fails."""
        still = self.now is None or (self.now * self.direction < 0 and abs(self.now) >= min_effect)
        return (
            self.state == "confirmed"
            and self.mark is None
            and self.kind == "regression"
            and self.reached_at is not None
            and abs(self.change) >= self.resolution
            and still
        )


@dataclass
class SeriesAnalysis:
    series: Series
    points: list[int]  # change point indices into series.points
    changes: list[Change]
    outliers: list[int]  # indices into series.points
    noise: float
    creep: Creep | None = None
    warnings: list[str] = field(default_factory=list)
    set_aside: list[int] = field(default_factory=list)  # points whose value is zero, negative or not finite
    analysed: list[int] = field(default_factory=list)  # the indices into series.points of the values analysed
    checkpoint: str | None = None  # where the next analysis may go on from (history/alarms.py), to keep


def level(values: Sequence[float]) -> float:
    """A segment's level: the median of its values (in logs; a median is one of them, or between two)."""
    return float(math.exp(np.median(np.log(values))))


def in_effect(sizes: Sequence[float]) -> list[float]:
    """For confirmed changes of sizes `sizes` (logs, oldest first), the part of each still in effect after the ones
    since: a change the other way undoes the newest changes it meets first, and only as much as they moved. A change
    the same way adds nothing to an earlier one (it is its own alarm), so one huge step never reads as part of the
    changes before it."""
    remaining = list(sizes)
    open_: list[int] = []  # changes not wholly undone, newest last
    for i, size in enumerate(sizes):
        left = size
        while open_ and left and (remaining[open_[-1]] > 0) != (left > 0):
            top = open_[-1]
            if abs(left) >= abs(remaining[top]):
                left += remaining[top]
                remaining[top] = 0.0
                open_.pop()
            else:
                remaining[top] += left
                left = 0.0
        remaining[i] = left
        if left:
            open_.append(i)
    return remaining


def analyze_series(
    series: Series,
    *,
    method: Method = DEFAULT_METHOD,
    min_effect: float = DEFAULT_MIN_EFFECT,
    anchor: str | None = None,
    marks: Sequence[Mark] = (),
    resume_from: str | None = None,
) -> SeriesAnalysis:
    """Every commit of the series (its whole history). A value that is zero, negative or not finite (a broken job)
    is set aside with a warning, and the series analysed without it: changes are found as ratios of values.
    `resume_from`: the series' checkpoint (history/alarms.py): its sequential read goes on from where an
    earlier analysis of the same first values stopped; the same analysis either way."""
    analysed = [i for i, p in enumerate(series.points) if math.isfinite(p.value) and p.value > 0]
    points = [series.points[i] for i in analysed]
    values = [p.value for p in points]
    bad = sorted(set(range(len(series.points))) - set(analysed))
    sigma = noise(values)
    result = SeriesAnalysis(series, [], [], [], sigma, set_aside=bad, analysed=analysed)
    if bad:
        shas = ", ".join(series.points[i].commit_sha[:12] for i in bad[:3]) + (", ..." if len(bad) > 3 else "")
        result.warnings.append(
            f"{series.id.label()}: {len(bad)} job(s) with a value that is zero, negative or not finite ({shas}): "
            "set aside, the rest analysed"
        )
    if len(values) < MIN_COMMITS:
        return result
    kept = checkpoint_valid(resume_from, values, method, min_effect)
    analyses = Analyses(
        values, method, min_effect, kept[-1]["state"] if kept else None, checkpoint_lengths(len(values))
    )
    result.checkpoint = checkpoint_written(kept, analyses.snapshots, values, method, min_effect)
    found = analyses.found()
    set_aside = outliers(values, method)
    result.outliers = [analysed[i] for i in set_aside]
    result.points = [analysed[f.index] for f in found]
    edges = [0, *[f.index for f in found], len(values)]
    keep = sorted(set(range(len(values))) - set(set_aside))
    reached = _reached(values, keep, found, series.direction, min_effect)
    confirmed = [n for n, f in enumerate(found) if f.confirmed]
    segments = [
        (
            [values[i] for i in keep if edges[n] <= i < edges[n + 1]],
            [values[i] for i in keep if edges[n + 1] <= i < edges[n + 2]],
        )
        for n in range(len(found))
    ]
    # a provisional change is read between its neighbouring change points; a confirmed one against the level it was
    # confirmed with (alarms.Signal), which later commits do not move, its commits since up to the next change point
    # but at least those it was confirmed with: a change point found later among them does not shrink it
    levels = []
    for n, f in enumerate(found):
        if f.signal is None:
            levels.append((math.log(level(segments[n][0])), math.log(level(segments[n][1]))))
            continue
        end = max(edges[n + 2], f.signal.length)
        since = [values[i] for i in keep if f.index <= i < end]
        levels.append((f.signal.before, math.log(level(since)) if since else f.signal.after))
    sizes = [after - before for before, after in levels]
    remaining = dict(zip(confirmed, in_effect([sizes[n] for n in confirmed])))
    for n, f in enumerate(found):
        before, after = segments[n]
        lo, hi = points[f.index - 1], points[f.index]
        later = any(m > n for m in confirmed)
        change = Change(
            series.key,
            series.id.label(),
            analysed[f.index],
            lo.commit_sha,
            hi.commit_sha,
            math.exp(levels[n][0]),
            math.exp(levels[n][1]),
            math.expm1(sizes[n]),
            series.direction,
            "confirmed" if f.confirmed else "provisional",
            f.commits_after,
            two_sample_p(np.log(before), np.log(after)),
            env_changed=lo.env_fp != hi.env_fp,
            machine_changed=lo.machine_fp != hi.machine_fp,
            now=math.expm1(remaining[n]) if n in remaining and later else None,
            reached_at=points[reached[f.index]].commit_sha if f.index in reached else None,
            resolution=math.expm1(resolution(sigma, len(before), len(after), method.p_value)),
            order=hi.order,
        )
        result.changes.append(_marked(change, points, marks))
    start = next((i for i, p in enumerate(points) if p.commit_sha == anchor), 0) if anchor else 0
    # the drift the confirmed steps do not explain: a change of at least twice the smallest change that matters is
    # a step, an alarm of its own, not creep (one huge step would otherwise read as creep of that size); smaller
    # confirmed changes are often a few small steps merged, which is what creep reports
    logs = np.log(np.asarray(values, dtype=float))
    for n in confirmed:
        if abs(math.expm1(sizes[n])) >= STEP_NOT_CREEP * min_effect:
            logs[found[n].index :] -= sizes[n]
    result.creep = creep(
        np.exp(logs), anchor=start, min_drift=min_effect / 2, p_value=method.p_value, set_aside=set_aside
    )
    if sigma > min_effect:
        result.warnings.append(
            f"{series.id.label()}: its noise from commit to commit ({sigma:.1%}) is larger than the smallest change "
            f"that matters ({min_effect:.0%}): a change of that size is confirmed only once enough commits on each "
            "side resolve it"
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
    if not any(mark.series_key == change.series_key for mark in marks):
        return change
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
    checkpoints: Mapping[str, str] | None = None,
) -> list[SeriesAnalysis]:
    """Every series, in a stable order (by label); `checkpoints`: by series key (`analyze_series`)."""
    kept = checkpoints or {}
    return [
        analyze_series(s, method=method, min_effect=min_effect, anchor=anchor, marks=marks, resume_from=kept.get(s.key))
        for s in sorted(series.values(), key=lambda s: s.id.label())
    ]


# Creep: how far a series has drifted since an anchor (a release tag's commit, or the oldest commit analysed).
#
# Small steps of a few percent each merge into one or two change points, or none, yet add up. So the drift is
# measured apart from where change points fall: the level at the anchor is the mean (of the logarithms) of the
# `WINDOW` commits from the anchor on, the level now that of the newest `WINDOW` commits, outlier jobs set aside. It
# is flagged when Mann-Whitney's test of the two windows gives p < the method's p_value and the drift is at least
# `min_drift`: half the smallest change that matters (llmperf_history_min_effect), since the drift is read from 15
# commits a side and scatters by about +-2% at 3% noise (a 6% drift read against a 5% line would be missed one time
# in four; docs/history.md).
WINDOW = 15  # commits at each end


@dataclass(frozen=True)
class Creep:
    anchor: int  # index of the anchor commit
    first: tuple[int, int]  # [start, end) of the anchor's window
    last: tuple[int, int]  # [start, end) of the newest window
    drift: float  # relative: level now / level at the anchor - 1
    p_value: float
    flagged: bool


def creep(
    values: Sequence[float],
    *,
    anchor: int = 0,
    min_drift: float,
    p_value: float,
    set_aside: Collection[int] = (),
    window: int = WINDOW,
) -> Creep | None:
    """The drift since `anchor`, or None when the series since it is too short for two windows."""
    n = len(values)
    if n - anchor < 2 * window:
        return None
    logs = np.log(np.asarray(values, dtype=float))
    first_span, last_span = (anchor, anchor + window), (n - window, n)
    first = np.array([logs[i] for i in range(*first_span) if i not in set_aside])
    last = np.array([logs[i] for i in range(*last_span) if i not in set_aside])
    drift = math.exp(float(np.mean(last) - np.mean(first))) - 1
    p = two_sample_p(first, last)
    return Creep(anchor, first_span, last_span, drift, p, abs(drift) >= min_drift and p < p_value)


# Events: the changes of many series at one place, reported, failed on and marked as one.
#
# A cause moves every series it touches at the same commit: a runner image or host, a dependency, a change of the
# engine itself. Change points of the series of one target and machine class that start within `SPREAD` commits of
# each other (in the commits' common order, `Point.order`) are one event, with the series it moved and the spread of
# their sizes. An event that moves most of the series measured across it, the same way, says so: on real CI data
# that is the runner or its environment more often than the code (docs/history.md, "Real histories"), besides what
# the fingerprints say (`env_changed`, `machine_changed`), which CI data often lack (a hosted runner's fingerprint can
# stay equal while its host changes).
#
# An event is confirmed when one of its changes is, a regression when its confirmed changes (else all of them) are
# regressions, an improvement when none is, mixed otherwise; it fails when one of its changes fails
# (`Change.fails`). `--llmperf-history-check=fail` and `analyze --fail` count events, not series.
SPREAD = 2  # commits between the first and the last change of one event
SHARED = 0.5  # an event moving more than this share of the series measured across it, alike, moves the machine
MIN_SHARED = 3  # and at least this many series
ALIKE = 0.75  # of its changes, at least this share the same way


@dataclass(frozen=True)
class Event:
    target: str
    machine: str
    changes: tuple[Change, ...]  # one per series it moved, by series label
    series_total: int  # the series of this target and machine measured before and after it
    min_effect: float

    @property
    def id(self) -> str:
        """`EVENT:<machine class hash>@<first bad commit>`, for `pytest-llmperf history mark`."""
        machine = hashlib.sha256(f"{self.target}\0{self.machine}".encode()).hexdigest()[:8]
        return f"EVENT:{machine}@{self.first_bad[:12]}"

    @property
    def state(self) -> str:
        return "confirmed" if any(c.state == "confirmed" for c in self.changes) else "provisional"

    def _deciding(self) -> list[Change]:
        confirmed = [c for c in self.changes if c.state == "confirmed"]
        return confirmed or list(self.changes)

    @property
    def kind(self) -> str:
        kinds = {c.kind for c in self._deciding()}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def last_good(self) -> str:
        """The earliest last good commit of its changes."""
        return min(self.changes, key=lambda c: (c.order, c.label)).last_good

    @property
    def first_bad(self) -> str:
        """The latest first bad commit of its changes."""
        return max(self.changes, key=lambda c: (c.order, c.label)).first_bad

    @property
    def sizes(self) -> tuple[float, float]:
        sizes = [c.change for c in self._deciding()]
        return min(sizes), max(sizes)

    @property
    def shared(self) -> bool:
        """Most series measured across it moved, and alike: the runner or its environment, more likely than code."""
        deciding = self._deciding()
        ups = sum(c.change > 0 for c in deciding)
        alike = max(ups, len(deciding) - ups) >= ALIKE * len(deciding)
        moved = len(self.changes)
        return moved >= MIN_SHARED and moved > SHARED * self.series_total and alike

    @property
    def fails(self) -> bool:
        return any(c.fails(self.min_effect) for c in self.changes)

    @property
    def mark(self) -> str | None:
        """A mark every change of it carries (marking the event marks them all)."""
        marks = {c.mark for c in self.changes}
        return marks.pop() if len(marks) == 1 else None

    @property
    def changed_there(self) -> list[str]:
        return [
            what
            for what, on in (
                ("environment", any(c.env_changed for c in self.changes)),
                ("machine", any(c.machine_changed for c in self.changes)),
            )
            if on
        ]

    def describe(self) -> str:
        """`+11.2% to +19.0% in 58 of 65 series`, and what it likely is."""
        low, high = self.sizes
        size = f"{low:+.1%}" if len(self._deciding()) == 1 else f"{low:+.1%} to {high:+.1%}"
        text = f"{size} in {len(self.changes)} of {self.series_total} series"
        if self.shared:
            text += ", most of this machine's series alike: likely the runner or its environment"
        if self.changed_there:
            text += f" ({' and '.join(self.changed_there)} changed there)"
        return text


def events(analyses: Sequence[SeriesAnalysis], min_effect: float) -> list[Event]:
    """The changes of `analyses` grouped into events, per target and machine class; confirmed first, then by the
    number of series moved."""
    groups: dict[tuple[str, str], list[SeriesAnalysis]] = defaultdict(list)
    for a in analyses:
        groups[(a.series.id.target, a.series.id.machine)].append(a)
    found = []
    for (target, machine), members in groups.items():
        cluster: list[Change] = []
        for change in sorted((c for a in members for c in a.changes), key=lambda c: (c.order, c.label)):
            if cluster and change.order - cluster[0].order > SPREAD:
                found.append(_event(target, machine, cluster, members, min_effect))
                cluster = []
            cluster.append(change)
        if cluster:
            found.append(_event(target, machine, cluster, members, min_effect))
    return sorted(found, key=lambda e: (e.state != "confirmed", -len(e.changes), e.first_bad))


def _event(
    target: str, machine: str, cluster: list[Change], members: Sequence[SeriesAnalysis], min_effect: float
) -> Event:
    first, last = cluster[0].order, cluster[-1].order
    total = sum(bool(a.series.points) and a.series.points[0].order < first and a.series.points[-1].order >= last
                for a in members)  # fmt: skip
    by_series: dict[str, Change] = {}
    for change in cluster:  # one change a series: its confirmed one, else its first
        held = by_series.get(change.series_key)
        if held is None or (change.state == "confirmed" and held.state != "confirmed"):
            by_series[change.series_key] = change
    changes = tuple(sorted(by_series.values(), key=lambda c: c.label))
    return Event(target, machine, changes, max(total, len(changes)), min_effect)
