"""Instruction counts against their reference: a deterministic metric, held to a tolerance instead of a test.

A count is the same in every process up to a small spread (0.1-0.25% per decode step of tiny-llama over 5
processes, 0.01% for prefill, since CPython's type-attribute cache is indexed by addresses: docs/notes/instructions.md,
"Where the spread comes from"), so one counting process per side decides: regressed where the median count grew by
more than the tolerance, improved where it shrank by more, else pass. A count that varies between the runs and
processes of a side by more than the tolerance is not compared (an address- or input-dependent path would decide
by chance): refused, with the spread. A baseline recorded by an update holds a few processes, whose spread is
checked so; an A/B comparison has one process per side. Counts taken another way (a baseline's fingerprint says
how: COUNTS_TAKEN_WITH) are not compared.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..measure.instructions import COUNTS_TAKEN_WITH, INSTRUCTION_METRICS, count_table
from ..measure.records import BenchmarkResult
from ..measure.scenario import Scenario
from .baselines import BaselineEntry
from .verdicts import Row, Verdict, note_row

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
