"""`reports/index.html`: the plots of one or more per-target JSON reports, in one self-contained page.

Three views: latency and throughput against batch size (seeds 000/003's sweeps; a line per target and
benchmark, median with the interquartile range of the runs, oom marked), baseline vs now (the gate's
ratio with its 95% CI per metric and batch size), and each benchmark's history over commits (git
history of its baseline file, plus the reports' own measurements).

The figures are matplotlib SVG inlined in the HTML: no script, no network, opens from disk, prints.
matplotlib is the `report` extra, imported only here when a page is written; without it the page is
skipped with one line saying so (`MissingExtra`), and nothing else of the plugin needs it.

The history over commits (the trend): each committed version of `baselines/<device>/<module>.json` whose
entry for the benchmark changed is one point (labelled with the commit the baseline was measured at and its
date); each JSON report that holds the benchmark adds its own measurement. A baseline's value per batch size is
the median of its per-process medians (what the gate compares), read through the store's own parser
(`BaselineEntry.from_json`), so a version in a format it cannot read is left out, never misread. Git is
asked with a timeout; no git, no repository or no history gives the report points only, never an error.
"""

from __future__ import annotations

import html
import json
import math
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..judge.baseline_layout import parse
from ..judge.baselines import BaselineEntry
from ..judge.rows import DEFAULT_RTOL as COUNT_RTOL
from ..measure.instructions import INSTRUCTION_METRICS
from . import history_changes
from .markdown import write_atomic
from .stored import batch_medians, run_metric_values

SPLIT_METRICS = ("prefill_ms", "decode_token_ms", "throughput_tokens_per_s")
SERVER_METRICS = ("ttft_ms", "itl_ms", "throughput_tokens_per_s")
TITLES = {
    "prefill_ms": "Prefill latency",
    "decode_token_ms": "Decode latency per token",
    "throughput_tokens_per_s": "Throughput (end to end)",
    "ttft_ms": "Time to first token",
    "itl_ms": "Inter-token latency",
}
UNITS = {"tokens/secs": "tokens/s"}
EXTRA_HINT = "pip install 'pytest-llmperf[report]'"


class MissingExtra(ImportError):
    """matplotlib (the `report` extra) is not installed; the message is the one line to show."""


def _plots() -> Any:
    try:
        from . import plots
    except ImportError as exc:
        raise MissingExtra(f"HTML report skipped: matplotlib is not installed ({EXTRA_HINT})") from exc
    return plots


def _unit(document: Mapping[str, Any], metric: str) -> str:
    unit = ((document.get("definitions") or {}).get(metric) or {}).get("unit", "")
    return UNITS.get(unit, unit)


def _better(document: Mapping[str, Any], metric: str) -> str:
    return ((document.get("definitions") or {}).get(metric) or {}).get("better", "lower")


def _metrics_of(benchmark: Mapping[str, Any]) -> tuple[str, ...]:
    for batch in benchmark.get("batches") or []:
        for run in batch.get("runs") or []:
            if "prefill_ms" in (run.get("values") or {}):
                return SPLIT_METRICS
    return SERVER_METRICS


def _series(plots: Any, label: str, benchmark: Mapping[str, Any], metric: str) -> Any:
    s = plots.Series(label)
    for batch in sorted(benchmark.get("batches") or [], key=lambda b: b.get("batch_size", 0)):
        bs = int(batch.get("batch_size", 0))
        status = batch.get("status", "ok")
        values = [value for _, value in run_metric_values(batch.get("runs"), metric)]
        if status == "oom":
            s.oom.append(bs)
        elif status != "ok":
            s.failed.append(bs)
        elif values:
            low, median, high = np.percentile(values, [25, 50, 75])
            s.batch_sizes.append(bs)
            s.medians.append(float(median))
            s.lows.append(float(low))
            s.highs.append(float(high))
    return s


def _figure_id(benchmark: Mapping[str, Any]) -> str:
    return benchmark.get("group") or f"{benchmark.get('module', '')}::{benchmark.get('key', '')}"


