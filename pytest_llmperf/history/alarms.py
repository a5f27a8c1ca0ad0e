"""When a change point is an alarm: `provisional` when found (detect.py), `confirmed` once Page's cumulative sum
(CUSUM), read over the series commit by commit, says the level moved by at least half the smallest change that
matters.

A job analyses its series at every commit, so a rule tried on each analysis is tried a hundred times in a hundred
commits, and a change that noise puts near the newest commits, confirmed once, is a false alarm a user saw. The
confirmation is therefore sequential, as a control chart's: the series is read from its oldest commit on and each
commit is compared with the level of the commits before it (`signals`):
- the level is the commits from its start up to `confirm_guard` commits before this one, outlier jobs aside, at
  least `confirm_level` of them (`confirm_level_after_change` where it starts at a confirmed change): the newest
  commits, which may already be a new level, do not dilute the level they are compared with;
- the commit's distance from the level's mean, in the level's standard deviations, is Student's t with as many
  degrees of freedom as the level has commits less one; taken to the normal quantile of the same probability it is
  an N(0, 1) draw however short the level (Hawkins' self-starting CUSUM, 1987);
- two sums, one a side, add it less the reference (half the smallest change that matters, `min_effect`, in the
  level's deviations) and restart at 0 when they fall below it (Page, 1954). A commit counts as at most `CLIP`
  deviations away, and a job found to be an outlier once the commits after it are in is taken out of
  the sum: one slow job is not a level;
- a sum that reaches Page's decision interval (`decision_interval`, for `confirm_run_length` commits between false
  alarms a side) at least `confirm_after` commits after it left 0 confirms a change there, placed at the nearest
  change point of detect.py, which sees the commits on both sides (`_placed`); the level starts again at it.
  Where detect.py finds a change inside the level, the level was not one: the sum's commits are read again against
  the level after that change, else the commits from it on against the level before it (`_Sums._judge`). A change
  with fewer than `confirm_level` commits before it stays provisional.
A change smaller than half of `min_effect` is not confirmed (the median of the commits from it on must differ from
the level's by that much when it is; it stays provisional, and creep reports a drift of that size), so noise in a
quiet series, where a significant change can be tiny, confirms nothing; nor is one smaller than what the series'
noise resolves at the commits seen (`resolution`). Those two medians are the size the change keeps (`Signal`).

A commit's verdict reads only the commits up to it, so a change confirmed at a commit stays confirmed in every later
analysis, and the same store always gives the same states; where it starts is the change point of detect.py within
`SAME_POINT` commits of where it was confirmed, placed again with the commits since.

Below the rule: the thresholds it reads against (`decision_interval`, `standard_normal`, `resolution`), and the
checkpoint, where a series' read stopped, for the next job to go on from.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, astuple, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from . import detect
from .detect import DEFAULT_METHOD, OUTLIER_NEIGHBOURS, Method, PrefixOutliers, change_points

SAME_POINT = 4  # commits between a change point of detect.py and a confirmed change that make them the same change
#: Series shorter than this are not analysed: too few commits to tell a level from noise.
MIN_COMMITS = 8
DEFAULT_MIN_EFFECT = 0.05  # the smallest change that matters: the A/B gate's tolerance
#: Deviations from the level a commit counts as at most, so that one slow job does not reach the decision interval
#: (a +30% job at 3% noise is 10 deviations away: it adds 1.7 to a sum that must reach 4.1), and the least such a
#: commit adds where the reference is beyond it (a quiet series: there the commits a confirmation needs,
#: `confirm_after`, hold a slow job off).
CLIP, MIN_STEP = 2.5, 1.0
_NOT_YET = -1  # a sum's verdict: too few commits from where its change starts, or too small a change, yet


@dataclass(frozen=True)
class Signal:
    """A change confirmed by the cumulative sum."""

    index: int  # the first commit of the new level, as placed when it was confirmed (`_Sums._placed`)
    length: int  # the series' length when the sum reached the decision interval (the confirming commit + 1)
    before: float = 0.0  # the medians (in logs) of the level it was compared with and of the commits since
    after: float = 0.0


@dataclass(frozen=True)
class Found:
    index: int  # the first commit of the new level
    confirmed: bool
    commits_after: int  # commits measured from the change on (it included)
    signal: Signal | None = None  # what confirmed it (where it was placed then, and when): None while provisional


_EQUAL = 1e-9  # a level whose deviation (in logs) is below this has none: a deterministic counter's repeated value


class Logs:
    """A series' logarithms, centred on its first (a constant series' sums are then exactly 0), with running sums
    of them and of their squares: a level's mean and deviation at a constant cost."""

    def __init__(self, values: Sequence[float]) -> None:
        self.values = np.log(np.asarray(values, dtype=float))
        self.origin = float(self.values[0]) if len(self.values) else 0.0
        self.centred = (self.values - self.origin).tolist()
        self.sums = np.concatenate([[0.0], np.cumsum(self.centred)]).tolist()
        self.squares = np.concatenate([[0.0], np.cumsum(np.square(self.centred))]).tolist()

    def __getitem__(self, index: int) -> float:
        return self.origin + self.centred[index]

    def __len__(self) -> int:
        return len(self.centred)


