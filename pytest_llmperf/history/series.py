"""Series from the store's rows: which runs enter, in which order, and one point per commit.

A series is a metric at a batch size of a test, on a target and machine class (`SeriesId`). Its points are the
default branch's commits in first-parent order: runs measured at such a commit from a clean tree, a job against
stored baselines or the base side of an A/B job (which measures the compared ref, a commit of the default branch).
The head side of an A/B job is a pull request's working tree: stored, never in a series. Several runs of one commit
(a push and the A/B jobs based on it) are one point, their median; the spread drawn is that of all their
per-process medians. Runs a person excluded are kept aside, drawn, never analysed.

The order is the default branch's first-parent line: from git where the caller gives it (the command line reads it
from the repository), else as the jobs recorded it, else by commit time. Runs recorded on the default branch whose
commit that line no longer holds (a rebased or force-pushed branch) are placed by when their jobs ran, and said.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .records import Result, Run, SeriesId


@dataclass(slots=True)  # a job's end builds one for every commit of its series
class Point:
    commit_sha: str
    commit_time: str | None
    value: float  # the median of the commit's runs' values
    low: float  # the lowest and highest per-process median of those runs
    high: float
    run_ids: list[str]
    env_fp: str
    machine_fp: str
    sources: list[str]
    order: int = 0  # the commit's place among all commits of the rows (0 = the oldest): the same in every series


@dataclass
class Series:
    id: SeriesId
    unit: str
    direction: int  # +1 higher is better, -1 lower is better
    points: list[Point] = field(default_factory=list)
    excluded: list[Point] = field(default_factory=list)  # runs set aside, at their commits

    @property
    def key(self) -> str:
        return self.id.key

    @property
    def values(self) -> list[float]:
        return [p.value for p in self.points]


def enters(run: Run) -> bool:
    """A run that measured a commit of the default branch from a clean tree, and not a pull request's head."""
    return run.source != "ab-head" and not run.dirty


def orphaned(runs: Sequence[Run], line: Sequence[str] | None) -> list[Run]:
    """Runs recorded on the default branch whose commit git's first-parent line no longer holds (the branch was
    rebased or force-pushed since): `build` places them by the time their jobs ran, and the job and the command
    line say how many (`pytest-llmperf history replace` moves them onto the commits that replaced theirs)."""
    if not line:
        return []
    known = set(line)
    return [r for r in runs if enters(r) and r.on_default_branch and r.commit_sha not in known]


def build(runs: Sequence[Run], results: Sequence[Result], line: Sequence[str] | None = None) -> dict[str, Series]:
    """Every series the rows hold, by key. `line`: the default branch's first-parent commits, oldest first; when
    given it decides which commits enter and their order (else the runs' own `on_default_branch` and order). Runs
    recorded on the default branch whose commit the line no longer holds (`orphaned`) enter after the newest commit
    of the line measured before their job ran: nothing measured on main drops out of its series unsaid."""
    position = {sha: i for i, sha in enumerate(line)} if line else None
    chosen = {
        r.run_id: r
        for r in runs
        if enters(r) and (r.on_default_branch or (position is not None and r.commit_sha in position))
    }
    ordered_by_line = position is not None or all(r.commit_order is not None for r in chosen.values())
    placed = sorted(
        (r.started_at, position[r.commit_sha]) for r in chosen.values() if position and r.commit_sha in position
    )

    def order(run: Run) -> tuple:
        if position is not None:
            if run.commit_sha in position:
                return (position[run.commit_sha], 0, "")
            before = [p for started, p in placed if started <= run.started_at]  # an orphan: after what ran before
            return (max(before, default=-1), 1, run.started_at)
        if ordered_by_line:
            return (run.commit_order, 0, "")
        return (run.commit_time or "", run.started_at)

    grouped: dict[str, dict[tuple[str, bool], list[tuple[Run, Result]]]] = defaultdict(lambda: defaultdict(list))
    found: dict[str, Series] = {}
    for result in results:
        run = chosen.get(result.run_id)
        if run is None:
            continue
        if result.series_key not in found:
            sid = SeriesId(result.test, result.metric, result.batch_size, run.target, run.machine)
            found[result.series_key] = Series(sid, result.unit, result.direction)
        grouped[result.series_key][(run.commit_sha, run.excluded)].append((run, result))
    first: dict[str, tuple] = {}
    for run in chosen.values():
        key = order(run)
        first[run.commit_sha] = min(first.get(run.commit_sha, key), key)
    rank = {sha: i for i, sha in enumerate(sorted(first, key=lambda sha: (first[sha], sha)))}
    for series_key, commits in grouped.items():
        series = found[series_key]
        for (sha, excluded), members in sorted(commits.items(), key=lambda kv: (rank[kv[0][0]], kv[0][1])):
            (series.excluded if excluded else series.points).append(_point(sha, members, rank[sha]))
    return found


def _point(sha: str, members: Sequence[tuple[Run, Result]], order: int) -> Point:
    if len(members) == 1:  # most commits hold one run: its value and its process medians' range
        run, result = members[0]
        medians = result.process_medians
        if not math.isfinite(sum(medians)):  # a NaN or infinity among them (or their sum overflows): left out
            medians = tuple(m for m in medians if math.isfinite(m))
        low, high = (min(medians), max(medians)) if medians else (result.value, result.value)
        return Point(
            sha, run.commit_time, result.value, low, high, [run.run_id], run.env_fp, run.machine_fp, [run.source], order
        )
    pooled = [m for _, r in members for m in r.process_medians if math.isfinite(m)]
    values = [r.value for _, r in members]
    newest = max(members, key=lambda m: m[0].started_at)[0]
    return Point(
        sha,
        members[0][0].commit_time,
        float(statistics.median(values)),
        min(pooled, default=min(values)),
        max(pooled, default=max(values)),
        [run.run_id for run, _ in members],
        newest.env_fp,
        newest.machine_fp,
        sorted({run.source for run, _ in members}),
        order,
    )
