"""The rows of one benchmark: from a measured result and its reference to verdicts a person can act on.

Per batch size: the generated tokens (judge/outputs.py), why a batch cannot be compared (a busy machine, no
reference, units that do not compare), peak memory against a tolerance, and every gated metric through the
decision procedure (judge/stats.py, judge/procedure.py). A row decided at an earlier look keeps its verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np

from ..measure.instructions import INSTRUCTION_METRICS
from ..measure.metrics import (
    MEMORY_METRICS,
    METRICS,
    TAIL_MIN_GAPS,
    gaps_per_run,
    gated_metrics,
    metric_better,
)
from ..measure.records import BatchResult, BenchmarkResult
from ..measure.scenario import Scenario
from . import outputs, procedure, stats
from .baseline_entry import check_value
from .instructions import count_message
from .quality import busy_note
from .units import Comparison, Reference, padded, paired_up, reference_units, runs_of, units_of, with_runs
from .verdicts import COMPARED, Row, Verdict, note_row

PHASES = {
    "prefill": "prefill",
    "decode": "decode",
    "ttft": "time to first token",
    "itl": "decode (inter-token)",
    "throughput": "end-to-end throughput",
    "e2e": "end to end",
}
UNIT_WORDS = {"process": "one value per worker process", "run": "runs of one process (--llmperf-processes=1)"}
#: Peak memory must grow by more than this as well as by memory_rtol: allocator granularity on a small model.
MEMORY_FLOOR_MIB = 16.0
#: Metrics a run has only when it lasts long enough (measure/gpu.py): one a baseline lacks is not missing.
RUN_LENGTH_METRICS = ("energy_j_per_token",)


def phase_of(metric: str) -> str:
    return next((phase for prefix, phase in PHASES.items() if metric.startswith(prefix)), metric)


def unit_of(metric: str) -> str:
    return METRICS[metric].unit if metric in METRICS else ""


def _invalid(values: Sequence[float], metric: str) -> str | None:
    """Why a measured value cannot be compared (NaN, infinite, a time <= 0), or None."""
    return next((problem for v in values if (problem := check_value(v, metric)) is not None), None)


def judge_rows(
    result: BenchmarkResult,
    reference: Reference,
    scenario: Scenario,
    *,
    splits_prefill: bool,
    schedule: procedure.Schedule,
    final: bool,
    max_load: float,
    counters_better: Mapping[str, str] | None = None,
    previous: Sequence[Row] = (),
    family: int | None = None,
) -> list[Row]:
    """Every row of one benchmark at one look. `family` is the number of gated rows judged together (the
    job's, with worker processes); None: this benchmark's own."""
    entry = reference.entry
    earlier = {(r.metric, r.batch_size): r for r in previous if r.verdict in COMPARED}
    rows: list[Row] = []
    comparisons: list[Comparison] = []
    for batch in result.batches:
        rows += _batch_rows(result, batch, reference, scenario, max_load)
        if (
            not batch.ok
            or entry.values.get(batch.batch_size) is None
            or any(r.batch_size == batch.batch_size and r.metric == "*" for r in rows)
        ):
            continue
        unit, current = units_of(batch)
        for metric in gated_metrics(scenario.metrics, splits_prefill):
            if metric in MEMORY_METRICS or metric in INSTRUCTION_METRICS:
                continue  # held to a tolerance: _batch_rows (memory), judge/instructions.py (counts)
            if (metric, batch.batch_size) in earlier:
                rows.append(earlier[(metric, batch.batch_size)])
                continue
            base = reference_units(reference, batch.batch_size, metric)
            if metric in current and not base and reference.side is None and metric not in RUN_LENGTH_METRICS:
                rows.append(
                    note_row(
                        result,
                        metric,
                        batch.batch_size,
                        Verdict.MISSING,
                        "the baseline holds no values of it (recorded before it was gated, or edited): not compared",
                    )
                )
            elif metric not in current or not base:  # e.g. prefill on a server, energy of short runs
                side = "these runs" if metric not in current else "the baseline"
                rows.append(
                    note_row(result, metric, batch.batch_size, Verdict.UNGATED, f"not measured in {side}: not gated")
                )
            elif metric in TAIL_MIN_GAPS and min(gaps_per_run(s) for s in batch.samples) < TAIL_MIN_GAPS[metric]:
                rows.append(
                    note_row(
                        result,
                        metric,
                        batch.batch_size,
                        Verdict.UNGATED,
                        f"runs hold fewer than {TAIL_MIN_GAPS[metric]} token gaps: reported, not gated",
                    )
                )
            elif (problem := _invalid(list(current[metric].values()), metric)) is not None:
                rows.append(
                    note_row(
                        result,
                        metric,
                        batch.batch_size,
                        Verdict.INVALID,
                        f"a measured value {problem}: the backend returned an impossible value",
                    )
                )
            else:
                comparison = paired_up(
                    batch.batch_size, metric, base, current[metric], unit, reference.side is not None
                )
                if comparison.unit == "pairs":
                    theirs = reference.side.batch(batch.batch_size) if reference.side is not None else None
                    comparison = with_runs(comparison, runs_of(theirs).get(metric, {}) if theirs else {},
                                            runs_of(batch).get(metric, {}))  # fmt: skip
                comparisons.append(comparison)
    for batch_size, reason in entry.errors.items():
        failed_before = result.batch(batch_size)
        if failed_before is not None and failed_before.ok:
            rows.append(
                note_row(result, "*", batch_size, Verdict.IMPROVED, f"runs now, failed in the baseline ({reason})")
            )
    size = family if family is not None else len(comparisons) + len(earlier)
    rows += [_decided(result, c, scenario, schedule.with_family(size), final, counters_better) for c in comparisons]
    return rows


def _decided(
    result: BenchmarkResult,
    c: Comparison,
    scenario: Scenario,
    schedule: procedure.Schedule,
    final: bool,
    counters_better: Mapping[str, str] | None,
) -> Row:
    better = metric_better(c.metric, counters_better)
    try:
        if c.reference_runs is not None and c.current_runs is not None:
            estimate = stats.nested(padded(c.reference_runs), padded(c.current_runs), better=better)
        else:
            measure = stats.paired if c.unit == "pairs" else stats.unpaired
            estimate = measure(np.asarray(c.reference), np.asarray(c.current), better=better)
    except stats.NoScale as exc:
        return note_row(result, c.metric, c.batch_size, Verdict.UNGATED, f"a counter: {exc}; reported, not gated")
    decision = procedure.decide(
        estimate, rtol=scenario.rtol_for(c.metric), schedule=schedule, final=final, units=len(c.current)
    )
    verdict = cast("Verdict | None", decision.verdicts[()]) or Verdict.UNDECIDED  # an object array's element
    low, high = float(decision.low[()]), float(decision.high[()])
    note = f"n={len(c.reference)}/{len(c.current)} {c.unit}"
    if c.current_runs is not None:
        note += f", {sum(map(len, c.reference_runs or []))}/{sum(map(len, c.current_runs))} runs"
    if int(estimate.dropped):
        note += f", {int(estimate.dropped)} disturbed set aside"
    bound = None
    if verdict == Verdict.INCONCLUSIVE:  # said first: the verdict table shows a note that does not start with n=
        bound = procedure.regression_bound(high, low, better)
        needed = int(decision.needed[()])
        more = f"about {needed}" if needed < procedure.NEEDED_LIMIT else f"more than {procedure.NEEDED_LIMIT}"
        units = "runs" if c.unit == "runs" else "processes"
        note = (
            f"no regression above {bound:.1%} at {schedule.confidence:.0%}, undecided at "
            f"{len(c.current)} {units} per side; {more} would decide it; {note}"
        )
        if c.unit != "pairs" and len(c.reference) < len(c.current):  # more units now do not help a small baseline
            more_of = "--llmperf-processes" if units == "processes" else "runs= or --llmperf-runs"
            note += (
                f"; the baseline's {len(c.reference)} {units} limit it: re-record it with more ({more_of}, "
                "--llmperf-update)"
            )
    return Row(
        result.key,
        result.nodeid,
        c.metric,
        c.batch_size,
        float(np.median(c.reference)),
        float(np.median(c.current)),
        float(estimate.ratio()),
        low,
        high,
        float(estimate.p_worse()),
        float(decision.p_adjusted),
        verdict,
        note,
        p_better=float(estimate.p_better()),
        between_sd=None if estimate.spread is None else _finite(estimate.spread.between),
        within_sd=None if estimate.spread is None else _finite(estimate.spread.within),
        se=None if estimate.spread is None else _finite(estimate.se),
        bound=bound,
    )


def _finite(value: object) -> float | None:
    number = float(np.asarray(value))
    return number if np.isfinite(number) else None


def _batch_rows(
    result: BenchmarkResult, batch: BatchResult, reference: Reference, scenario: Scenario, max_load: float
) -> list[Row]:
    """A batch size's rows that are not a gated metric's: outputs, why it is not compared, peak memory."""
    entry, rows = reference.entry, []
    if scenario.outputs != "off" and batch.ok:
        found = outputs.check(
            _reference_outputs(reference, batch.batch_size), outputs.observed(batch.samples), reference.label
        )
        if found is not None:
            rows.append(note_row(result, outputs.OUTPUTS_METRIC, batch.batch_size, *found))
    base = entry.values.get(batch.batch_size)
    busy = busy_note(batch.foreign_load, entry.foreign_load.get(batch.batch_size), max_load)
    if busy and base is not None and batch.ok:
        return [*rows, note_row(result, "*", batch.batch_size, Verdict.REFUSED, busy)]
    if base is None and reference.side is None and batch.batch_size not in entry.errors:  # added to the marker since
        sizes = ", ".join(map(str, sorted({*entry.values, *entry.errors}))) or "none"
        note = f"the baseline has no entry for this batch size (it holds batch sizes {sizes}): not compared"
        note += "" if batch.ok else f"; now {batch.status}: {batch.error}"
        return [*rows, note_row(result, "*", batch.batch_size, Verdict.MISSING, note)]
    if base is None:
        note = "no baseline for this batch size" if batch.ok else (batch.error or "")
        return [
            *rows,
            note_row(result, "*", batch.batch_size, Verdict.NEW if batch.ok else Verdict(batch.status), note),
        ]
    if not batch.ok:
        return [
            *rows,
            note_row(
                result,
                "*",
                batch.batch_size,
                Verdict.REGRESSED,
                f"ran in the baseline, now {batch.status}: {batch.error}",
            ),
        ]
    unit, current = units_of(batch)
    if unit != entry.unit:
        return [
            *rows,
            note_row(
                result,
                "*",
                batch.batch_size,
                Verdict.REFUSED,
                f"not comparable: the baseline holds {UNIT_WORDS[entry.unit]}, this run "
                f"{UNIT_WORDS[unit]}. Measure as the baseline was (--llmperf-processes) or re-record "
                "it with --llmperf-update",
            ),
        ]
    for metric in MEMORY_METRICS:
        base_values = list(reference_units(reference, batch.batch_size, metric).values())
        if metric in current and base_values:
            row = memory_row(result, batch.batch_size, metric, base_values, list(current[metric].values()), scenario)
            if row.verdict != Verdict.PASS:  # the report's memory table shows every value
                rows.append(row)
    return rows


def _reference_outputs(reference: Reference, batch_size: int) -> outputs.Outputs | str | None:
    """The A side's outputs, ids and text (A/B), or the digest a stored baseline keeps."""
    side = reference.side.batch(batch_size) if reference.side is not None else None
    if side is not None and side.ok:
        seen = outputs.observed(side.samples)
        return (
            seen.outputs if seen is not None and seen.outputs is not None else reference.entry.outputs.get(batch_size)
        )
    return reference.entry.outputs.get(batch_size)


def memory_row(
    result: BenchmarkResult,
    batch_size: int,
    metric: str,
    baseline: Sequence[float],
    current: Sequence[float],
    scenario: Scenario,
) -> Row:
    """Peak memory against its baseline: medians and a tolerance. On a fixed shape the peak hardly moves
    between runs, so a test would flag an allocator's page as significant; what matters is whether the
    growth is large enough to push the next batch size out of memory."""
    was, now = float(np.median(baseline)), float(np.median(current))
    limit = max(was * scenario.memory_rtol, MEMORY_FLOOR_MIB)
    verdict = Verdict.REGRESSED if now - was > limit else Verdict.IMPROVED if was - now > limit else Verdict.PASS
    note = (
        f"n={len(baseline)}/{len(current)}, memory: medians within {scenario.memory_rtol:.0%} and "
        f"{MEMORY_FLOOR_MIB:g} MiB (llmperf_memory_rtol)"
    )
    return Row(
        result.key, result.nodeid, metric, batch_size, was, now, now / was, None, None, None, None, verdict, note
    )


def undecided_batches(rows: Sequence[Row]) -> list[int]:
    """Batch sizes with a row that needs more units."""
    return sorted({r.batch_size for r in rows if r.verdict == Verdict.UNDECIDED})


def outputs_messages(rows: Sequence[Row], mode: str) -> list[str]:
    """The changed-outputs rows worded for the test's failure (mode fail) or a warning (mode warn)."""
    changed = [r for r in rows if r.verdict == Verdict.CHANGED]
    if not changed or mode == "off":
        return []
    return [f"batch size {r.batch_size}: {r.note}" for r in changed]


def row_message(row: Row) -> str:
    """A row that fails or stops its test, worded with its numbers: regressed, inconclusive, invalid."""
    if row.metric == "*" or row.ratio is None or row.verdict == Verdict.INVALID:
        where = f"{row.metric} at batch size {row.batch_size}" if row.metric != "*" else f"batch size {row.batch_size}"
        return f"{where}: {row.verdict}: {row.note}"
    if row.metric in INSTRUCTION_METRICS:
        return count_message(row)
    unit = unit_of(row.metric)
    if row.metric in MEMORY_METRICS:
        assert row.baseline is not None and row.now is not None  # memory_row sets both
        return (
            f"{row.metric} (peak memory) at batch size {row.batch_size} regressed: baseline median "
            f"{row.baseline:.1f} {unit}, now {row.now:.1f} {unit} (+{row.now - row.baseline:.1f} {unit}, ratio "
            f"{row.ratio:.3f}), {row.note}"
        )
    return (
        f"{row.metric} ({phase_of(row.metric)}) at batch size {row.batch_size} {row.verdict}: baseline median "
        f"{row.baseline:.4g} {unit}, now {row.now:.4g} {unit}, ratio {row.ratio:.3f} [{row.ci_low:.3f}, "
        f"{row.ci_high:.3f}] (95% CI), p={row.p_value:.2g} (adjusted for rows and looks {row.p_adjusted:.2g}), "
        f"{row.note}"
    )