@dataclass(frozen=True)
class _Level:
    """The commits a commit is compared with, outlier jobs aside: their mean and deviation, in logs."""

    mean: float
    spread: float
    size: int
    start: int = 0  # the commits [start, end) it holds, outlier jobs aside
    end: int = 0

    @classmethod
    def of(cls, logs: Logs, start: int, end: int, aside: set[int]) -> _Level:
        """From the running sums, less the outlier jobs among [start, end): a constant cost, however long."""
        inside = [logs.centred[j] for j in aside if start <= j < end]
        size = end - start - len(inside)
        if size <= 0:
            return cls(0.0, 0.0, 0, start, end)
        total = logs.sums[end] - logs.sums[start] - sum(inside)
        squares = logs.squares[end] - logs.squares[start] - sum(x * x for x in inside)
        mean = total / size
        variance = (squares - size * mean * mean) / (size - 1) if size > 1 else 0.0
        spread = math.sqrt(variance) if variance > _EQUAL**2 else 0.0
        return cls(logs.origin + mean, spread, size, start, end)

    def step(self, value: float, side: int, reference: float) -> float:
        """What a commit adds to a side's sum, in the level's deviations: its distance as an N(0, 1) draw, at most
        `CLIP`, less the reference. Without spread (a deterministic counter): a commit at least the reference away
        adds `MIN_STEP`, any other ends the sum."""
        distance = side * (value - self.mean)
        if self.spread == 0.0:
            return MIN_STEP if distance >= reference else -math.inf
        z = standard_normal(distance / (self.spread * math.sqrt(1 + 1 / self.size)), self.size - 1)
        k = reference / self.spread
        return min(z - k, max(CLIP - k, MIN_STEP))

    def interval(self, reference: float, run_length: float) -> float:
        """Page's decision interval, in the level's deviations (0 without spread)."""
        if self.spread == 0.0:
            return 0.0
        # rounded: h moves slowly with the reference, and a series' commits then share decision_interval's cache
        return decision_interval(round(reference / self.spread, 3), run_length)


def signals(
    values: Sequence[float], method: Method = DEFAULT_METHOD, min_effect: float = DEFAULT_MIN_EFFECT
) -> list[Signal]:
    """The changes the cumulative sum confirms, oldest first, reading the series one commit at a time (module
    docstring). Each is decided by the commits up to its `length`: the list for a series cut at any length is this
    list's head."""
    return _Sums(values, method, min_effect, Prefixes(values, method)).read()


