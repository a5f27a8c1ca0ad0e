"""From a measured result and its baseline to verdicts a person can act on.

`gate.py` holds the statistics; this module picks the gated metrics, pairs batch sizes with the
baseline's, treats a batch that now runs out of memory as a regression, and words the messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from . import gate, outputs
from .baselines import BaselineEntry, stored_value
from ..measure.metrics import (DEFAULT_GATED_SERVER, DEFAULT_GATED_SPLIT, MEMORY_METRICS, METRICS, TAIL_MIN_GAPS,
                               gaps_per_run, metric_better, unit_values)
from ..measure.records import BenchmarkResult
from ..measure.scenario import Scenario

PHASES = {"prefill": "prefill", "decode": "decode", "ttft": "time to first token", "itl": "decode (inter-token)",
          "throughput": "end-to-end throughput", "e2e": "end to end"}


def phase_of(metric: str) -> str:
    for prefix, phase in PHASES.items():
        if metric.startswith(prefix):
            return phase
    return metric


def unit_of(metric: str) -> str:
    return METRICS[metric].unit if metric in METRICS else ""


@dataclass(frozen=True)
class Row:
    """One line of the verdict table: a metric at a batch size, compared or not."""

    key: str
    nodeid: str
    metric: str
    batch_size: int
    baseline: float | None
    now: float | None
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_adjusted: float | None
    verdict: str
    note: str = ""
    p_better: float | None = None  # one-sided p of the improving direction (reports show it for "improved")


def gated_metrics(scenario: Scenario, splits_prefill: bool) -> tuple[str, ...]:
    if scenario.metrics is not None:
        return scenario.metrics
    return DEFAULT_GATED_SPLIT if splits_prefill else DEFAULT_GATED_SERVER


REFUSED = "refused"
UNGATED = "ungated"  # a gated metric that could not be tested (not measured, too few gaps for its tail)
UNIT_WORDS = {"process": "one value per worker process", "run": "runs of one process (--llmperf-processes=1)"}


def busy_note(current_load: float | None, baseline_load: float | None, max_load: float) -> str | None:
    """Why a batch size cannot be judged: either side measured while other processes used the CPU."""
    if current_load is not None and current_load > max_load:
        return (f"machine busy: other processes used {current_load:.2f} cores during the runs "
                f"(limit {max_load:g}, --llmperf-max-load); not compared. Re-run when the other work has stopped, "
                f"allow it with --llmperf-max-load={current_load + 0.25:.2g} (noisier verdicts), use fewer torch "
                f"threads (--llmperf-threads=1), or measure base and change in one session (--llmperf-compare REF)")
    if baseline_load is not None and baseline_load > max_load:
        return (f"baseline measured on a busy machine ({baseline_load:.2f} cores used by other processes, "
                f"limit {max_load:g}, --llmperf-max-load); not compared: re-record it with --llmperf-update on a "
                f"quiet machine, or gate with --llmperf-max-load={baseline_load + 0.25:.2g} to accept it")
    return None


def compare(result: BenchmarkResult, baseline: BaselineEntry, scenario: Scenario, *, splits_prefill: bool,
            alpha: float, max_load: float, counters_better: Mapping[str, str] | None = None,
            paired: bool = False, reference_label: str = "the baseline") -> list[Row]:
    """Compare every gated metric at every batch size; adjust p-values together; give verdicts. The
    generated tokens are compared beside the timings (unless the scenario's outputs is off)."""
    metrics = gated_metrics(scenario, splits_prefill)
    comparisons: list[gate.Comparison] = []
    rows: list[Row] = []
    units: dict[int, str] = {}
    for batch in result.batches:
        if scenario.outputs != "off" and batch.ok:
            found = outputs.check(baseline.outputs.get(batch.batch_size), outputs.observed(batch.samples),
                                  reference_label)
            if found is not None:
                rows.append(Row(result.key, result.nodeid, outputs.OUTPUTS_METRIC, batch.batch_size, None, None,
                                None, None, None, None, None, *found))
        base = baseline.batches.get(batch.batch_size)
        busy = busy_note(batch.foreign_load, baseline.foreign_load.get(batch.batch_size), max_load)
        if busy and base is not None and batch.ok:
            rows.append(Row(result.key, result.nodeid, "*", batch.batch_size, None, None, None, None, None, None,
                            None, REFUSED, busy))
            continue
        if base is None:
            note = "no baseline for this batch size" if batch.ok else (batch.error or "")
            rows.append(Row(result.key, result.nodeid, "*", batch.batch_size, None, None, None, None, None, None,
                            None, "new" if batch.ok else batch.status, note))
            continue
        if not batch.ok:
            rows.append(Row(result.key, result.nodeid, "*", batch.batch_size, None, None, None, None, None, None,
                            None, gate.REGRESSED, f"ran in the baseline, now {batch.status}: {batch.error}"))
            continue
        unit, current = unit_values(batch.samples)
        units[batch.batch_size] = "processes" if unit == "process" else "runs"
        base_values = baseline.process_values(batch.batch_size) if baseline.unit == "process" else base
        if unit != baseline.unit:
            rows.append(Row(result.key, result.nodeid, "*", batch.batch_size, None, None, None, None, None, None,
                            None, REFUSED, f"the baseline holds {UNIT_WORDS[baseline.unit]}, this run "
                            f"{UNIT_WORDS[unit]}: not comparable. Measure as the baseline was "
                            f"(--llmperf-processes) or re-record it with --llmperf-update"))
            continue
        memory = [memory_row(result, batch.batch_size, metric, base_values[metric], current[metric], scenario)
                  for metric in MEMORY_METRICS if metric in current and metric in base_values]
        rows += [r for r in memory if r.verdict != gate.PASS]  # the report's memory table shows every value
        for metric in metrics:
            if metric in MEMORY_METRICS:
                continue  # above
            if metric not in current or metric not in base:  # e.g. prefill on a server, energy of short runs
                side = "these runs" if metric not in current else "the baseline"
                rows.append(Row(result.key, result.nodeid, metric, batch.batch_size, None, None, None, None, None,
                                None, None, UNGATED, f"not measured in {side}: not gated"))
                continue
            if metric in TAIL_MIN_GAPS and min(gaps_per_run(s) for s in batch.samples) < TAIL_MIN_GAPS[metric]:
                rows.append(Row(result.key, result.nodeid, metric, batch.batch_size, None, None, None, None, None,
                                None, None, UNGATED,
                                f"runs hold fewer than {TAIL_MIN_GAPS[metric]} token gaps: reported, not gated"))
                continue
            test = gate.compare_paired if paired and len(base_values[metric]) == len(current[metric]) else gate.compare
            comparisons.append(test(metric, batch.batch_size, base_values[metric],
                                    [stored_value(v) for v in current[metric]],
                                    better=metric_better(metric, counters_better), rtol=scenario.rtol_for(metric)))
    for batch_size, reason in baseline.errors.items():
        batch = result.batch(batch_size)
        if batch is not None and batch.ok:
            rows.append(Row(result.key, result.nodeid, "*", batch_size, None, None, None, None, None, None, None,
                            gate.IMPROVED, f"failed in the baseline ({reason}), runs now"))
    for c in gate.decide(comparisons, alpha):
        rows.append(Row(result.key, result.nodeid, c.metric, c.batch_size, c.baseline_median, c.current_median,
                        c.ratio, c.ci_low, c.ci_high, c.p_worse, c.p_adjusted, c.verdict,
                        f"n={c.n_baseline}/{c.n_current} {units[c.batch_size]}"
                        + (", paired" if paired and c.n_baseline == c.n_current else ""), p_better=c.p_better))
    return rows


#: Peak memory must grow by more than this as well as by memory_rtol: allocator granularity on a small model.
MEMORY_FLOOR_MIB = 16.0


def memory_row(result: BenchmarkResult, batch_size: int, metric: str, baseline: Sequence[float],
               current: Sequence[float], scenario: Scenario) -> Row:
    """Peak memory against its baseline: medians and a tolerance. On a fixed shape the peak hardly moves
    between runs, so a rank test would flag an allocator's page as significant; what matters is whether
    the growth is large enough to push the next batch size out of memory."""
    was, now = float(np.median(baseline)), float(np.median(current))
    ratio = now / was
    limit = max(was * scenario.memory_rtol, MEMORY_FLOOR_MIB)
    if now - was > limit:
        verdict = gate.REGRESSED
    elif was - now > limit:
        verdict = gate.IMPROVED
    else:
        verdict = gate.PASS
    note = (f"n={len(baseline)}/{len(current)}, memory: medians within {scenario.memory_rtol:.0%} and "
            f"{MEMORY_FLOOR_MIB:g} MiB (--llmperf-memory-rtol)")
    return Row(result.key, result.nodeid, metric, batch_size, was, now, ratio, None, None, None, None, verdict, note)


def flagged_batches(rows: Sequence[Row]) -> list[int]:
    """Batch sizes whose measured metrics look worse (regressed or inconclusive) and deserve a second look."""
    return sorted({r.batch_size for r in rows if r.metric != "*" and r.verdict in (gate.REGRESSED, gate.INCONCLUSIVE)})


def confirm(first: Sequence[Row], second: Sequence[Row], flagged: Sequence[int]) -> list[Row]:
    """Final rows: the second look for flagged batch sizes, where a regression stands only if the first look
    flagged the same metric too; the first look elsewhere. A second look that could not judge (the machine
    was busy: refused; the batch failed) says so for its batch size: it never leaves the batch without rows,
    which would count as passed having compared nothing."""
    flagged_first = {(r.metric, r.batch_size) for r in first if r.verdict in (gate.REGRESSED, gate.INCONCLUSIVE)}
    rows = [r for r in first if r.batch_size not in flagged or r.metric == "*"]
    for r in second:
        if r.metric == "*" and r.batch_size not in flagged:
            continue
        if r.verdict == gate.REGRESSED and (r.metric, r.batch_size) not in flagged_first:
            r = replace(r, verdict=gate.PASS, note=r.note + ", not flagged by the first look")
        rows.append(replace(r, note=r.note + ", confirmation look"))
    return rows


def outputs_messages(rows: Sequence[Row], mode: str) -> list[str]:
    """The changed-outputs rows worded for the test's failure (mode fail) or a warning (mode warn)."""
    changed = [r for r in rows if r.verdict == outputs.CHANGED]
    if not changed or mode == "off":
        return []
    return [f"batch size {r.batch_size}: {r.note}" for r in changed]


def regression_message(row: Row, alpha: float) -> str:
    if row.metric == "*":
        return f"batch size {row.batch_size}: {row.note}"
    unit = unit_of(row.metric)
    if row.metric in MEMORY_METRICS:
        return (f"{row.metric} (peak memory) at batch size {row.batch_size} regressed: baseline median "
                f"{row.baseline:.1f} {unit}, now {row.now:.1f} {unit} (+{row.now - row.baseline:.1f} {unit}, ratio "
                f"{row.ratio:.3f}), {row.note}")
    return (f"{row.metric} ({phase_of(row.metric)}) at batch size {row.batch_size} regressed: baseline median "
            f"{row.baseline:.4g} {unit}, now {row.now:.4g} {unit}, ratio {row.ratio:.3f} "
            f"[{row.ci_low:.3f}, {row.ci_high:.3f}] (95% CI), p={row.p_value:.2g} "
            f"(BH-adjusted {row.p_adjusted:.2g} < alpha {alpha:g}), {row.note}")
