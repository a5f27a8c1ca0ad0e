"""Judging per-process values look by look, and merging what the worker processes measured.

A campaign measures each benchmark in N worker processes (per side) and judges it; a benchmark whose
verdict is still unknown (a metric beyond the tolerance but not significant: inconclusive) gets more
processes, doubling, up to a cap, as Chromium's Pinpoint adds attempts while a comparison is
"unknown". Every look judges all processes measured so far at alpha / L, where L is the number of
looks the cap allows (Bonferroni), so unchanged code fails at any look with probability <= alpha.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..measure.metrics import values_by_process
from ..measure.records import BatchResult, BenchmarkResult
from ..measure.scenario import ScenarioError
from . import gate
from .baselines import BaselineEntry
from .outputs import outputs_by_batch


def looks_for(processes: int, max_processes: int) -> list[int]:
    """Process counts per side at which the benchmark is judged: N, 2N, 4N, ... up to the cap."""
    looks = [processes]
    while looks[-1] < max_processes:
        looks.append(min(2 * looks[-1], max_processes))
    return looks


def smallest_p(processes: int, *, paired: bool = False) -> float:
    """The smallest one-sided p the gate's test can give with this many processes per side: Mann-Whitney
    (stored baselines) or Wilcoxon signed-rank on the pairs of an A/B comparison."""
    return gate.min_attainable_p_paired(processes) if paired else gate.min_attainable_p(processes, processes)


def smallest_processes(alpha: float, *, paired: bool = False) -> int:
    """The fewest processes per side with which the gate's test can reach `alpha` at all."""
    n = 2
    while smallest_p(n, paired=paired) >= alpha:
        n += 1
    return n


def check_attainable(processes: int, alpha_per_look: float, what: str, *, paired: bool = False) -> None:
    """Refuse a setting that can never fail: too few processes for the per-look alpha."""
    if smallest_p(processes, paired=paired) >= alpha_per_look:
        test = "Wilcoxon signed-rank p of the A/B pairs" if paired else "Mann-Whitney p"
        raise ScenarioError(
            f"{what}={processes} cannot fail: with {processes} processes per side the smallest {test} is "
            f"{smallest_p(processes, paired=paired):.2g}, not below the per-look alpha {alpha_per_look:.2g}. Use at "
            f"least {smallest_processes(alpha_per_look, paired=paired)} processes (or a larger --llmperf-alpha)")


@dataclass
class Merged:
    """One benchmark (test + key) merged over the worker processes of one side."""

    result: BenchmarkResult
    splits_prefill: bool
    counters_better: dict[str, str] | None


def merge_processes(parts: Sequence[tuple[BenchmarkResult, bool, dict[str, str] | None]]) -> Merged:
    """One result from the same benchmark measured by several workers: each batch's runs keep their
    process index; a batch that failed in any process failed (with the first reason)."""
    first = parts[0][0]
    batch_sizes = sorted({b.batch_size for result, _, _ in parts for b in result.batches})
    batches = []
    for bs in batch_sizes:
        found = [b for result, _, _ in parts if (b := result.batch(bs)) is not None]
        failed = next((b for b in found if not b.ok), None)
        if failed is not None:
            batches.append(replace(failed, samples=[]))
            continue
        loads = [b.foreign_load for b in found if b.foreign_load is not None]
        batches.append(BatchResult(bs, samples=[s for b in found for s in b.samples], warmups=found[0].warmups,
                                   foreign_load=sum(loads) / len(loads) if loads else None,
                                   retaken=sum(b.retaken for b in found)))
    scenario = {**first.scenario, "processes": len(parts)}
    return Merged(replace(first, scenario=scenario, batches=batches), parts[0][1], parts[0][2])


def reference_entry(reference: BenchmarkResult, label: str) -> BaselineEntry:
    """The A side of an A/B comparison in the shape of a stored baseline (one value list per process)."""
    return BaselineEntry(
        key=reference.key,
        runs={b.batch_size: values_by_process(b.samples) for b in reference.batches if b.ok},
        errors={b.batch_size: f"{b.status}: {b.error}" for b in reference.batches if not b.ok},
        unit="process",
        outputs=outputs_by_batch(reference.batches),
        scenario=reference.scenario,
        backend=reference.backend,
        created=label,
    )