class Prefixes:
    """detect.py's change points of the series cut at a length, each computed once (the sequential read and the
    analysis ask for the same lengths)."""

    def __init__(self, values: Sequence[float], method: Method) -> None:
        self.values, self.method = list(values), method
        self.outliers = PrefixOutliers(self.values, method)
        self._done: dict[int, list[int]] = {}

    def at(self, length: int) -> list[int]:
        if length not in self._done:
            cut, aside = self.values[:length], self.outliers.at(length)
            self._done[length] = change_points(cut, self.method, aside) if length >= MIN_COMMITS else []
        return self._done[length]


class _Sums:
    """Page's two sums over a series read commit by commit, and the level they are read against."""

    def __init__(self, values: Sequence[float], method: Method, min_effect: float, prefixes: Prefixes) -> None:
        self.values, self.method, self.prefixes = list(values), method, prefixes
        self.outliers = PrefixOutliers(self.values, method)  # its own: asked in increasing order
        self.logs = Logs(self.values)
        self.reference = math.log1p(min_effect) / 2  # a commit's allowance, in logs: half the smallest change
        self.start, self.needed = 0, method.confirm_level  # the level's first commit, and the commits it needs
        self.trails: dict[int, list[tuple[int, float]]] = {1: [], -1: []}  # (commit, what it adds) since left 0
        # per side: the outlier jobs among its trail, and the sum and its commits read over the trail without them
        self.held: dict[int, tuple[frozenset[int], float, list[int]]] = {}
        # per side: where a sum that reached the decision interval was placed, and the level it was measured
        # against, while the commits since were too few or too close to it: judged again once they are not
        self.waiting: dict[int, tuple[int, int, _Level]] = {}
        self.sized = (0.0, 0.0)  # the medians a change was confirmed with (`_sized`)
        self.found: list[Signal] = []  # what `read` confirmed
        self.snapshots: list[dict[str, Any]] = []  # taken at the lengths `read` was asked to keep

    def read(self, state: Mapping[str, Any] | None = None, keep: Collection[int] = ()) -> list[Signal]:
        """The signals; from `state` on (a `snapshot` after the same first commits: a commit's verdict reads only
        the commits up to it, so going on from it is exact). `keep`: the lengths to take a `snapshot` at."""
        self.found, first = self._restore(state) if state else ([], 0)
        for now in range(first, len(self.logs)):
            self._commit(now)
            if now + 1 in keep:
                self.snapshots.append(self.snapshot(now + 1))
        return self.found

    def _commit(self, now: int) -> None:
        """Read commit `now` against the level, on each side."""
        end = now - self.method.confirm_guard
        if end - self.start < self.needed:
            return
        aside = self.outliers.at(now + 1)
        level = _Level.of(self.logs, self.start, end, aside)
        for side in (1, -1):
            summed = self._add(side, now, level, aside)
            if summed is None:
                self.waiting.pop(side, None)
                continue
            if self._still_waiting(side, summed[0], now, aside):
                continue
            confirmed = self._judge(now, end, aside, summed, side)
            if confirmed == _NOT_YET:
                continue
            if confirmed is not None:
                self.found.append(Signal(confirmed, now + 1, *self.sized))
                self.start, self.needed = confirmed, self.method.confirm_level_after_change
            self.trails, self.held, self.waiting = {1: [], -1: []}, {}, {}
            return

    def snapshot(self, length: int) -> dict[str, Any]:
        """What the read holds after its first `length` commits, as JSON (floats as repr: read back the same)."""
        return {
            "length": length,
            "signals": [astuple(s) for s in self.found],
            "start": self.start,
            "needed": self.needed,
            "trails": {str(side): list(trail) for side, trail in self.trails.items()},
            "held": {str(side): [sorted(aside), total, list(held)] for side, (aside, total, held) in self.held.items()},
            "waiting": {str(side): [left, at, astuple(level)] for side, (left, at, level) in self.waiting.items()},
            "sized": list(self.sized),
        }

    def _restore(self, state: Mapping[str, Any]) -> tuple[list[Signal], int]:
        self.start, self.needed, self.sized = state["start"], state["needed"], tuple(state["sized"])
        self.trails = {int(side): [(j, x) for j, x in trail] for side, trail in state["trails"].items()}
        self.held = {int(side): (frozenset(a), total, list(b)) for side, (a, total, b) in state["held"].items()}
        self.waiting = {int(side): (left, at, _Level(*level)) for side, (left, at, level) in state["waiting"].items()}
        return [Signal(*s) for s in state["signals"]], state["length"]

    def _add(self, side: int, now: int, level: _Level, aside: set[int]) -> list[int] | None:
        """Add commit `now` to a side's sum: the commits the sum holds where it reaches the decision interval."""
        trail = self.trails[side]
        step = level.step(self.logs[now], side, self.reference)
        trail.append((now, step))
        inside = frozenset(j for j in aside if j >= trail[0][0])
        held = self.held.get(side)
        if held is not None and held[0] == inside - {now}:  # no outlier found among the trail since: one more step
            total, summed = held[1], held[2]
            if now not in aside:
                total = max(0.0, total + step)
                if total > 0.0:
                    summed.append(now)
                else:
                    summed = []
        else:  # outlier jobs found since leave the sum: read it again without them
            total, summed = _page([(j, x) for j, x in trail if j not in aside])
        self.held[side] = (inside, total, summed)
        # what came before the sum last left 0 no longer counts, once no newer commit can make it an outlier
        keep = min(summed[0] if summed else now + 1, now + 1 - OUTLIER_NEIGHBOURS)
        if trail[0][0] < keep:
            trail[:] = [(j, x) for j, x in trail if j >= keep]
            self.held[side] = (frozenset(j for j in inside if j >= keep), total, summed)
        return summed if self._reaches(total, summed, level) else None

    def _reaches(self, total: float, summed: list[int], level: _Level) -> bool:
        interval = level.interval(self.reference, self.method.confirm_run_length)
        return total > 0.0 and total >= interval and len(summed) >= self.method.confirm_after

    def _judge(self, now: int, end: int, aside: set[int], summed: list[int], side: int) -> int | None:
        """Where the change a sum found starts, or None where it is not confirmed (the level then starts again at
        it, and it stays provisional). Where detect.py finds a change q inside the level, the level was not one:
        the sum's commits are read again against the level after q (a change after it), else the commits from q on
        against the level before it (q itself)."""
        points = self.prefixes.at(now + 1)
        placed = self._placed(summed[0], points)
        if now + 1 - placed < self.method.confirm_after:  # too few commits from where the change starts: not yet
            return _NOT_YET
        inside = [p for p in points if self.start < p < placed - SAME_POINT]
        if inside:
            q = max(inside)
            after = _Level.of(self.logs, q, end, aside)
            if after.size >= self.method.confirm_level and self._crosses(summed, after, side):
                return self._sized(placed, after, now, aside, summed, side)
            first = max([self.start, *(p for p in inside if p < q)])
            before = _Level.of(self.logs, first, q, aside)
            since = [j for j in range(q, now + 1) if j not in aside]
            enough = before.size >= (self.needed if first == self.start else self.method.confirm_level)
            if enough and self._crosses(since, before, side):
                return self._sized(q, before, now, aside, summed, side)
            placed = q
        elif placed - self.start >= self.needed:
            return self._sized(placed, _Level.of(self.logs, self.start, end, aside), now, aside, summed, side)
        self.start, self.needed = placed, self.method.confirm_level
        return None

    def _still_waiting(self, side: int, left: int, now: int, aside: set[int]) -> bool:
        """A sum judged not yet large enough, from the same commit on: measured again where it was placed, against
        the level it was judged with, before it is judged (and detect.py asked) again. The cost of a long noisy
        series, which may hold such a sum for hundreds of commits, then grows with its changes, not its commits."""
        waiting = self.waiting.get(side)
        if waiting is None or waiting[0] != left:
            return False
        _, index, level = waiting
        return not self._size_reached(index, level, now, aside, side)

    def _sized(self, index: int, level: _Level, now: int, aside: set[int], summed: list[int], side: int) -> int:
        """`index`, where the median of the commits from it on differs from the level's on the sum's side by at
        least the reference (a change under half the smallest change that matters is never confirmed) and by what
        the series' own noise resolves at the commits seen (`resolution`); else not yet. The two medians are the
        size the change keeps (`Signal`)."""
        if self._size_reached(index, level, now, aside, side):
            self.sized = self._medians(index, level, now, aside)
            return index
        self.waiting[side] = (summed[0], index, level)
        return _NOT_YET

    def _medians(self, index: int, level: _Level, now: int, aside: set[int]) -> tuple[float, float]:
        before = [self.logs[j] for j in range(level.start, level.end) if j not in aside]
        since = [self.logs[j] for j in range(index, now + 1) if j not in aside]
        return float(np.median(before)), (float(np.median(since)) if since else math.nan)

    def _size_reached(self, index: int, level: _Level, now: int, aside: set[int], side: int) -> bool:
        before, after = self._medians(index, level, now, aside)
        count = sum(j not in aside for j in range(index, now + 1))
        needed = max(self.reference, resolution(level.spread, level.size, count, self.method.p_value))
        return count > 0 and side * (after - before) >= needed

    def _placed(self, left: int, points: list[int]) -> int:
        """Where a change starts: the change point of detect.py (placed with the commits on both sides) nearest to
        where the sum left 0, from `SAME_POINT` commits before it on. Where the sum left 0 at the first commit
        compared with the level, the change may lie among the commits between the level's end and it
        (`confirm_guard`). Where detect.py has none there, where the sum left 0."""
        level_end = self.start + self.needed
        lowest = level_end if left == level_end + self.method.confirm_guard else left - SAME_POINT
        return min((p for p in points if p >= lowest), key=lambda p: (abs(p - left), p), default=left)

    def _crosses(self, commits: list[int], level: _Level, side: int) -> bool:
        """Whether the sum of `commits` read against `level` reaches the decision interval."""
        total, summed = _page([(j, level.step(self.logs[j], side, self.reference)) for j in commits])
        return self._reaches(total, summed, level)