def sweep_section(plots: Any, documents: Sequence[Mapping[str, Any]]) -> str:
    units: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
    single: list[str] = []
    for doc in documents:
        for b in doc.get("benchmarks") or []:
            if len({batch.get("batch_size") for batch in b.get("batches") or []}) < 2:
                single.append(f"{doc.get('device')}: {b.get('key')}")
                continue
            units.setdefault(_figure_id(b), []).append((doc, b))
    parts = [
        "<h2 id='sweeps'>Latency and throughput against batch size</h2>",
        "<p>Median of the runs per batch size; the bars span the 25th to 75th percentile. "
        "&times; at the top edge: the batch size ran out of memory (oom).</p>",
    ]
    for n, (unit, members) in enumerate(units.items()):
        one_each = len({doc.get("device") for doc, _ in members}) == len(members)
        metrics = _metrics_of(members[0][1])
        panels = []
        for metric in metrics:
            series = [
                _series(plots, str(doc.get("device")) if one_each else f"{doc.get('device')} {b.get('key')}", b, metric)
                for doc, b in members
            ]
            panels.append((TITLES.get(metric, metric), _unit(members[0][0], metric), series))
        first = members[0][1]
        scenario = first.get("scenario") or {}
        title = (
            f"{unit} ({(first.get('backend') or {}).get('model', '?')}, sequence length "
            f"{scenario.get('sequence_length', '?')}, decode length {scenario.get('decode_length', '?')})"
        )
        parts.append(f"<figure class='plot sweep'>{plots.sweep_figure(title, panels, f'sweep{n}')}</figure>")
    if not units:
        parts.append("<p>No benchmark in these reports ran more than one batch size.</p>")
    if single:
        parts.append(
            f"<p class='note'>Measured at one batch size only (their tables are in the markdown report): "
            f"{html.escape(', '.join(single))}.</p>"
        )
    return "\n".join(parts)


def _rtol(benchmark: Mapping[str, Any] | None, document: Mapping[str, Any], metric: str) -> float | None:
    scenario = (benchmark or {}).get("scenario") or {}
    fallback = (
        COUNT_RTOL
        if metric in INSTRUCTION_METRICS
        else scenario.get("rtol", (document.get("settings") or {}).get("rtol"))
    )  # counts have a tolerance of their own
    value = (scenario.get("rtol_per_metric") or {}).get(metric, fallback)
    return float(value) if isinstance(value, (int, float)) else None


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _median_text(value: Any, unit: str) -> str:
    return f"{value:.4g} {unit}" if _num(value) else "n/a"


