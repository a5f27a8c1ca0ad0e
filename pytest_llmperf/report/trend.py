"""A benchmark's medians over commits: from the git history of its baseline file, and from reports.

Each committed version of `baselines/<device>/<module>.json` whose entry for the benchmark changed is
one point (labelled with the commit the baseline was measured at and its date); each JSON report that
holds the benchmark adds its own measurement. A baseline's value per batch size is the median of its
per-process medians (what the gate compares), read through the store's own parser
(`BaselineEntry.from_json`), so a version in a format it cannot read is left out, never misread. Git is
asked with a timeout; no git, no repository or no history gives the report points only, never an error.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..judge.baseline_layout import parse
from ..judge.baselines import BaselineEntry
from .stored import run_metric_values

MAX_COMMITS = 30  # per baseline file: the recent history is what a reviewer looks at

#: A file's committed versions, oldest first: (commit, commit time, parsed document).
Versions = list[tuple[str, str, dict]]


@dataclass
class Point:
    label: str  # short commit, date, and where the value comes from
    when: str  # ISO time, for ordering
    medians: dict[int, dict[str, float]] = field(default_factory=dict)  # batch size -> metric -> median


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _file_versions(path: Path, cache: dict[Path, Versions]) -> Versions:
    """(commit, commit time, parsed file) per committed version of `path`, oldest first."""
    if path in cache:
        return cache[path]
    versions: Versions = []
    folder = path.parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    top = _git(folder, "rev-parse", "--show-toplevel") if folder.is_dir() else None
    if top:
        root = Path(top.strip())
        try:
            relative = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            relative = None
        log = _git(root, "log", f"-n{MAX_COMMITS}", "--format=%H %cI", "--", relative) if relative else None
        for line in reversed((log or "").splitlines()):
            commit, _, when = line.partition(" ")
            text = _git(root, "show", f"{commit}:{relative}")
            try:
                data = parse(text) if text else None
            except ValueError:  # not JSON, or a key given twice (a bad merge): not a version to plot
                data = None
            if isinstance(data, dict):
                versions.append((commit, when, data))
    cache[path] = versions
    return versions


def parsed_entry(key: str, data: Mapping[str, Any]) -> BaselineEntry | None:
    """A committed version's entry read by the store's own parser; None when it is in a format the parser
    does not read (e.g. an old schema in the history)."""
    try:
        return BaselineEntry.from_json(key, data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def entry_medians(
    entry: BaselineEntry, batch_sizes: Iterable[int], metrics: Iterable[str]
) -> dict[int, dict[str, float]]:
    """Per batch size and metric, the median of a baseline entry's per-process medians."""
    medians: dict[int, dict[str, float]] = {}
    for bs in batch_sizes:
        values = entry.process_values(bs)
        for metric in metrics:
            if values.get(metric):
                medians.setdefault(bs, {})[metric] = float(np.median(values[metric]))
    return medians


def baseline_points(
    baseline_file: Path, key: str, batch_sizes: Iterable[int], metrics: Iterable[str], cache: dict[Path, Versions]
) -> list[Point]:
    """One point per committed version of the file in which this benchmark's entry changed."""
    batch_sizes, metrics = list(batch_sizes), list(metrics)
    points: list[Point] = []
    seen: set[str] = set()
    for commit, when, data in _file_versions(baseline_file, cache):
        raw = (data.get("benchmarks") or {}).get(key)
        entry = parsed_entry(key, raw) if isinstance(raw, dict) else None
        if entry is None:
            continue
        stamp = f"{entry.git_commit}|{entry.created}"
        if stamp in seen:  # the file changed for another benchmark
            continue
        seen.add(stamp)
        measured_at = str(entry.git_commit or commit)[:7]
        created = entry.created or when
        points.append(
            Point(f"{measured_at} {_day_time(created)} baseline", created, entry_medians(entry, batch_sizes, metrics))
        )
    return points


def _day_time(iso: str) -> str:
    return iso[:16].replace("T", " ")


def report_point(document: Mapping[str, Any], benchmark: Mapping[str, Any], metrics: Iterable[str]) -> Point:
    """The measurement a JSON report holds, labelled with when and at which commit it was measured (the
    benchmark's own stamp in an accumulated report, else the report's)."""
    git = (document.get("fingerprint") or {}).get("git") or {}
    measured = stamp if isinstance(stamp := benchmark.get("measured"), Mapping) else {}
    commit = str(measured.get("commit") or git.get("commit") or "?")
    when = str(measured.get("created") or document.get("created") or "")
    dirty = measured.get("dirty", git.get("dirty"))
    return Point(
        f"{commit[:7]}{' dirty' if dirty else ''} {_day_time(when)} {document.get('device', '?')}",
        when,
        batch_medians(benchmark, metrics),
    )


def batch_medians(benchmark: Mapping[str, Any], metrics: Iterable[str]) -> dict[int, dict[str, float]]:
    """Per batch size that ran and metric, the median of the per-process medians of the runs (with one
    process: the median of its runs), as the baseline points are."""
    metrics = list(metrics)
    medians: dict[int, dict[str, float]] = {}
    for batch in benchmark.get("batches") or []:
        if batch.get("status", "ok") != "ok":
            continue
        for metric in metrics:
            per_process: dict[Any, list[float]] = {}
            for process, value in run_metric_values(batch.get("runs"), metric):
                per_process.setdefault(process, []).append(value)
            if per_process:
                medians.setdefault(int(batch["batch_size"]), {})[metric] = float(
                    np.median([np.median(v) for v in per_process.values()])
                )
    return medians
