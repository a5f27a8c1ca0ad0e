"""The verdict table (terminal, markdown report, step summary), made from a JSON report document.

One row per test, metric and batch size, in a stable order (test, metric, batch size), so a second
look or a later session does not reshuffle it. Medians carry their units. The one ratio now/baseline shown is the
one the verdict rests on: the gate's estimate (judge/stats.py: the 20%-trimmed mean of the log values) with its 95%
interval, or for a metric held to a tolerance (peak memory, an instruction count) the ratio of its medians, with no
interval; with the bad direction said ("higher is worse" for a latency, "lower is worse" for a throughput). The
ratio of the medians of a gated row, which on a busy runner can differ from the estimate by half (1.523 beside
1.023), is left to the JSON report (`medians_ratio`). Then the one-sided p with its adjustment for the family of rows
and looks (judge/procedure.py). An "improved" row shows the p-value of the improving direction. Benchmarks that were
created, updated, refused or missing (no comparison) show the medians measured now.

A verdict cell is at most CELL_LIMIT characters: the verdict and the head of its note (up to its first '; ',
' (' or '. '; notes are worded so their head says what happened). The whole note is in the test's failure text
or warning, and under the markdown table (`note_details`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..measure.metrics import DEFAULT_GATED_SERVER, DEFAULT_GATED_SPLIT, METRICS
from .tables import table

#: The most characters of a verdict cell (issue 22: a refusal cell was ~330 characters).
CELL_LIMIT = 120
_HEAD_ENDS = ("; ", " (", ". ")

HEADER = (
    "Test",
    "Metric",
    "Batch Size",
    "Baseline (median)",
    "Now (median)",
    "Ratio estimate [95% CI]",
    "p (adjusted)",
    "Verdict",
)
METRIC_ORDER = {name: i for i, name in enumerate(METRICS)}


def worse_direction(metric: str, definitions: Mapping[str, Any] | None = None) -> str | None:
    """'higher is worse' / 'lower is worse' for the metric as printed, None when unknown."""
    better = ((definitions or {}).get(metric) or {}).get("better") or (
        METRICS[metric].better if metric in METRICS else None
    )
    return {"lower": "higher is worse", "higher": "lower is worse"}.get(better or "")


def _unit(metric: str, definitions: Mapping[str, Any] | None) -> str:
    unit = ((definitions or {}).get(metric) or {}).get("unit")
    return unit if unit is not None else (METRICS[metric].unit if metric in METRICS else "")


def _value(value: float | None, unit: str) -> str:
    return "" if value is None else f"{value:.4g} {unit}".strip()


def sort_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    metric = str(row.get("metric", ""))
    return (
        str(row.get("nodeid", "")),
        str(row.get("key", "")),
        metric != "*",
        METRIC_ORDER.get(metric, len(METRIC_ORDER)),
        metric,
        int(row.get("batch_size") or 0),
    )


def _gated(benchmark: Mapping[str, Any], summary: Mapping[str, Any]) -> Sequence[str]:
    chosen = (benchmark.get("scenario") or {}).get("metrics")
    if chosen:
        return chosen
    return DEFAULT_GATED_SPLIT if "prefill_ms" in summary else DEFAULT_GATED_SERVER


def unjudged_rows(outcome: Mapping[str, Any], benchmark: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Rows for a benchmark that was not compared (created, updated, refused, missing): its medians now."""
    base = {
        "key": outcome.get("key"),
        "nodeid": outcome.get("nodeid"),
        "baseline": None,
        "ratio": None,
        "ci_low": None,
        "ci_high": None,
        "p_value": None,
        "p_adjusted": None,
        "verdict": outcome.get("status"),
        "note": "",
    }
    rows = []
    for batch in (benchmark or {}).get("batches") or []:
        if batch.get("status") != "ok":
            rows.append(
                {
                    **base,
                    "metric": "*",
                    "batch_size": batch.get("batch_size"),
                    "now": None,
                    "note": f"{batch.get('status')}: {batch.get('error')}",
                }
            )
            continue
        summary = batch.get("summary") or {}
        for metric in _gated(benchmark or {}, summary):
            if metric in summary:
                rows.append(
                    {**base, "metric": metric, "batch_size": batch.get("batch_size"), "now": summary[metric].get("p50")}
                )
    return rows or [{**base, "metric": "", "batch_size": 0, "now": None}]


