"""One benchmark's section of the markdown report: TGI's benchmark tool's parameters, latency and throughput
tables (seed 000), and beside them peak memory, energy, instructions and generated outputs.

report/markdown.py puts the sections of every benchmark, the sweep grids and the verdicts into one document.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..measure.gpu import slowed_by, throttle_names
from ..measure.instructions import INSTRUCTION_METRICS
from ..measure.metrics import PERCENTILES, min_runs_for_percentile, summarize
from ..measure.records import BenchmarkResult
from .stored import StoredBatch, StoredResult, stored
from .tables import markdown_text, table

SPLIT_LATENCY = (
    ("Prefill", "prefill_ms"),
    ("Decode (token)", "decode_token_ms"),
    ("Decode (total)", "decode_total_ms"),
)

SPLIT_THROUGHPUT = (("Prefill", "prefill_tokens_per_s"), ("Decode", "decode_tokens_per_s"))

# Servers: seed 000's shape from token arrivals (metric definitions in metrics.py and docs/metrics.md).
SERVER_LATENCY = (
    ("Time to first token", "ttft_ms"),
    ("Inter-token latency", "itl_ms"),
    ("Time per output token", "tpot_ms"),
    ("Decode (total)", "first_to_last_token_ms"),
    ("End to end", "e2e_ms"),
)

SERVER_THROUGHPUT = (
    ("Prefill (batch / TTFT)", "ttft_tokens_per_s"),
    ("Decode (batch / ITL)", "itl_tokens_per_s"),
    ("End to end (tokens / E2E)", "throughput_tokens_per_s"),
)

# Peak memory per run (measure/memory.py), as bigcode-inference-benchmark and optimum-benchmark report it.
MEMORY = (
    ("Host RSS (measuring process)", "peak_rss_mib"),
    ("Host RSS (server processes)", "server_peak_rss_mib"),
    ("CUDA allocated (torch)", "cuda_peak_allocated_mib"),
    ("GPU used (NVML)", "gpu_used_mib"),
)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and math.isnan(value):
        return f"NaN {unit}".strip()
    return f"{value:.2f} {unit}".strip()


def _failed_cell(batch: StoredBatch) -> str:
    return "oom" if batch.oom else "NaN"


def runs_taken(results: Sequence[StoredResult]) -> str:
    """The runs measured per batch size, counted (more than the scenario's `runs` when worker processes or a
    second look added some): "20", "40 (8 processes)", or "10-20" when batch sizes differ."""
    counts = sorted({len(b.runs) for r in results for b in r.batches if b.ok})
    processes = sorted({len({run.process for run in b.runs}) for r in results for b in r.batches if b.ok})
    if not counts:
        return "0"
    text = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    if processes and processes[-1] > 1:
        text += f" ({processes[0] if len(processes) == 1 else f'{processes[0]}-{processes[-1]}'} processes)"
    return text


def parameters_table(result: BenchmarkResult | StoredResult) -> str:
    result = stored(result)
    s, b = result.scenario, result.backend
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(s.get("knobs", {}).items())) or "none"
    rows = [
        ("Model", b.get("model", "?")),
        ("Backend", b.get("backend", "?")),
        ("Device", b.get("device", "?")),
        ("Dtype", b.get("dtype", "?")),
        ("Sequence Length", s["sequence_length"]),
        ("Decode Length", s["decode_length"]),
        ("N Runs", runs_taken([result])),
        ("Warmups", s["warmups"]),
        ("Knobs", knobs),
        ("Do Sample", "false"),
    ]
    rows += [
        (k.replace("_", " ").capitalize(), v)
        for k, v in sorted(b.items())
        if k not in {"model", "backend", "device", "dtype", "model_path"}
    ]
    return table(("Parameter", "Value"), [(k, str(v)) for k, v in rows])


def _step_rows(
    result: StoredResult,
    steps: Sequence[tuple[str, str]],
    unit: str,
    cells: Callable[[list[float]], list[str]],
    width: int,
) -> list[list[str]]:
    """One row per step and batch size; the step's name only on its first row, as in the seeds."""
    rows = []
    for step, metric in steps:
        for i, batch in enumerate(result.batches):
            head = [step if i == 0 else "", str(batch.batch_size)]
            values = batch.values().get(metric) if batch.ok else None
            if values:
                rows.append(head + cells(values))
            elif batch.ok:  # the backend could not measure it (e.g. no token arrived)
                rows.append(head + ["n/a"] * width)
            else:
                rows.append(head + [f"{_failed_cell(batch)} {unit}"] * width)
    return rows


def latency_table(result: BenchmarkResult | StoredResult, steps: Sequence[tuple[str, str]]) -> tuple[str, list[str]]:
    result = stored(result)
    notes: list[str] = []

    def cells(values: list[float]) -> list[str]:
        summary = summarize(values)
        out = [_fmt(summary.average, "ms"), _fmt(summary.lowest, "ms"), _fmt(summary.highest, "ms")]
        for q in PERCENTILES:
            value = summary.percentiles[q]
            if value is None:
                note = f"p{q} needs at least {min_runs_for_percentile(q)} runs (this table has {summary.n}): not shown"
                if note not in notes:
                    notes.append(note)
            out.append("n/a" if value is None else _fmt(value, "ms"))
        return out

    rows = _step_rows(result, steps, "ms", cells, 3 + len(PERCENTILES))
    header = ("Step", "Batch Size", "Average", "Lowest", "Highest", *(f"p{q}" for q in PERCENTILES))
    return table(header, rows), notes


