"""What a job does with the history when it ends: write its rows file, append its rows to the store, analyse the
series it measured and leave the analysis for the reports. Called once, from the controlling pytest process (worker
processes never write history), with typed inputs.

Nothing of a job is lost to the store: the rows file is written first, and a store that is locked, unreadable or
newer than this plugin is one line naming it and the import command. By default the history reports; with
`--llmperf-history-check=fail` a confirmed, unmarked regression of at least the smallest change that matters fails
the session, and so does a store error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..files import write_text_atomic
from ..judge.verdicts import Outcome
from . import lineage, rowsfile, series, summary
from .analysis import analyze
from .backends import Location, StoreError, parse_location
from .detect import DEFAULT_METHOD, RupturesMissing
from .rows import Job, job_rows
from .store import Store

ANALYSIS_FILE = "history.json"


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
    runs, results = job_rows(job, outcomes)
    if not runs:
        return done
    if job.default_branch and lineage.branch_ref(job.rootdir, job.default_branch) is None:
        done.lines.append(  # every run of this job is then off the series' line: say why
            f"llmperf history: --llmperf-history-branch={job.default_branch} is no branch of this repository: the "
            "job's runs are stored but enter no series"
        )
    problems = done.errors if check == "fail" else done.lines
    if rows_file:
        path = report_dir / rowsfile.FILE_NAME
        try:
            done.written.append(rowsfile.append(path, runs, results))
        except OSError as exc:
            problems.append(f"llmperf history: cannot write the rows file {path}: {exc}")
    try:
        location = parse_location(store, job.rootdir)
    except ValueError as exc:
        problems.append(f"llmperf history: --llmperf-history={exc}")
        return done
    if location is None:
        return done
    try:
        with Store(location) as opened:
            appended = opened.append(runs, results)
            if check == "off":
                return done
            keys = {r.series_key for r in results}
            built = series.build(opened.runs(), opened.results(keys), _line(job))
            marks = opened.marks()
    except StoreError as exc:
        problems.append(f"llmperf history: {exc}")
        return done
    done.lines.append(
        f"llmperf history: {appended.results} rows of {appended.runs} run(s) appended to {location.describe()}"
    )
    _analyse(done, built, marks, location, report_dir, check=check, min_effect=min_effect, anchor=anchor, job=job)
    return done


def _line(job: Job) -> list[str] | None:
    branch = lineage.default_branch(job.rootdir, job.default_branch)
    return (lineage.first_parent_line(job.rootdir, branch) or None) if branch else None


def _analyse(
    done: HistoryDone,
    built: dict,
    marks: list,
    location: Location,
    report_dir: Path,
    *,
    check: str,
    min_effect: float,
    anchor: str | None,
    job: Job,
) -> None:
    anchor_sha = (
        lineage.git(job.rootdir, "rev-parse", "--verify", "--quiet", f"{anchor}^{{commit}}") if anchor else None
    )
    if anchor and not anchor_sha:  # a typo must not quietly move where creep is measured from
        done.lines.append(
            f"llmperf history: --llmperf-history-anchor={anchor} is no commit of this repository: creep is measured "
            "from the oldest commit analysed"
        )
    try:
        analyses = analyze(built, min_effect=min_effect, anchor=anchor_sha, marks=marks)
    except RupturesMissing as exc:
        done.lines.append(f"llmperf {exc}")
        return
    data = summary.document(analyses, DEFAULT_METHOD, min_effect, location.describe())
    path = report_dir / ANALYSIS_FILE
    try:
        done.written.append(write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n"))
    except OSError as exc:
        done.lines.append(f"llmperf history: cannot write {path}: {exc}")
    confirmed = [c for a in analyses for c in a.changes if c.state == "confirmed" and c.mark is None]
    for change in confirmed:
        done.lines.append(
            f"llmperf history: {change.kind} {change.change:+.1%} in {change.label}, confirmed, between "
            f"{change.last_good[:12]} and {change.first_bad[:12]}"
        )
    for item in data["creep"]:
        done.lines.append(
            f"llmperf history: creep {item['drift']:+.1%} ({item['kind']}) in {item['series']} "
            f"since {item['from'][:12]}"
        )
    if data["warnings"]:
        done.lines.append(f"llmperf history: {len(data['warnings'])} series noisier than {min_effect:.0%} ({path})")
    failing = [c for a in analyses for c in a.changes if c.fails(min_effect)]
    if check == "fail" and failing:
        done.errors.append(
            f"llmperf history: {len(failing)} confirmed regression(s) of at least {min_effect:.0%} that nobody marked "
            "(--llmperf-history-check=fail): mark one with `pytest-llmperf history mark` if it is expected"
        )