def _page(steps: list[tuple[int, float]]) -> tuple[float, list[int]]:
    """Page's recursion over (commit, step): the sum, and the commits it holds since it last left 0."""
    total, summed = 0.0, list[int]()
    for j, step in steps:
        total = max(0.0, total + step)
        if total > 0.0:
            summed.append(j)
        else:
            summed = []
    return total, summed


class Analyses:
    """The series cut after each commit: detect.py's change points, each computed once, and the confirmed changes."""

    def __init__(
        self,
        values: Sequence[float],
        method: Method = DEFAULT_METHOD,
        min_effect: float = DEFAULT_MIN_EFFECT,
        resume: Mapping[str, Any] | None = None,
        keep: Collection[int] = (),
    ) -> None:
        """`resume`: where a read of the same first commits stopped; `keep`: the lengths at which to take the read's
        `snapshots`, for a later analysis to go on from (the checkpoint, below)."""
        self.values = list(values)
        self.prefixes = Prefixes(self.values, method)
        sums = _Sums(self.values, method, min_effect, self.prefixes)
        self.signals = sums.read(resume, keep)
        self.snapshots = sums.snapshots

    def at(self, length: int) -> list[int]:
        """detect.py's change points of the series cut at `length`."""
        return self.prefixes.at(length)

    def found(self, length: int | None = None) -> list[Found]:
        """The change points of the series cut at `length` (all of it by default), each with its state: the changes
        confirmed by then, each at the nearest change point of detect.py within `SAME_POINT` commits (placed with
        the commits since) or else where it was confirmed, and the other change points of detect.py, provisional."""
        length = len(self.values) if length is None else length
        pending, confirmed = list(self.at(length)), list[Found]()
        for signal in (s for s in self.signals if s.length <= length):
            near = [i for i in pending if abs(i - signal.index) <= SAME_POINT]
            index = min(near, key=lambda i: (abs(i - signal.index), i), default=signal.index)
            pending = [i for i in pending if i != index]
            confirmed.append(Found(index, True, length - index, signal))
        return sorted(confirmed + [Found(i, False, length - i) for i in pending], key=lambda f: f.index)


