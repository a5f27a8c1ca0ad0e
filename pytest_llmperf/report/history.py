"""A benchmark's medians over commits: from the git history of its baseline file, and from reports.

Each committed version of `baselines/<device>/<module>.json` whose entry for the benchmark changed is
one point (labelled with the commit the baseline was measured at and its date); each JSON report that
holds the benchmark adds its own measurement. Git is asked with a timeout; no git, no repository or
no history gives the report points only, never an error.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MAX_COMMITS = 30  # per baseline file: the recent history is what a reviewer looks at


@dataclass
class Point:
    label: str  # short commit and date
    when: str  # ISO time, for ordering
    medians: dict[int, dict[str, float]] = field(default_factory=dict)  # batch size -> metric -> median


def _flat(values: Any) -> list[float]:
    """Per-run values, also when a schema keeps them per worker process (lists of lists)."""
    out: list[float] = []
    for v in values if isinstance(values, list) else []:
        if isinstance(v, list):
            out += _flat(v)
        elif isinstance(v, (int, float)):
            out.append(float(v))
    return out


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _file_versions(path: Path, cache: dict[Path, list[tuple[str, str, dict]]]) -> list[tuple[str, str, dict]]:
    """(commit, commit time, parsed file) per committed version of `path`, oldest first."""
    if path in cache:
        return cache[path]
    versions: list[tuple[str, str, dict]] = []
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
                data = json.loads(text) if text else None
            except json.JSONDecodeError:
                data = None
            if isinstance(data, dict):
                versions.append((commit, when, data))
    cache[path] = versions
    return versions


def _entry_medians(entry: Mapping[str, Any], metrics: Iterable[str]) -> dict[int, dict[str, float]]:
    medians: dict[int, dict[str, float]] = {}
    for bs, per_metric in (entry.get("batches") or {}).items():
        for metric in metrics:
            values = _flat((per_metric or {}).get(metric))
            if values:
                medians.setdefault(int(bs), {})[metric] = float(np.median(values))
    return medians


def baseline_points(baseline_file: Path, key: str, metrics: Iterable[str],
                    cache: dict[Path, list[tuple[str, str, dict]]]) -> list[Point]:
    metrics = list(metrics)
    points: list[Point] = []
    seen: set[str] = set()
    for commit, when, data in _file_versions(baseline_file, cache):
        entry = (data.get("benchmarks") or {}).get(key)
        if not isinstance(entry, dict):
            continue
        stamp = f"{entry.get('git_commit')}|{entry.get('created')}"
        if stamp in seen:  # the file changed for another benchmark
            continue
        seen.add(stamp)
        measured_at = str(entry.get("git_commit") or commit)[:7]
        created = str(entry.get("created") or when)
        points.append(Point(f"{measured_at} {created[:16]} baseline", created,
                            _entry_medians(entry, metrics)))
    return points


def report_point(document: Mapping[str, Any], benchmark: Mapping[str, Any], metrics: Iterable[str]) -> Point:
    """The measurement a JSON report holds; reads the per-benchmark time and commit when the report has them."""
    git = (document.get("fingerprint") or {}).get("git") or {}
    commit = next((str(benchmark[k]) for k in ("commit", "git_commit", "measured_commit") if benchmark.get(k)),
                  str(git.get("commit") or "?"))
    when = next((str(benchmark[k]) for k in ("measured_at", "created", "measured") if benchmark.get(k)),
                str(document.get("created") or ""))
    dirty = " dirty" if benchmark.get("dirty", git.get("dirty")) else ""
    return Point(f"{commit[:7]}{dirty} {when[:16]} {document.get('device', '?')}", when,
                 batch_medians(benchmark, metrics))


def batch_medians(benchmark: Mapping[str, Any], metrics: Iterable[str]) -> dict[int, dict[str, float]]:
    metrics = list(metrics)
    medians: dict[int, dict[str, float]] = {}
    for batch in benchmark.get("batches") or []:
        runs = batch.get("runs") or []
        for metric in metrics:
            values = [r["values"][metric] for r in runs if metric in (r.get("values") or {})]
            if values and batch.get("status", "ok") == "ok":
                medians.setdefault(int(batch["batch_size"]), {})[metric] = float(np.median(values))
    return medians