def throughput_table(result: BenchmarkResult | StoredResult, steps: Sequence[tuple[str, str]]) -> str:
    result = stored(result)

    def cells(values: list[float]) -> list[str]:
        summary = summarize(values)
        return [_fmt(v, "tokens/secs") for v in (summary.average, summary.lowest, summary.highest)]

    return table(
        ("Step", "Batch Size", "Average", "Lowest", "Highest"), _step_rows(result, steps, "tokens/secs", cells, 3)
    )


def memory_table(result: BenchmarkResult | StoredResult) -> str | None:
    """Peak memory per batch size (median, lowest, highest over runs), for the memory metrics measured."""
    result = stored(result)
    measured = {m for b in result.batches if b.ok for m in b.values()}
    steps = [(label, metric) for label, metric in MEMORY if metric in measured]
    if not steps:
        return None

    def cells(values: list[float]) -> list[str]:
        return [_fmt(v, "MiB") for v in (float(np.median(values)), min(values), max(values))]

    return table(
        ("Peak memory", "Batch Size", "Median", "Lowest", "Highest"), _step_rows(result, steps, "MiB", cells, 3)
    )


def energy_table(result: BenchmarkResult | StoredResult) -> str | None:
    """NVML per batch size: energy per generated token over all its runs (the counter steps coarsely, so the
    runs' sum is the measurement; measure/gpu.py), the lowest SM clock and the reasons that slowed a run."""
    rows = []
    for batch in stored(result).batches:
        readings = [r for r in batch.runs if "energy_j" in r.gpu] if batch.ok else []
        if not readings:
            continue
        tokens = sum(r.tokens for r in readings)
        energy = sum(r.gpu["energy_j"] for r in readings)
        clocks = [r.gpu["sm_clock_mhz"] for r in batch.runs if "sm_clock_mhz" in r.gpu]
        reasons = sorted({n for r in batch.runs for n in throttle_names(slowed_by(r.gpu))})
        rows.append(
            [
                str(batch.batch_size),
                f"{energy / tokens:.4g} J/token" if tokens else "n/a",
                f"{energy:.1f} J / {tokens} tokens / {len(readings)} runs",
                f"{min(clocks):.0f} MHz" if clocks else "n/a",
                ", ".join(reasons) or "none",
            ]
        )
    if not rows:
        return None
    return table(("Batch Size", "GPU energy", "Over", "Lowest SM clock", "Slowed by"), rows)


def outputs_lines(result: BenchmarkResult | StoredResult) -> list[str]:
    """What each batch size generated (digest, first sequence's text); or that its runs disagreed."""
    lines = []
    for batch in stored(result).batches:
        seen = batch.outputs if batch.ok else None
        if not seen:
            continue
        if "digest" not in seen:
            lines.append(
                f"outputs at batch size {batch.batch_size}: {seen.get('distinct')} distinct over the runs "
                "(nondeterministic)"
            )
            continue
        lines.append(
            f"outputs at batch size {batch.batch_size}: {str(seen['digest'])[:19]}, sequence 0: "
            f"{str(seen.get('sequence_0', ''))[:80]!r}"
        )
    return lines


def instructions_table(result: BenchmarkResult | StoredResult) -> str | None:
    """The instructions counted under callgrind (--llmperf-instructions): the median of each batch size's counted
    runs, with how many processes counted them."""
    result = stored(result)
    rows = []
    for metric, step in zip(INSTRUCTION_METRICS, ("Prefill", "Decode step", "End to end, per generated token")):
        for i, batch in enumerate(b for b in result.batches if metric in b.counts):
            rows.append(
                [
                    step if i == 0 else "",
                    str(batch.batch_size),
                    f"{float(np.median(batch.counts[metric])):,.0f}",
                    str(len(batch.counts[metric])),
                ]
            )
    if not rows:
        return None
    return "Instructions (callgrind)\n" + table(("Step", "Batch Size", "Median", "Counted runs"), rows)


def benchmark_section(result: BenchmarkResult | StoredResult, measured: str = "") -> str:
    result = stored(result)
    split = result.splits_prefill
    counts = instructions_table(result)
    head = [
        "## " + markdown_text(result.nodeid + (f" ({result.key.split('::')[-1]})" if "::" in result.key else "")),
        *([f"Measured {measured} (UTC @ commit)."] if measured else []),
        parameters_table(result),
    ]
    if result.batches and all(b.counted_only for b in result.batches):  # --llmperf-instructions-only
        return "\n\n".join(
            [*head, "Not timed: instructions counted under callgrind only (--llmperf-instructions-only).", counts or ""]
        )
    latency, notes = latency_table(result, SPLIT_LATENCY if split else SERVER_LATENCY)
    extra = [t for t in (memory_table(result), energy_table(result), counts) if t]
    parts = [*head, latency, throughput_table(result, SPLIT_THROUGHPUT if split else SERVER_THROUGHPUT), *extra]
    notes += [f"run quality: {n}" for n in result.run_quality] + outputs_lines(result)
    failed = [
        f"batch size {b.batch_size}: {b.status}: {b.error}" for b in result.batches if not b.ok and not b.counted_only
    ]
    failed += [
        f"batch size {b.batch_size}: {b.retaken} run(s) retaken because other processes were busy; "
        f"kept runs saw {b.foreign_load:.2f} foreign cores on average"
        for b in result.batches
        if b.retaken
    ]
    if notes or failed:
        parts.append("\n".join(f"- {markdown_text(line)}" for line in [*notes, *failed]))
    return "\n\n".join(parts)