def first_confirmations(
    values: Sequence[float],
    method: Method = DEFAULT_METHOD,
    *,
    start: int = MIN_COMMITS,
    min_effect: float = DEFAULT_MIN_EFFECT,
) -> list[tuple[int, int]]:
    """The series as if analysed after every commit from `start` on: (length when first confirmed, index) of each
    alarm. This is the count a user sees: a job at every commit, each alarm once, however long it lasted; a change
    confirmed at a commit stays confirmed at every later one (`signals`)."""
    return [(max(s.length, start), s.index) for s in signals(values, method, min_effect)]


# How far from the level a commit or a change must be: Page's decision interval for the cumulative sum, a commit's
# distance as an N(0, 1) draw, and the smallest change a series' noise resolves between two segments. The statistics
# the rule above reads against; each a formula with its source, each computed once for its arguments.
SIEGMUND_SHIFT = 1.166  # Siegmund's correction of a CUSUM's decision interval for its overshoot (in sigmas)
_EXACT_TAIL = 1e-12  # beyond this tail probability a commit's distance is taken as it is (the quantile saturates)


@lru_cache(maxsize=65536)
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


def resolution(noise: float, before: int, after: int, p_value: float) -> float:
    """The smallest difference of two means, of `before` and `after` commits with a deviation of `noise` each (in
    logs), that a one-sided test at `p_value` tells from noise: z sigma sqrt(1/before + 1/after). A change smaller
    than this at the commits seen is not confirmed, and does not fail a job (`analysis.Change.fails`): in a series
    whose noise is twice the smallest change that matters, a 5% change needs some 100 commits a side."""
    from scipy.special import ndtri

    if before <= 0 or after <= 0:
        return math.inf
    return -float(ndtri(p_value)) * noise * math.sqrt(1 / before + 1 / after)


