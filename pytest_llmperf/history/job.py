"""What a job does with the history when it ends: write its rows file, append its rows to the store, analyse the
series it measured and leave the analysis for the reports. Called once, from the controlling pytest process (worker
processes never write history), with typed inputs.

Nothing of a job is lost to the store: the rows file is written first, and a store that is locked, unreadable or
newer than this plugin is one line naming it and the import command. By default the history reports; with
`--llmperf-history-check=fail` a confirmed, unmarked regression that measured at least the smallest change that
matters and is still in effect (`Change.fails`) fails the session, and so does a store error.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from ..files import strict_json, write_text_atomic
from ..judge.fingerprint import dirty, git
from ..judge.verdicts import Outcome
from . import rows, series, summary
from .analysis import Event, SeriesAnalysis, analyze, events
from .databases import Location, StoreError, parse_location
from .detect import DEFAULT_METHOD, RupturesMissing
from .records import Result, Run
from .rows import Job, job_rows
from .settings import ANALYSIS_FILE
from .store import Store


@dataclass
class HistoryDone:
    """What the session says and does about the history."""

    lines: list[str] = field(default_factory=list)  # said after the verdicts
    errors: list[str] = field(default_factory=list)  # fail the session (--llmperf-history-check=fail)
    written: list[Path] = field(default_factory=list)


def append_job(
    outcomes: Sequence[Outcome],
    job: Job,
    *,
    store: str,
    report_dir: Path,
    rows_file: bool = True,
    check: str = "report",
    min_effect: float = 0.05,
    anchor: str | None = None,
) -> HistoryDone:
    done = HistoryDone()
    # The reports read the analysis from the report directory: one left by an earlier job must not pass for this one's.
    (report_dir / ANALYSIS_FILE).unlink(missing_ok=True)
    problems = done.errors if check == "fail" else done.lines
    try:
        location = parse_location(store, job.rootdir)
    except ValueError as exc:
        problems.append(f"llmperf history: --llmperf-history={exc}")
        location = None
    if location is None and not rows_file:
        return done
    line = _first_parent_line(job, problems)
    runs, results = job_rows(job, outcomes, line, dirty(job.rootdir, own_files(location, report_dir)))
    if not runs:
        return done
    if line and not any(series.enters(r) and r.on_default_branch for r in runs):  # said, never failing: a pull
        # request's job against stored baselines measures a commit off the default branch by design
        done.lines.append(f"llmperf history: {_why_off(runs, line)}: the job's runs are stored but enter no series")
    kept = _write_rows(report_dir, runs, results, problems) if rows_file else None
    if location is None:
        return done
    try:
        with Store(location) as opened:
            appended = opened.append(runs, results)
            if check == "off":
                return done
            keys = {r.series_key for r in results}
            stored = opened.runs()
            built = series.build(stored, opened.results(keys), line or None)
            marks = opened.marks()
            orphans = series.orphaned(stored, line)
            checkpoints = opened.checkpoints(keys)
    except StoreError as exc:
        problems.append(f"llmperf history: {exc}")
        if kept is None:  # nothing of the job is lost: its rows go where `history import` reads them
            _write_rows(report_dir, runs, results, problems)
        return done
    done.lines.append(
        f"llmperf history: {appended.results} rows of {appended.runs} run(s) appended to {location.describe()}"
    )
    if orphans:
        done.lines.append(f"llmperf history: {orphan_line(orphans)}")
    analyses = _analyse(
        done,
        built,
        marks,
        checkpoints,
        location,
        report_dir,
        check=check,
        min_effect=min_effect,
        anchor=anchor,
        job=job,
    )
    _keep_checkpoints(location, analyses)
    return done


CHECKPOINT_TIMEOUT_S = 5.0  # a cache: a job does not wait the store's whole lock timeout to keep it


def _keep_checkpoints(location: Location, analyses: Sequence[SeriesAnalysis]) -> None:
    """Where each series' read stopped, for the next job (history/alarms.py). A store that cannot take them
    now (another job holding its lock) costs the next job time, never a verdict: it reads those series whole."""
    texts = {a.series.key: a.checkpoint for a in analyses if a.checkpoint is not None}
    with suppress(StoreError), Store(location, timeout=CHECKPOINT_TIMEOUT_S) as opened:
        opened.keep_checkpoints(texts)


def own_files(location: Location | None, report_dir: Path) -> list[Path]:
    """The plugin's files in the tree, left out of the dirty check (judge/fingerprint.py's `dirty`, also the
    fingerprint's): the report directory, a SQLite store and its write-ahead log, and the .gitignore beside it."""
    own = [report_dir]
    if location is not None and location.dialect == "sqlite":
        store = Path(location.target)
        own += [store, Path(f"{store}-wal"), Path(f"{store}-shm"), store.parent / ".gitignore"]
    return own


def orphan_line(orphans: Sequence[Run]) -> str:
    commits = len({r.commit_sha for r in orphans})
    return (
        f"{len(orphans)} stored run(s) at {commits} commit(s) recorded on the default branch are no longer on its "
        "first-parent line (rebased or force-pushed?): placed by when their jobs ran; move them onto the commits "
        "that replaced theirs with `pytest-llmperf history replace OLD NEW`"
    )