def ratio_section(plots: Any, documents: Sequence[Mapping[str, Any]]) -> str:
    parts = [
        "<h2 id='verdicts'>Baseline vs now</h2>",
        "<p>Per gated metric and batch size: the estimated ratio now / baseline (the gate's estimate "
        "of the shift, as a ratio, with its 95% confidence interval), coloured by verdict. Latencies regress "
        "above the dotted line (1 + rtol), throughputs below it (1 / (1 + rtol)); the tables show the same "
        "estimate, and the JSON report also the ratio of the medians. An instruction count (callgrind) is drawn "
        "as its point: it has no sampling interval, and is held to its own tolerance.</p>",
    ]
    n = 0
    for doc in documents:
        benchmarks = {b.get("key"): b for b in doc.get("benchmarks") or []}
        by_module: dict[str, list[Mapping[str, Any]]] = {}
        for row in doc.get("verdicts") or []:
            if all(_num(row.get(k)) for k in ("ratio", "ci_low", "ci_high")) or (
                _num(row.get("ratio")) and row.get("metric") in INSTRUCTION_METRICS
            ):
                by_module.setdefault(str(row.get("nodeid", "")).split("::")[0], []).append(row)
        if not by_module:
            parts.append(
                f"<p>{html.escape(str(doc.get('device')))}: nothing compared with a baseline in this "
                f"report (baselines created, updated, missing or refused).</p>"
            )
        for module, rows in by_module.items():
            intervals, table = [], []
            for row in rows:
                metric = str(row.get("metric"))
                rtol = _rtol(benchmarks.get(row.get("key")), doc, metric)
                higher = _better(doc, metric) == "higher"
                bound = None if rtol is None else (1 / (1 + rtol) if higher else 1 + rtol)
                label = f"{row.get('key')} {metric} bs {row.get('batch_size')}"
                # a count has no sampling interval (judge/rows.py): drawn as its point
                counted = not _num(row.get("ci_low"))
                low, high = (row["ratio"], row["ratio"]) if counted else (row["ci_low"], row["ci_high"])
                estimate = (
                    f"{row['ratio']:.4f} (a count, held to its tolerance)"
                    if counted
                    else f"{row['ratio']:.3f} [{low:.3f}, {high:.3f}]"
                )
                intervals.append(
                    plots.Interval(
                        label,
                        row["ratio"],
                        low,
                        high,
                        str(row.get("verdict")),
                        None if higher else bound,
                        bound if higher else None,
                    )
                )
                unit = _unit(doc, metric)
                table.append(
                    f"<tr><td>{html.escape(str(row.get('key')))}</td><td>{html.escape(metric)}</td>"
                    f"<td>{row.get('batch_size')}</td><td>{_median_text(row.get('baseline'), unit)}</td>"
                    f"<td>{_median_text(row.get('now'), unit)}</td>"
                    f"<td>{estimate}</td>"
                    f"<td class='{html.escape(str(row.get('verdict')))}'>"
                    f"{html.escape(str(row.get('verdict')))}</td></tr>"
                )
            svg = plots.ratio_figure(f"{doc.get('device')}: {module}", intervals, f"ratio{n}")
            n += 1
            parts.append(f"<figure class='plot ratio'>{svg}</figure>")
            parts.append(
                "<details><summary>the numbers</summary><table><tr><th>test</th><th>metric</th>"
                "<th>batch size</th><th>baseline median</th><th>now median</th>"
                "<th>estimated ratio [95% CI]</th><th>verdict</th></tr>" + "".join(table) + "</table></details>"
            )
    return "\n".join(parts)


# The history over commits: points from the git history of a baseline file, and from the reports.
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


def history_section(plots: Any, documents: Sequence[Mapping[str, Any]]) -> str:
    parts = [
        "<h2 id='history'>History over commits</h2>",
        "<p>Per batch size, the median of the per-process medians (with one process: of the runs) at each "
        "recorded baseline (from the git history of the baseline file; labelled with the commit it was "
        "measured at) and in these reports (labelled with the target).</p>",
    ]
    cache: dict[Path, Versions] = {}
    benchmarks: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
    for doc in documents:
        for b in doc.get("benchmarks") or []:
            benchmarks.setdefault(f"{b.get('module', '')}::{b.get('key', '')}", []).append((doc, b))
    for n, (name, members) in enumerate(benchmarks.items()):
        metrics = _metrics_of(members[0][1])
        measured_sizes = sorted({int(batch["batch_size"]) for _, b in members for batch in b.get("batches") or []})
        points: list[Point] = []
        for doc, b in members:
            baseline_file = _baseline_file(doc, b)
            if baseline_file is not None:
                points += [
                    p
                    for p in baseline_points(baseline_file, str(b.get("key")), measured_sizes, metrics, cache)
                    if p.label not in {q.label for q in points}
                ]
            points.append(report_point(doc, b, metrics))
        points.sort(key=lambda p: p.when)
        sizes = sorted({bs for p in points for bs in p.medians})
        if not sizes:  # counted and not timed (--llmperf-instructions-only), or no batch size ran
            parts.append(f"<p class='note'>{html.escape(name)}: no timed runs to plot.</p>")
            continue
        panels = [
            (
                m,
                TITLES.get(m, m),
                _unit(members[0][0], m),
                {bs: [p.medians.get(bs, {}).get(m) for p in points] for bs in sizes},
            )
            for m in metrics
        ]
        svg = plots.history_figure(name, [p.label for p in points], panels, f"history{n}")
        parts.append(f"<figure class='plot history' id='history{n}'>{svg}</figure>")
        parts.append(_history_numbers(points, metrics, sizes, members[0][0]))
    return "\n".join(parts)