def standard_normal(distance: float, freedom: int) -> float:
    """Student's t `distance` with `freedom` degrees of freedom as the N(0, 1) quantile of the same tail."""
    return math.copysign(_quantile_of(abs(distance), freedom), distance)


@lru_cache(maxsize=1024)
def _quantile_of(distance: float, freedom: int) -> float:
    """For a distance >= 0 (each commit asks once a side, with the same distance: cached)."""
    from scipy.special import ndtri, stdtr

    tail = float(stdtr(freedom, -distance))
    return -float(ndtri(tail)) if tail > _EXACT_TAIL else distance


# The checkpoint: where the sequential read of a series (`Analyses`) stopped at its last analysis, kept in the store;
# the next job goes on from there, and reads only the commits it added instead of the whole history again.
#
# A commit's verdict reads only the commits up to it, so going on from the read's state after the first n commits
# gives what reading all of them gives, exactly (tests/test_history_checkpoint.py asserts the same analysis). A
# checkpoint is used only where it was computed from the same values: the digest of the series' first n values, the
# method, the smallest change that matters and the code (this plugin's version, the rule's modules, numpy, scipy and
# ruptures) must all be those of this analysis; anything else (a rewritten history, an older run imported into the
# middle, an excluded run, another llmperf_history_min_effect, an upgrade) reads the series whole. It is a cache:
# losing it costs time, never a verdict, and the store's rows stay the only facts.
#
# Kept in `llmperf_meta`, one row a series (`checkpoint:SERIES_KEY`), written by the job that analysed it in one
# transaction (history/store.py).
CHECKPOINT_FORMAT = 1


