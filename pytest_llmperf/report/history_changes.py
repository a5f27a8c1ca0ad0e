"""The reports' view of the history across jobs: `<report dir>/history.json` (history/summary.py), written by the
session before its reports, as a table of events (the changes of a machine's series at one place), a table of
changes and a small plot per series in the HTML page, and the confirmed events in the markdown report and the job
summary.

The plots are inline SVG drawn here (no script, no network, as the rest of the page): per commit of the default
branch a dot with a bar from the lowest to the highest per-process median, the levels of the segments between change
points, a vertical line at each change point (solid: confirmed, dashed: provisional), a shaded band where the
environment or the machine changed, outlier jobs as rings and excluded runs as grey crosses.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..history.settings import ANALYSIS_FILE, ANALYSIS_FORMAT
from .tables import table

WIDTH, HEIGHT, PAD = 560, 170, 36
COLOURS = {"regression": "#c62828", "improvement": "#2e7d32"}


def read(report_dir: Path | str) -> dict[str, Any] | None:
    try:
        data = json.loads((Path(report_dir) / ANALYSIS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == ANALYSIS_FORMAT else None


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _now(change: Mapping[str, Any]) -> str:
    """Where a confirmed change came after this one: the newest level against the level before it (a regression
    fixed since reads about 0). Absent from documents written before it existed."""
    now = change.get("now")
    return "" if now is None else f" (now {now:+.1%})"


def _row(change: Mapping[str, Any]) -> str:
    kind = str(change["kind"])
    fails = bool(change.get("fails"))  # what --llmperf-history-check=fail fails on; absent from older documents
    flags = ", ".join(
        w for w, on in (("environment", change["env_changed"]), ("machine", change["machine_changed"])) if on
    )
    return (
        f"<tr class='change {_esc(change['state'])}{' failing' if fails else ''}'><td class='state'>"
        f"{_esc(change['state'])}{' (failing)' if fails else ''}</td>"
        f"<td>{_esc(change['series'])}</td><td><code>{_esc(change['last_good'][:12])}</code>..<code>"
        f"{_esc(change['first_bad'][:12])}</code></td><td>{change['before']:.4g} &rarr; {change['after']:.4g}</td>"
        f"<td class='{kind}' style='color:{COLOURS[kind]}'>{change['change']:+.1%} {kind}{_now(change)}</td>"
        f"<td>{change['commits_after']}</td><td>{_esc(flags or '-')}</td><td>{_esc(change['mark'] or '-')}</td>"
        f"<td><code>{_esc(change['series_key'])}@{_esc(change['first_bad'][:12])}</code></td></tr>"
    )


def _event_what(event: Mapping[str, Any]) -> str:
    """The series an event moved: the one's label, or how many of the machine's and what that suggests."""
    if event["series_moved"] == 1:
        return str(event["series"][0])
    text = f"{event['series_moved']} of {event['series_total']} series ({event['target']}, {event['machine']})"
    if event["shared"]:
        text += ", most of this machine's alike: likely the runner or its environment"
    if event["changed_there"]:
        text += f" ({' and '.join(event['changed_there'])} changed there)"
    return text


def _size(event: Mapping[str, Any]) -> str:
    low, high = event["sizes"]
    return f"{low:+.1%}" if event["series_moved"] == 1 or low == high else f"{low:+.1%} to {high:+.1%}"


def _event_row(event: Mapping[str, Any]) -> str:
    kind, fails = str(event["kind"]), bool(event["fails"])
    colour = COLOURS.get(kind, "#6d4c41")
    listed = "".join(f"<li>{_esc(label)}</li>" for label in event["series"])
    series = (
        _esc(event["series"][0])
        if event["series_moved"] == 1
        else f"<details><summary>{_esc(_event_what(event))}</summary><ul>{listed}</ul></details>"
    )
    return (
        f"<tr class='event {_esc(event['state'])}{' failing' if fails else ''}'><td class='state'>"
        f"{_esc(event['state'])}{' (failing)' if fails else ''}</td><td>{series}</td><td><code>"
        f"{_esc(event['last_good'][:12])}</code>..<code>{_esc(event['first_bad'][:12])}</code></td>"
        f"<td class='{_esc(kind)}' style='color:{colour}'>{_size(event)} {_esc(kind)}</td>"
        f"<td>{_esc(', '.join(event['changed_there']) or '-')}</td><td>{_esc(event['mark'] or '-')}</td>"
        f"<td><code>{_esc(event['id'] if event['series_moved'] > 1 else event['changes'][0])}</code></td></tr>"
    )


def _plot(series: Mapping[str, Any], n: int) -> str:
    points = series["points"]
    if not points:
        return ""
    lows = [p["low"] for p in points] + [x["value"] for x in series["excluded"]]
    highs = [p["high"] for p in points] + [x["value"] for x in series["excluded"]]
    bottom, top = min(lows), max(highs)
    span = (top - bottom) or abs(top) or 1.0
    bottom, top = bottom - 0.08 * span, top + 0.08 * span

    def x(i: float) -> float:
        return PAD + (WIDTH - 2 * PAD) * (i / max(len(points) - 1, 1))

    def y(v: float) -> float:
        return HEIGHT - PAD + (2 * PAD - HEIGHT) * (v - bottom) / (top - bottom)

    parts = [
        f"<rect x='{x(i - 0.5):.1f}' y='{PAD / 2}' width='{x(1) - x(0):.1f}' height='{HEIGHT - 1.5 * PAD}' "
        f"fill='#fff3c4'><title>{what} changed at {_esc(points[i]['commit'][:12])}</title></rect>"
        for what, key in (("environment", "env_changes"), ("machine", "machine_changes"))
        for i in series[key]
    ]
    for i, state in zip(series["change_points"], series["states"]):
        dash = "" if state == "confirmed" else " stroke-dasharray='4 3'"
        parts.append(
            f"<line class='cp {state}' x1='{x(i - 0.5):.1f}' x2='{x(i - 0.5):.1f}' y1='{PAD / 2}' "
            f"y2='{HEIGHT - PAD}' stroke='#c62828' stroke-width='1.5'{dash}/>"
        )
    for seg in series["segments"]:
        parts.append(
            f"<line class='level' x1='{x(seg['start']):.1f}' x2='{x(seg['end'] - 1):.1f}' "
            f"y1='{y(seg['level']):.1f}' y2='{y(seg['level']):.1f}' stroke='#1565c0' stroke-width='2'/>"
        )
    outliers = set(series["outliers"])
    for i, p in enumerate(points):
        tip = f"{_esc(p['commit'][:12])} {_esc(p.get('time') or '')}: {p['value']:.4g} ({p['low']:.4g}-{p['high']:.4g})"
        fill = "none" if i in outliers else "#37474f"
        parts.append(
            f"<line x1='{x(i):.1f}' x2='{x(i):.1f}' y1='{y(p['low']):.1f}' y2='{y(p['high']):.1f}' "
            f"stroke='#90a4ae'/><circle class='point' cx='{x(i):.1f}' cy='{y(p['value']):.1f}' r='2.6' "
            f"fill='{fill}' stroke='#37474f'><title>{tip}</title></circle>"
        )
    for e in series["excluded"]:
        if e["at"] is not None:
            cx, cy = x(e["at"]), y(e["value"])
            parts.append(
                f"<path class='excluded' d='M{cx - 3:.1f},{cy - 3:.1f}l6,6m0,-6l-6,6' stroke='#9e9e9e'>"
                f"<title>excluded run at {_esc(e['commit'][:12])}</title></path>"
            )
    unit = _esc(series["unit"])
    axis = (
        f"<text x='4' y='{y(top - 0.08 * span) + 4:.1f}' font-size='10'>{top - 0.08 * span:.4g}</text>"
        f"<text x='4' y='{y(bottom + 0.08 * span) + 4:.1f}' font-size='10'>{bottom + 0.08 * span:.4g}</text>"
        f"<text x='{WIDTH / 2:.0f}' y='{HEIGHT - 6}' font-size='10' text-anchor='middle'>commits of the default "
        f"branch, oldest first ({len(points)}); {unit}</text>"
    )
    return (
        f"<figure class='history-series' id='hseries{n}' data-key='{_esc(series['key'])}'>"
        f"<figcaption>{_esc(series['label'])}</figcaption><svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' "
        f"height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}' role='img'><rect width='{WIDTH}' height='{HEIGHT}' "
        f"fill='white' stroke='#ddd'/>{''.join(parts)}{axis}</svg></figure>"
    )


def section(documents: Sequence[Mapping[str, Any]]) -> str:
    """The HTML history section for the report directory of these documents (empty without an analysis)."""
    dirs = {
        str((d.get("settings") or {}).get("report_dir"))
        for d in documents
        if (d.get("settings") or {}).get("report_dir")
    }
    data = next((found for d in sorted(dirs) if (found := read(d)) is not None), None)
    if data is None:
        return ""
    rows = "".join(_row(c) for c in data["changes"])
    events = "".join(_event_row(e) for e in data.get("events", []))  # absent from documents written before events
    creep = "".join(
        f"<li>{_esc(c['series'])}: <b style='color:{COLOURS[c['kind']]}'>{c['drift']:+.1%}</b> ({_esc(c['kind'])}) "
        f"from <code>{_esc(c['from'][:12])}</code> to <code>{_esc(c['to'][:12])}</code></li>"
        for c in data["creep"]
    )
    warnings = "".join(f"<li>{_esc(w)}</li>" for w in data["warnings"])
    return (
        "<h2 id='history-changes'>History across jobs</h2>"
        f"<p>{data['series_analysed']} series of {_esc(data['store'])}, analysed with {_esc(data['method'])}; the "
        f"smallest change that matters: {data['min_effect']:.0%} (docs/history.md).</p>"
        + (
            "<h3>Events</h3><p class='note'>The changes of a machine's series within two commits of each other are one "
            "event: one alarm, failed on and marked as one.</p><table class='history-events'><tr><th>state</th>"
            "<th>series</th><th>last good..first bad</th><th>change</th><th>changed there</th><th>mark</th>"
            f"<th>id</th></tr>{events}</table><h3>Changes, series by series</h3>"
            if events
            else ""
        )
        + (
            "<table class='history-changes'><tr><th>state</th><th>series</th><th>last good..first bad</th>"
            "<th>before &rarr; after</th><th>change</th><th>commits since</th><th>changed there</th><th>mark</th>"
            f"<th>id</th></tr>{rows}</table>"
            if rows
            else "<p class='note'>No change point in these series.</p>"
        )
        + (f"<h3>Creep since the anchor</h3><ul class='creep'>{creep}</ul>" if creep else "")
        + (
            f"<details><summary>{len(data['warnings'])} series noisier than the smallest change that matters"
            f"</summary><ul class='history-warnings'>{warnings}</ul></details>"
            if warnings
            else ""
        )
        + "".join(_plot(s, n) for n, s in enumerate(data["series"]))
    )


def markdown_section(report_dir: Path | str) -> str:
    """The confirmed events (one row for the changes of a machine's series at one place) and flagged creep, for the
    markdown report and the job summary (empty when none)."""
    data = read(report_dir)
    if data is None:
        return ""
    confirmed = [e for e in data.get("events", []) if e["state"] == "confirmed"]
    by_id = {c.get("id"): c for c in data["changes"]}
    rows = [
        [
            _event_what(e),
            f"{e['last_good'][:12]}..{e['first_bad'][:12]}",
            f"{_size(e)} {e['kind']}"
            + (_now(by_id.get(e["changes"][0], {})) if e["series_moved"] == 1 else "")
            + (", failing" if e["fails"] else ""),
            e["mark"] or "",
        ]
        for e in confirmed
    ]
    if not confirmed and not data["creep"]:
        return ""
    rows += [
        [f"{c['series']} (creep)", f"{c['from'][:12]}..{c['to'][:12]}", f"{c['drift']:+.1%} {c['kind']}", ""]
        for c in data["creep"]
    ]  # escaped by tables.table: a test id may hold `|`, `[` or `<`
    lines = ["", "## History across jobs", "", table(["series", "last good..first bad", "change", "mark"], rows)]
    return "\n".join(lines) + "\n"
