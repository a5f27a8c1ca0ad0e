"""The analysis as data for the reports: `<report dir>/history.json`, read by the HTML report's history section and
the markdown report (report/history_changes.py), and printed by the command line.

First the events (history/analysis.py: the changes of a machine's series at one place, as one item with the series it
moved and the spread of their sizes), then the changes one series at a time.

Per change: the series, the commit range (last good, first bad), the levels before and after, the change in % as a
regression or improvement by the metric's direction, where a confirmed change came after it the newest level against
the level before it (`now`), its state and mark, and whether the environment or the machine changed there. Per
series with something to show: its points (value and spread per commit), segment levels, change points, outliers,
excluded runs, environment changes and the creep since the anchor."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from .analysis import Change, Event, SeriesAnalysis, events, level
from .detect import Method
from .settings import ANALYSIS_FORMAT

FORMAT = ANALYSIS_FORMAT
MAX_PLOTTED = 24  # series drawn in the report: confirmed changes first, then creep, provisional changes, noise


def change_json(change: Change, min_effect: float) -> dict[str, Any]:
    return {
        "id": change.id,
        "series_key": change.series_key,
        "series": change.label,
        "last_good": change.last_good,
        "first_bad": change.first_bad,
        "before": change.before,
        "after": change.after,
        "change": change.change,
        "now": change.now,
        "reached_at": change.reached_at,
        "fails": change.fails(min_effect),  # what --llmperf-history-check=fail fails on (Change.fails)
        "kind": change.kind,
        "state": change.state,
        "mark": change.mark,
        "commits_after": change.commits_after,
        "p_value": change.p_value,
        "env_changed": change.env_changed,
        "machine_changed": change.machine_changed,
        "resolution": change.resolution,
    }


def event_json(event: Event) -> dict[str, Any]:
    low, high = event.sizes
    return {
        "id": event.id,
        "state": event.state,
        "kind": event.kind,
        "target": event.target,
        "machine": event.machine,
        "last_good": event.last_good,
        "first_bad": event.first_bad,
        "sizes": [low, high],
        "series_moved": len(event.changes),
        "series_total": event.series_total,
        "shared": event.shared,  # most of the machine's series alike: likely the runner or its environment
        "changed_there": event.changed_there,
        "fails": event.fails,
        "mark": event.mark,
        "describe": event.describe(),
        "series": [c.label for c in event.changes],
        "changes": [c.id for c in event.changes],
    }


def _segments(values: Sequence[float], points: Sequence[int], outliers: Sequence[int]) -> list[dict[str, Any]]:
    edges = [0, *points, len(values)]
    found = []
    for a, b in pairwise(edges):
        kept = [values[i] for i in range(a, b) if i not in outliers]
        if kept:
            found.append({"start": a, "end": b, "level": level(kept)})
    return found


def series_json(a: SeriesAnalysis) -> dict[str, Any]:
    s = a.series
    env_changes = [i for i in range(1, len(s.points)) if s.points[i].env_fp != s.points[i - 1].env_fp]
    machine_changes = [i for i in range(1, len(s.points)) if s.points[i].machine_fp != s.points[i - 1].machine_fp]
    commits = {p.commit_sha: i for i, p in enumerate(s.points)}
    return {
        "key": s.key,
        "label": s.id.label(),
        "test": s.id.test,
        "metric": s.id.metric,
        "batch_size": s.id.batch_size,
        "target": s.id.target,
        "machine": s.id.machine,
        "unit": s.unit,
        "direction": s.direction,
        "noise": a.noise,
        "points": [
            {
                "commit": p.commit_sha,
                "time": p.commit_time,
                "value": p.value,
                "low": p.low,
                "high": p.high,
                "sources": p.sources,
            }
            for p in s.points
        ],
        "excluded": [{"commit": p.commit_sha, "value": p.value, "at": commits.get(p.commit_sha)} for p in s.excluded],
        "segments": _segments(s.values, a.points, [*a.outliers, *a.set_aside]),
        "change_points": a.points,
        "states": [c.state for c in a.changes],
        "outliers": a.outliers,
        "set_aside": a.set_aside,
        "env_changes": env_changes,
        "machine_changes": machine_changes,
        "creep": None
        if a.creep is None
        else {
            "from": s.points[a.analysed[a.creep.first[0]]].commit_sha,
            "to": s.points[a.analysed[a.creep.last[1] - 1]].commit_sha,
            "drift": a.creep.drift,
            "p_value": a.creep.p_value,
            "flagged": a.creep.flagged,
            "kind": "regression" if a.creep.drift * s.direction < 0 else "improvement",
        },
        "warnings": a.warnings,
    }


def document(analyses: Sequence[SeriesAnalysis], method: Method, min_effect: float, store: str) -> dict[str, Any]:
    def rank(a: SeriesAnalysis) -> tuple:
        """Confirmed changes first, then creep, then provisional changes, then noisy series."""
        confirmed = any(c.state == "confirmed" for c in a.changes)
        return (not confirmed, not (a.creep and a.creep.flagged), not a.changes, not a.warnings, a.series.id.label())

    plotted = sorted(analyses, key=rank)[:MAX_PLOTTED]
    changes = [c for a in analyses for c in a.changes]
    changes.sort(key=lambda c: (c.state != "confirmed", -abs(c.change)))
    return {
        "format": FORMAT,
        "store": store,
        "method": method.describe(),
        "min_effect": min_effect,
        "series_analysed": len(analyses),
        "events": [event_json(e) for e in events(analyses, min_effect)],
        "changes": [change_json(c, min_effect) for c in changes],
        "creep": [
            {"series": a.series.id.label(), **series_json(a)["creep"]} for a in analyses if a.creep and a.creep.flagged
        ],
        "warnings": [w for a in analyses for w in a.warnings],
        "series": [series_json(a) for a in plotted],
    }
