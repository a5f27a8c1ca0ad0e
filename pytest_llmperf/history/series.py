"""Series from the store's rows: which runs enter, in which order (the default branch's first-parent line, as git
tells it), one point per commit, and the series as files for other tools.

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

import csv
import json
import math
import os
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ..files import write_text_atomic
from ..judge.fingerprint import git
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


# What git says about the commit a job measured: its time, its branch, the default branch, and whether and where
# the commit lies on the default branch's first-parent line (the order of a series: merges into main, never the
# commits of a merged branch, never job time).
#
# Asked with a timeout; no git, no repository, or a shallow clone (which cannot see the line) gives None where it
# cannot tell, never an error. A CI job checks out with its full history (actions/checkout `fetch-depth: 0`) to order
# its rows; rows without an order are ordered by commit time.
MAX_LINE = 20_000  # first-parent commits read at most


def default_branch(root: Path, given: str | None = None) -> str | None:
    """The branch whose first-parent line is the history: given, else origin's HEAD, else main or master."""
    if given:
        return given
    remote = git(root, "symbolic-ref", "--short", "refs/remotes/origin/HEAD")
    if remote:
        return remote.removeprefix("origin/")
    for name in ("main", "master"):
        if git(root, "rev-parse", "--verify", "--quiet", f"refs/heads/{name}") is not None:
            return name
    return None


def branch_ref(root: Path, branch: str) -> str | None:
    """The local or remote-tracking ref of the branch, whichever exists (CI checkouts often lack the local one)."""
    for ref in (f"refs/remotes/origin/{branch}", f"refs/heads/{branch}"):
        if git(root, "rev-parse", "--verify", "--quiet", ref) is not None:
            return ref
    return None


def first_parent_line(root: Path, branch: str) -> list[str]:
    """The default branch's first-parent commits, oldest first (empty where git cannot tell)."""
    ref = branch_ref(root, branch)
    if ref is None or git(root, "rev-parse", "--is-shallow-repository") == "true":
        return []
    text = git(root, "rev-list", "--first-parent", f"--max-count={MAX_LINE}", ref)
    return list(reversed(text.split())) if text else []


def current_branch(root: Path) -> str | None:
    """The job's branch: GitHub's names for it where set (a pull request's head, a push's ref), else git's."""
    for name in ("GITHUB_HEAD_REF", "GITHUB_REF_NAME"):
        if os.environ.get(name):
            return os.environ[name]
    found = git(root, "rev-parse", "--abbrev-ref", "HEAD")
    return None if found in (None, "HEAD") else found


@dataclass(frozen=True)
class Placement:
    sha: str
    time: str | None
    order: int | None  # 1-based position on the default branch's first-parent line; None when not on it


def place(root: Path, ref: str, line: list[str]) -> Placement | None:
    """Where a commit (any ref) lies; None where git cannot resolve it."""
    sha = git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if not sha:
        return None
    when = git(root, "show", "-s", "--format=%cI", sha) or None
    index = {c: i for i, c in enumerate(line, 1)}
    return Placement(sha, when, index.get(sha))


def ci_url() -> str | None:
    """The CI run's page, where the CI says it (GitHub Actions)."""
    server, repo, run = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    return f"{server}/{repo}/actions/runs/{run}" if server and repo and run else None


# A store's series as files for other tools: Apache Otava's CSV tests (`otava analyze`), or JSON lines.
#
# Otava reads one CSV per test and a YAML config naming each file, its time column, its attributes and its metrics
# with their direction (+1: higher is better). The time column keeps the series' first-parent order (Otava orders by
# it): one minute apart per commit from 2000-01-01, the commit and its real time are attributes. Otava analyses the
# last 365 days unless told otherwise: `OTAVA_CONFIG=otava.yaml otava analyze --since 2000-01-01 KEY`.
EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def otava(series: Sequence[Series], out: Path) -> list[Path]:
    """`<out>/<series key>.csv` per series and `<out>/otava.yaml`; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written, tests = [], []
    for s in series:
        path = out / f"{s.key}.csv"
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["time", "commit", "commit_time", s.id.metric])
            for i, p in enumerate(s.points):
                stamp = (EPOCH + timedelta(minutes=i)).strftime("%Y-%m-%d %H:%M:%S +0000")
                writer.writerow([stamp, p.commit_sha, p.commit_time or "", repr(p.value)])
        written.append(path)
        tests.append(
            f"  {s.key}:  # {s.id.label()}\n    type: csv\n    file: {path.resolve()}\n    time_column: time\n"
            f"    attributes: [commit, commit_time]\n    metrics:\n      {s.id.metric}:\n"
            f"        column: {s.id.metric}\n        direction: {s.direction}\n"
        )
    config = out / "otava.yaml"
    write_text_atomic(
        config,
        "# written by pytest-llmperf history export --format otava; run: "
        f"OTAVA_CONFIG={config.name} otava analyze --since 2000-01-01 TEST\ntests:\n" + "".join(tests),
    )
    return [*written, config]


def jsonl(series: Sequence[Series], out: Path) -> list[Path]:
    """`<out>/series.jsonl`: one line per series with its points."""
    lines = [
        json.dumps(
            {
                "key": s.key,
                "series": s.id.label(),
                "unit": s.unit,
                "direction": s.direction,
                "points": [{"commit": p.commit_sha, "value": p.value, "low": p.low, "high": p.high} for p in s.points],
            },
            sort_keys=True,
        )
        for s in series
    ]
    path = out / "series.jsonl"
    write_text_atomic(path, "".join(line + "\n" for line in lines))
    return [path]
