"""The rows of one benchmark: from a measured result and its reference to verdicts a person can act on.

Per batch size: the generated tokens (judge/outputs.py), why a batch cannot be compared (a busy machine, no
reference, units that do not compare), peak memory against a tolerance, and every gated metric through the
decision procedure (judge/stats.py, judge/procedure.py). A row decided at an earlier look keeps its verdict.

What the gate compares, per metric and batch size: the units of both sides, paired up for an A/B job with
every run of each pair's processes (judge/stats.py's `nested` tests them), or as two samples against a stored
baseline.

Instruction counts against their reference (`instruction_rows`): a deterministic metric, held to a tolerance instead
of a test. A count is the same in every process up to a small spread (0.1-0.25% per decode step of tiny-llama over 5
processes, 0.01% for prefill, since CPython's type-attribute cache is indexed by addresses:
docs/notes/instructions.md, "Where the spread comes from"), so one counting process per side decides: regressed
where the median count grew by more than the tolerance, improved where it shrank by more, else pass. A count that
varies between the runs and processes of a side by more than the tolerance is not compared (an address- or
input-dependent path would decide by chance): refused, with the spread. A baseline recorded by an update holds a few
processes, whose spread is checked so; an A/B comparison has one process per side. Counts taken another way (a
baseline's fingerprint says how: COUNTS_TAKEN_WITH) are not compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from ..measure.instructions import COUNTS_TAKEN_WITH, INSTRUCTION_METRICS, count_table
from ..measure.metrics import (
    MEMORY_METRICS,
    METRICS,
    TAIL_MIN_GAPS,
    gaps_per_run,
    gated_metrics,
    metric_better,
    values_by_process,
)
from ..measure.records import BatchResult, BenchmarkResult
from ..measure.scenario import Scenario
from . import outputs, procedure, stats
from .baseline_entry import BaselineEntry, check_value, process_medians, stored_value
from .quality import busy_note
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
                continue  # held to a tolerance: _batch_rows (memory), instruction_rows (counts)
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


@dataclass(frozen=True)
class Reference:
    """What a benchmark is compared with: a stored baseline, or the A side of an A/B comparison (paired:
    its processes ran beside ours, round by round)."""

    entry: BaselineEntry
    label: str  # "the baseline", or the ref's label
    side: BenchmarkResult | None = None  # A/B: the A side's runs, paired with ours by process (round) index


def units_of(batch: BatchResult) -> tuple[str, dict[str, dict[int, float]]]:
    """What the gate tests, per metric and unit index: ("process", each worker process's median of its runs)
    when several processes took the runs, since runs of one process share its speed; ("run", the runs)."""
    per_process = values_by_process(batch.samples)
    processes = batch.processes
    if len(processes) > 1:
        return "process", {m: dict(zip(processes, process_medians(v))) for m, v in per_process.items()}
    return "run", {m: dict(enumerate(v[0])) for m, v in per_process.items()}


@dataclass
class Comparison:
    batch_size: int
    metric: str
    reference: list[float]
    current: list[float]
    unit: str
    # A/B pairs: every run of both processes of each pair, in the pairs' order (judge/stats.py, `nested`)
    reference_runs: list[list[float]] | None = None
    current_runs: list[list[float]] | None = None


def runs_of(batch: BatchResult) -> dict[str, dict[int, list[float]]]:
    """Every run's value per metric and worker process index."""
    return {m: dict(zip(batch.processes, v)) for m, v in values_by_process(batch.samples).items()}


def reference_units(reference: Reference, batch_size: int, metric: str) -> dict[int, float]:
    """The reference's units of one metric, keyed by process index (A/B) or position (a stored baseline)."""
    side = reference.side.batch(batch_size) if reference.side is not None else None
    if side is not None and side.ok:
        return units_of(side)[1].get(metric, {})
    return dict(enumerate(reference.entry.values.get(batch_size, {}).get(metric, [])))


def paired_up(
    batch_size: int, metric: str, base: dict[int, float], current: dict[int, float], unit: str, paired: bool
) -> Comparison:
    """The values to compare, round by round for an A/B comparison (the processes that both sides measured)."""
    if paired and unit == "process":
        common = sorted(set(base) & set(current))
        return Comparison(batch_size, metric, [base[i] for i in common], [current[i] for i in common], "pairs")
    return Comparison(
        batch_size,
        metric,
        list(base.values()),
        [stored_value(v) for v in current.values()],
        "processes" if unit == "process" else "runs",
    )


def with_runs(c: Comparison, reference: dict[int, list[float]], current: dict[int, list[float]]) -> Comparison:
    """The pairs' runs, where both sides kept every process's runs (A/B: they always do)."""
    common = sorted(set(reference) & set(current))
    if len(common) != len(c.current):
        return c
    return replace(c, reference_runs=[reference[i] for i in common], current_runs=[current[i] for i in common])


def padded(runs: list[list[float]]) -> np.ndarray:
    """Runs per process as one array, NaN where a process took fewer than the most."""
    most = max(map(len, runs))
    return np.array([[*r, *([np.nan] * (most - len(r)))] for r in runs], dtype=float)


#: The tolerance of a count where the marker names none for its metric (rtol={"decode_step_instructions": 0.01}):
#: above the spread of unchanged code over processes (0.1-0.4%), half the smallest host-side change we must catch (1%).
DEFAULT_RTOL = 0.005
CALLGRIND = "instructions (callgrind)"


def spread(values: Sequence[float]) -> float:
    """How far a set of counts spreads: (highest - lowest) / median."""
    median = float(np.median(values))
    return (max(values) - min(values)) / median if median > 0 else 0.0


def instruction_rows(result: BenchmarkResult, entry: BaselineEntry, scenario: Scenario, label: str) -> list[Row]:
    """The instruction rows of a benchmark whose batch sizes were counted (none where nothing asked to count)."""
    rows: list[Row] = []
    taken_with = entry.fingerprint.get("counts", "Python's own allocator (pymalloc)")
    for batch in result.batches:
        if batch.error is not None or (not batch.counted and batch.count_error is None):
            continue
        if batch.count_error is not None:
            rows.append(note_row(result, "instructions", batch.batch_size, Verdict.UNGATED, batch.count_error))
            continue
        current = count_table(batch.counted)
        # a baseline keeps each counting process's median (judge/baseline_entry.py): one count per process
        reference = {m: [[v] for v in values] for m, values in entry.values.get(batch.batch_size, {}).items()}
        for metric in INSTRUCTION_METRICS:
            if metric not in current:
                continue
            if metric not in reference:
                rows.append(
                    note_row(
                        result,
                        metric,
                        batch.batch_size,
                        Verdict.UNGATED,
                        f"{CALLGRIND}: {label} holds no counts; record them with --llmperf-update "
                        "--llmperf-instructions",
                    )
                )
                continue
            if taken_with != COUNTS_TAKEN_WITH:  # a stored baseline's counts from an earlier way of counting
                rows.append(
                    note_row(
                        result,
                        metric,
                        batch.batch_size,
                        Verdict.REFUSED,
                        f"{CALLGRIND}: {label}'s counts were taken with {taken_with}, these with "
                        f"{COUNTS_TAKEN_WITH}: not comparable; record them again with --llmperf-update "
                        "--llmperf-instructions",
                    )
                )
                continue
            rtol = scenario.rtol_per_metric.get(metric, DEFAULT_RTOL)
            rows.append(count_row(result, batch.batch_size, metric, reference[metric], current[metric], rtol))
    return rows


def count_row(
    result: BenchmarkResult,
    batch_size: int,
    metric: str,
    reference: Sequence[Sequence[float]],
    current: Sequence[Sequence[float]],
    rtol: float,
) -> Row:
    """One count against its reference, both given as per-process lists of per-run counts."""
    was_all = [v for values in reference for v in values]
    now_all = [v for values in current for v in values]
    was, now = float(np.median(was_all)), float(np.median(now_all))
    widest = max(spread(was_all), spread(now_all))
    sizes = f"n={len(reference)}/{len(current)} processes, {len(was_all)}/{len(now_all)} runs"
    if widest > rtol:
        return note_row(
            result,
            metric,
            batch_size,
            Verdict.REFUSED,
            f"{CALLGRIND}: counts vary by {widest:.2%} between runs and processes, more than the "
            f"tolerance ({rtol:.2%}): an address- or input-dependent path; not compared ({sizes})",
        )
    ratio = now / was
    verdict = Verdict.REGRESSED if ratio > 1 + rtol else Verdict.IMPROVED if ratio < 1 - rtol else Verdict.PASS
    note = f"{CALLGRIND}: within {rtol:.2%}, spread {widest:.3%}, {sizes}"
    return Row(result.key, result.nodeid, metric, batch_size, was, now, ratio, None, None, None, None, verdict, note)


def count_message(row: Row) -> str:
    """A count row that fails its test, worded with its numbers."""
    assert row.baseline is not None and row.now is not None and row.ratio is not None
    phase = (
        "decode" if row.metric.startswith("decode") else "prefill" if row.metric.startswith("prefill") else "end to end"
    )
    return (
        f"{row.metric} ({phase}, instructions counted under callgrind) at batch size {row.batch_size} "
        f"{row.verdict}: reference {row.baseline:,.0f}, now {row.now:,.0f} instructions ({row.ratio - 1:+.2%}, "
        f"ratio {row.ratio:.4f}); {row.note}"
    )
