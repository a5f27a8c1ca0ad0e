"""What the gate compares, per metric and batch size: the units of both sides, paired up for an A/B job with
every run of each pair's processes (judge/stats.py's `nested` tests them), or as two samples against a stored
baseline."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..measure.metrics import values_by_process
from ..measure.records import BatchResult, BenchmarkResult
from .baseline_entry import BaselineEntry, process_medians, stored_value


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