def _history_numbers(
    points: Sequence[Point], metrics: Sequence[str], sizes: Sequence[int], document: Mapping[str, Any]
) -> str:
    """The plotted values as a table, one row per point (oldest first)."""
    columns = [(m, bs) for m in metrics for bs in sizes]
    head = "".join(f"<th>{html.escape(m)} bs {bs} ({html.escape(_unit(document, m))})</th>" for m, bs in columns)
    rows = "".join(
        f"<tr><td>{html.escape(p.label)}</td>"
        + "".join(
            f"<td data-metric='{html.escape(m)}' data-batch-size='{bs}'>"
            + (f"{p.medians[bs][m]:.6g}" if m in p.medians.get(bs, {}) else "")
            + "</td>"
            for m, bs in columns
        )
        + "</tr>"
        for p in points
    )
    return (
        f"<details class='history-numbers'><summary>the numbers</summary><table><tr><th>point</th>{head}</tr>"
        f"{rows}</table></details>"
    )


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px; color: #222; }
figure.plot { margin: 1em 0; overflow-x: auto; } figure.plot svg { max-width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 0.85em; } td, th { border: 1px solid #ccc; padding: 2px 6px; }
td.regressed { color: #c62828; font-weight: bold; } td.improved { color: #2e7d32; } .note { color: #555; }
"""


def page(documents: Sequence[Mapping[str, Any]]) -> str:
    plots = _plots()
    targets = "".join(
        f"<li><b>{html.escape(str(d.get('device')))}</b>: written {html.escape(str(d.get('created', '?')))}, "
        f"commit {html.escape(str(((d.get('fingerprint') or {}).get('git') or {}).get('commit') or '?')[:12])}, "
        f"{html.escape(', '.join(f'{v} {k}' for k, v in (d.get('counts') or {}).items()))}</li>"
        for d in documents
    )
    body = "\n".join(
        [
            sweep_section(plots, documents),
            ratio_section(plots, documents),
            history_section(plots, documents),
            history_changes.section(documents),  # the history store's changes (history/, docs/history.md)
        ]
    )
    return (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>llmperf: "
        f"{html.escape(', '.join(str(d.get('device')) for d in documents))}</title><style>{STYLE}</style></head>"
        f"<body><h1>llmperf results</h1><ul>{targets}</ul><p><a href='#sweeps'>against batch size</a> · "
        f"<a href='#verdicts'>baseline vs now</a> · <a href='#history'>history</a></p>\n{body}\n</body></html>\n"
    )


def _baseline_file(doc: Mapping[str, Any], bench: Mapping[str, Any]) -> Path | None:
    """The baseline file a benchmark was judged against: as its outcome recorded it (per-machine sets live
    one level deeper on the cpu target), else where a set without a machine keeps it."""
    for outcome in doc.get("outcomes") or []:
        if outcome.get("key") == bench.get("key") and str(outcome.get("baseline") or "").endswith(".json"):
            return Path(outcome["baseline"])
    root, module = (doc.get("settings") or {}).get("baseline_dir"), str(bench.get("module") or "")
    if not (root and module):
        return None
    return Path(root) / str(doc.get("device")) / Path(module).with_suffix(".json")


def write_index(documents: list[dict], path: Path) -> None:
    """Write the page for these per-target JSON reports (report/markdown.py's `json_document`) to `path`.
    Raises MissingExtra (one line to show) without matplotlib."""
    write_atomic(Path(path), page(documents))


def report_documents(report_dir: Path) -> list[dict]:
    """The per-target JSON reports in a report directory, the newest per device (a copy written with
    --llmperf-json into the same directory is not a second target); other JSON files are left alone."""
    newest: dict[str, dict] = {}
    for file in sorted(Path(report_dir).glob("*.json")):
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "device" in data and isinstance(data.get("benchmarks"), list):
            device = str(data["device"])
            if device not in newest or str(data.get("created", "")) > str(newest[device].get("created", "")):
                newest[device] = data
    return list(newest.values())


def write_session_index(report_dir: Path) -> Path | str:
    """At the end of a session: index.html beside the markdown, over every target's JSON in the directory.
    Returns the path written, or the line saying why not."""
    path = Path(report_dir) / "index.html"
    try:
        write_index(report_documents(Path(report_dir)), path)
    except MissingExtra as exc:
        return str(exc)
    return path