def document_rows(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every row of a report document, judged or not, in the stable order."""
    benchmarks = {(b.get("nodeid"), b.get("key")): b for b in document.get("benchmarks") or []}
    rows = [dict(v) for v in document.get("verdicts") or []]
    judged = {(r.get("nodeid"), r.get("key")) for r in rows}
    for outcome in document.get("outcomes") or []:
        ident = (outcome.get("nodeid"), outcome.get("key"))
        if ident not in judged:
            rows.extend(unjudged_rows(outcome, benchmarks.get(ident)))
    for row in rows:
        measured = (benchmarks.get((row.get("nodeid"), row.get("key"))) or {}).get("measured") or {}
        row.setdefault("measured", measured)
    return sorted(rows, key=sort_key)


def cells(row: Mapping[str, Any], definitions: Mapping[str, Any] | None = None) -> list[str]:
    metric = str(row.get("metric", ""))
    unit = _unit(metric, definitions)
    base, now = row.get("baseline"), row.get("now")
    ratio = ""
    if row.get("ratio") is not None:
        worse = worse_direction(metric, definitions)
        ratio = f"{row['ratio']:.3f}"  # held to a tolerance (memory, a count): the medians' ratio, no interval
        if row.get("ci_low") is not None:
            ratio += f" [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        ratio += f" ({worse})" if worse else ""
    if row.get("verdict") == "improved" and row.get("p_better") is not None:
        p = f"{row['p_better']:.2g} (improving)"
    else:
        p = "" if row.get("p_value") is None else f"{row['p_value']:.2g} ({row['p_adjusted']:.2g})"
    verdict = verdict_cell(str(row.get("verdict") or ""), str(row.get("note") or ""))
    return [
        str(row.get("key") or ""),
        metric,
        str(row.get("batch_size") or ""),
        _value(base, unit),
        _value(now, unit),
        ratio,
        p,
        verdict,
    ]


def shown_note(note: str) -> str:
    """What a cell shows of a row's note: nothing for the numbers' own note (n=...), else its head."""
    if not note or note.startswith("n="):
        return ""
    cuts = [i for i in (note.find(end) for end in _HEAD_ENDS) if i > 0]
    return note[: min(cuts)] if cuts else note


def verdict_cell(verdict: str, note: str) -> str:
    """`verdict: head of the note`, at most CELL_LIMIT characters."""
    head = shown_note(note)
    text = f"{verdict}: {head}" if head else verdict
    return text if len(text) <= CELL_LIMIT else text[: CELL_LIMIT - 1] + "…"


def note_details(document: Mapping[str, Any]) -> list[str]:
    """The whole note of every row whose cell shows only its head, one line each, in the table's order."""
    details = []
    for row in document_rows(document):
        note, verdict = str(row.get("note") or ""), str(row.get("verdict") or "")
        if shown_note(note) and verdict_cell(verdict, note) != f"{verdict}: {note}":
            where = f"{row.get('key')}, {'batch size' if row.get('metric') == '*' else row.get('metric')}"
            details.append(
                f"{where}{'' if row.get('metric') == '*' else ' at batch size'} {row.get('batch_size')}: "
                f"{row.get('verdict')}: {note}"
            )
    return details


def measured_cell(row: Mapping[str, Any]) -> str:
    measured = row.get("measured") or {}
    when = str(measured.get("created") or "")[:16].replace("T", " ")
    commit = str(measured.get("commit") or "")[:10] + ("+dirty" if measured.get("dirty") else "")
    return f"{when} @ {commit}".strip(" @") if when or commit else ""


def table_rows(document: Mapping[str, Any], *, with_measured: bool) -> tuple[tuple[str, ...], list[list[str]]]:
    definitions = document.get("definitions")
    rows = [cells(r, definitions) + ([measured_cell(r)] if with_measured else []) for r in document_rows(document)]
    return HEADER + (("Measured (UTC @ commit)",) if with_measured else ()), rows


def markdown_table(document: Mapping[str, Any], *, with_measured: bool = True) -> str:
    header, rows = table_rows(document, with_measured=with_measured)
    return table(header, rows) if rows else ""