def checkpoint_digests(values: Sequence[float], lengths: Collection[int]) -> dict[int, str]:
    """The digest of the series' first values (float64, in order) at each of `lengths`, in one pass."""
    data, found, done = np.asarray(values, dtype=np.float64), {}, 0
    running = hashlib.sha256()
    for length in sorted(set(lengths)):
        running.update(data[done:length].tobytes())
        found[length], done = running.copy().hexdigest(), length
    return found


@lru_cache(maxsize=1)
def checkpoint_code() -> str | None:
    """What computed a read: this plugin's version, the rule's source and the libraries it calls; None where that
    cannot be told (no checkpoint is used or kept then)."""
    found = hashlib.sha256(str(CHECKPOINT_FORMAT).encode())
    for name in ("pytest-llmperf", "numpy", "scipy", "ruptures"):
        try:
            found.update(f"{name} {importlib.metadata.version(name)}\n".encode())
        except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path: its source says what it is
            found.update(f"{name} -\n".encode())
    try:
        for source in (__file__, detect.__file__):  # the rule, its thresholds and this checkpoint; detect.py
            found.update(Path(str(source)).read_bytes())
    except OSError:
        return None
    return found.hexdigest()


def _checkpoint_params(method: Method, min_effect: float) -> dict[str, Any]:
    return {"method": asdict(method), "min_effect": min_effect}


def checkpoint_lengths(length: int) -> set[int]:
    """The lengths at which the reads of a series of `length` values are kept: `length` itself, and, 2^(k-1) to
    2^k commits before it, the one length of them that is a multiple of 2^(k-1). Each is kept by every later
    analysis until it is too old for its span, so a checkpoint holds about log2(length) reads. A job that adds a
    run at a commit measured `d` commits back (an A/B job's base side, a job run again) goes on from a read at most
    about 2d commits before it."""
    found = {length}
    for k in range(length.bit_length()):
        step = 1 << k
        if length - step > 0:
            found.add((length - step) // step * step)
    return found


def checkpoint_valid(
    text: str | None, values: Sequence[float], method: Method, min_effect: float
) -> list[dict[str, Any]]:
    """The kept states of the checkpoint `text` that this code computed with these parameters from the same first
    values as `values` (shortest first; each as {"digest", "state"}): empty where none was (the series is read
    whole)."""
    if not text:
        return []
    try:
        kept = json.loads(text)
        if kept["code"] != checkpoint_code():
            return []
        if {k: kept[k] for k in ("method", "min_effect")} != _checkpoint_params(method, min_effect):
            return []
        reads = [r for r in kept["reads"] if 0 < r["state"]["length"] <= len(values)]
        now = checkpoint_digests(values, [r["state"]["length"] for r in reads])
        return [r for r in reads if r["digest"] == now[r["state"]["length"]]]
    except (ValueError, KeyError, TypeError):  # not a checkpoint this code wrote
        return []


def checkpoint_written(
    kept: list[dict[str, Any]],
    snapshots: Sequence[Mapping[str, Any]],
    values: Sequence[float],
    method: Method,
    min_effect: float,
) -> str | None:
    """The checkpoint to keep after a read of `values`: the states `checkpoint_valid` gave and the read's new
    `snapshots` (`Analyses`), those at the lengths still kept (`checkpoint_lengths`)."""
    made_by = checkpoint_code()
    if made_by is None:
        return None
    now = checkpoint_digests(values, [s["length"] for s in snapshots])
    new = [{"digest": now[s["length"]], "state": s} for s in snapshots]
    wanted = checkpoint_lengths(len(values))
    reads = [read for read in [*kept, *new] if read["state"]["length"] in wanted]
    return json.dumps({"code": made_by, **_checkpoint_params(method, min_effect), "reads": reads})