def _why_off(runs: Sequence[Run], line: Sequence[str]) -> str:
    """Why none of the job's runs enters a series: the one line a job says where it adds nothing to the history."""
    if all(r.source == "ab-head" for r in runs):
        return "an A/B job whose base side measured nothing"
    if all(r.dirty for r in runs if r.source != "ab-head"):
        return "the working tree has uncommitted changes (dirty) besides the plugin's own files"
    sha = runs[0].commit_sha
    return f"commit {sha[:12]} is not on the default branch's first-parent line ({len(line)} commits)"


def _write_rows(report_dir: Path, runs: list[Run], results: list[Result], problems: list[str]) -> Path | None:
    path = report_dir / rows.FILE_NAME
    try:
        return rows.append(path, runs, results)
    except OSError as exc:
        problems.append(f"llmperf history: cannot write the rows file {path}: {exc}")
        return None


def _first_parent_line(job: Job, problems: list[str]) -> list[str]:
    """The default branch's first-parent commits, which order the series; where there are none, why (a run off
    that line is stored but enters no series)."""
    branch = series.default_branch(job.rootdir, job.default_branch)
    line = series.first_parent_line(job.rootdir, branch) if branch else []
    if line:
        return line
    if branch is None:
        why = "no default branch found (not a git repository, or none of origin's HEAD, main, master; name it with "
        why += "the ini key llmperf_history_branch)"
    elif job.default_branch and series.branch_ref(job.rootdir, branch) is None:
        why = f"llmperf_history_branch={branch} is no branch of this repository"
    else:
        why = f"no first-parent line of {branch} here (a shallow clone? fetch it whole: fetch-depth: 0)"
    problems.append(f"llmperf history: {why}: the job's runs are stored but enter no series")
    return []


def _analyse(
    done: HistoryDone,
    built: dict,
    marks: list,
    checkpoints: dict[str, str],
    location: Location,
    report_dir: Path,
    *,
    check: str,
    min_effect: float,
    anchor: str | None,
    job: Job,
) -> list[SeriesAnalysis]:
    anchor_sha = git(job.rootdir, "rev-parse", "--verify", "--quiet", f"{anchor}^{{commit}}") if anchor else None
    if anchor and not anchor_sha:  # a typo must not quietly move where creep is measured from
        done.lines.append(
            f"llmperf history: llmperf_history_anchor={anchor} is no commit of this repository: creep is measured "
            "from the oldest commit analysed"
        )
    try:
        analyses = analyze(built, min_effect=min_effect, anchor=anchor_sha, marks=marks, checkpoints=checkpoints)
    except RupturesMissing as exc:  # nothing analysed: with --llmperf-history-check=fail, that fails
        (done.errors if check == "fail" else done.lines).append(f"llmperf {exc}")
        return []
    data = summary.document(analyses, DEFAULT_METHOD, min_effect, location.describe())
    path = report_dir / ANALYSIS_FILE
    try:
        # on one line: its plotted series hold every commit, megabytes for a long history, which json writes in C
        done.written.append(write_text_atomic(path, strict_json(data, indent=None)))
    except OSError as exc:
        done.lines.append(f"llmperf history: cannot write {path}: {exc}")
    found = events(analyses, min_effect)
    for event in (e for e in found if e.state == "confirmed" and e.mark is None):
        done.lines.append(f"llmperf history: {event_line(event)}")
    for item in data["creep"]:
        done.lines.append(
            f"llmperf history: creep {item['drift']:+.1%} ({item['kind']}) in {item['series']} "
            f"since {item['from'][:12]}"
        )
    if data["warnings"]:
        done.lines.append(f"llmperf history: {len(data['warnings'])} series noisier than {min_effect:.0%} ({path})")
    failing = [e for e in found if e.fails]
    if check == "fail" and failing:
        done.errors.append(
            f"llmperf history: {len(failing)} confirmed regression(s) of at least {min_effect:.0%}, still in effect, "
            "that nobody marked (--llmperf-history-check=fail; one per event): mark one with `pytest-llmperf history "
            "mark` if it is expected"
        )
    return analyses


def event_line(event: Event) -> str:
    """`regression +8.0% in SERIES, confirmed, failing, between A and B`; an event of several series says how many
    moved, the spread of their sizes and, where most of the machine's moved alike, that it is likely the runner."""
    change = event.changes[0]
    what = (
        f"{change.kind} {change.change:+.1%} in {change.label}"
        if len(event.changes) == 1
        else f"{event.kind} {event.describe()} ({event.target}, {event.machine})"
    )
    now = (
        f" (now {change.now:+.1%} against the level before it)"
        if len(event.changes) == 1 and change.now is not None
        else ""
    )
    return (
        f"{what}, {event.state}{', failing' if event.fails else ''}, between {event.last_good[:12]} and "
        f"{event.first_bad[:12]}{now}"
    )
