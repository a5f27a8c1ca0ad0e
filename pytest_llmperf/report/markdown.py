"""Reports per hardware target: `reports/<device>.md` (the seeds' tables) and `reports/<device>.json`, and the
charts of the GitHub job summary.

Markdown, per benchmark: the experiment parameters, the latency table and the throughput table of
TGI's benchmark tool (seed 000), and beside them peak memory, energy, instructions and generated outputs;
per sweep group, bigcode-inference-benchmark's grid (seed 003);
for backends with offload counters, a Fiddler-style runs table (seed 004) and, for two policies measured
side by side, their paired ratio; then the verdicts.
The JSON holds every run's metric values (report/stored.py says what is kept of a run), the summaries,
the verdicts, the definitions and the fingerprint; the markdown is rendered from it.

The job summary ($GITHUB_STEP_SUMMARY) gets mermaid `xychart-beta` blocks, which GitHub renders: one chart per
benchmark that ran two or more batch sizes, the median end-to-end throughput against batch size (xychart has no
legend, so a line per chart reads best). Batch sizes that ran out of memory are named in the title, since a line
cannot hold a gap.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..files import strict_json, write_text_atomic
from ..judge.fingerprint import describe_cpu
from ..judge.verdicts import Kind
from ..measure.gpu import slowed_by, throttle_names
from ..measure.instructions import INSTRUCTION_METRICS
from ..measure.metrics import METRICS, PERCENTILE_METHOD, PERCENTILES, min_runs_for_percentile, summarize
from ..measure.records import BenchmarkResult
from .stored import StoredBatch, StoredResult, batch_medians, reference_summary, stored
from .tables import markdown_text, table
from .verdict_table import markdown_table, measured_cell, note_details

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


def _median(batch: StoredBatch, metric: str) -> float | None:
    values = batch.values().get(metric)
    return float(np.median(values)) if values else None


def grid_sections(results: Sequence[BenchmarkResult | StoredResult]) -> list[str]:
    """Seed 003's grids for each group: batch size x column (dtype, or model when dtypes agree)."""
    groups: dict[str, list[StoredResult]] = {}
    for r in map(stored, results):
        if r.group:
            groups.setdefault(r.group, []).append(r)
    sections = []
    for group, members in groups.items():
        dtypes = {m.backend.get("dtype") for m in members}
        column_of: Callable[[StoredResult], str] = (
            (lambda m: str(m.backend.get("dtype")))
            if len(dtypes) == len(members)
            else (lambda m: f"{m.backend.get('model')} {m.backend.get('dtype')}")
        )
        # A backend's `variant` (a TGI server's shards and quantization) tells apart columns whose
        # model and dtype agree.
        columns = [" ".join(filter(None, (column_of(m), m.backend.get("variant")))) for m in members]
        batch_sizes = sorted({b.batch_size for m in members for b in m.batches})

        def grid_cell(m: StoredResult, bs: int, render: Callable[[StoredBatch], str]) -> str:
            batch = m.batch(bs)
            if batch is None:
                return ""
            return (
                render(batch) if batch.ok else ("not timed" if batch.counted_only else "oom" if batch.oom else "error")
            )

        def speed(batch: StoredBatch) -> str:
            tps = _median(batch, "throughput_tokens_per_s") or float("nan")
            return f"{tps:.2f} | {1000 / tps:.2f}"  # table() escapes the bar

        def seconds(batch: StoredBatch) -> str:
            e2e = _median(batch, "e2e_ms") or float("nan")
            return f"{e2e / 1000:.3f}"

        first = members[0]
        title = "## " + markdown_text(
            f"Sweep: {group} ({first.backend.get('model')}, sequence length "
            f"{first.scenario['sequence_length']}, decode length {first.scenario['decode_length']}, "
            f"medians of {runs_taken(members)} runs)"
        )
        speed_table = table(
            ("batch_size", *columns), [[str(bs), *(grid_cell(m, bs, speed) for m in members)] for bs in batch_sizes]
        )
        sec_table = table(
            ("batch_size", *columns), [[str(bs), *(grid_cell(m, bs, seconds) for m in members)] for bs in batch_sizes]
        )
        sections.append(f"{title}\n\ntokens/sec | msec/token\n{speed_table}\n\nsec\n{sec_table}")
    return sections


def runs_section(results: Sequence[BenchmarkResult | StoredResult]) -> str | None:
    """Seed 004's view: one row per knob setting with prefill, decode, hit rate and tokens/s."""
    rows = []
    for r in map(stored, results):
        for batch in r.batches:
            if not batch.ok or "hit_rate" not in batch.values():
                continue
            knobs = ", ".join(f"{k}={v}" for k, v in sorted(r.scenario.get("knobs", {}).items())) or "defaults"
            rows.append(
                [
                    r.key,
                    knobs,
                    str(batch.batch_size),
                    f"{_median(batch, 'prefill_ms') or float('nan'):.2f}",
                    f"{_median(batch, 'decode_total_ms') or float('nan'):.2f}",
                    f"{_median(batch, 'hit_rate') or 0:.4f}",
                    f"{_median(batch, 'throughput_tokens_per_s') or float('nan'):.2f}",
                ]
            )
    if not rows:
        return None
    return "## Offload runs\n\n" + table(
        ("Test", "Knobs", "Batch Size", "prefill_time (ms)", "decode_time (ms)", "hit_rate", "tokens/s"), rows
    )


def pairs_section(results: Sequence[BenchmarkResult | StoredResult]) -> str | None:
    """Two policies measured side by side in each run (offload/backend.py): their decode tokens/s, how often
    the first won, and the paired ratio first / second with its 95% interval (judge/stats.py)."""
    from ..judge.stats import paired

    rows = []
    for r in map(stored, results):
        pair = r.backend.get("pair")
        if not pair:
            continue
        for batch in r.batches:
            values = batch.values() if batch.ok else {}
            a, b = values.get("pair.a_decode_tokens_per_s"), values.get("pair.b_decode_tokens_per_s")
            if not a or not b or len(a) != len(b):
                continue
            estimate = paired(b, a, better="higher")
            low, high = estimate.interval()
            wins = sum(x >= y for x, y in zip(a, b))
            rows.append(
                [
                    r.key,
                    f"{pair['a']} / {pair['b']}",
                    str(batch.batch_size),
                    str(len(a)),
                    f"{statistics.median(a):.2f}",
                    f"{statistics.median(b):.2f}",
                    f"{float(estimate.ratio()):.3f} [{float(low):.3f}, {float(high):.3f}]",
                    f"{wins}/{len(a)}",
                ]
            )
    if not rows:
        return None
    return (
        "## Policy pairs\n\nEach run measured both policies in the same process, one right after the other, "
        "the order alternating. Ratio: first / second decode tokens/s, the 20%-trimmed mean of the runs' log "
        "ratios with its 95% interval (Yuen).\n\n"
        + table(
            (
                "Test",
                "Policies",
                "Batch Size",
                "Pairs",
                "first tokens/s",
                "second tokens/s",
                "ratio [95% CI]",
                "first >= second",
            ),
            rows,
        )
    )


def environment_lines(fp: Mapping[str, Any], device: str) -> list[str]:
    gpus = ", ".join(f"{g['name']} ({g['memory_gb']} GiB, driver {g['driver']})" for g in fp.get("gpus", [])) or "none"
    return [
        f"- Device: {device}",
        f"- CPU: {describe_cpu(fp)} ({fp.get('cpu_cores_physical')} physical / "
        f"{fp.get('cpu_cores_logical')} logical cores), RAM {fp.get('ram_gb')} GiB",
        f"- GPU: {gpus}; CUDA {fp.get('cuda')}",
        f"- torch {fp.get('torch')}, transformers {fp.get('transformers')}, Python {fp.get('python')}",
        f"- Host allocator: {fp.get('malloc', 'not recorded')}",
        f"- torch threads while measuring: {fp.get('threads', 'not recorded')} (llmperf_threads)",
        f"- git commit: {fp.get('git', {}).get('commit')}" + (" (dirty)" if fp.get("git", {}).get("dirty") else ""),
        *_sides_environments(fp.get("environments")),
    ]


def _sides_environments(envs: Mapping[str, Any] | None) -> list[str]:
    """An A/B job's environments: how each side's was made, and the packages that differ."""
    if not envs:
        return []
    lines = [f"- {markdown_text(str(envs.get('summary')))}"]
    for side in ("base", "head"):
        env = envs.get(side) or {}
        made = f"{env.get('how')}, {env.get('python_version') or env.get('python')}"
        if env.get("build_seconds") is not None:
            made += f", {env['build_seconds']:.1f} s"
        lines.append(f"  - {side}: {markdown_text(made)}")
    changes = [
        f"{c['name']} {c.get('base') or '(none)'} -> {c.get('head') or '(none)'}" for c in envs.get("changes", [])
    ]
    if changes:
        lines.append(f"  - packages that differ: {markdown_text('; '.join(changes))}")
    lines += [f"  - not measured: {markdown_text(item)}" for item in envs.get("not_measured", [])]
    return lines


def markdown(document: Mapping[str, Any], counts_line: str) -> str:
    """The device's report from its (accumulated) JSON document: every benchmark measured on the device."""
    device, fp = str(document.get("device")), document.get("fingerprint") or {}
    results = [StoredResult.from_json(b) for b in document.get("benchmarks") or []]
    measured = {(b["nodeid"], b["key"]): measured_cell(b) for b in document.get("benchmarks") or []}
    parts = [
        f"# llmperf results: {markdown_text(device)}",
        f"Written {document.get('created')}. Holds every benchmark measured on "
        "this device, the newest result of each; each says when and at which commit it was measured.",
        "\n".join(environment_lines(fp, device)),
        f"Percentiles: numpy.percentile, method '{PERCENTILE_METHOD}'. "
        "Metric definitions: docs/metrics.md of pytest-llmperf.",
    ]
    parts += [benchmark_section(r, measured.get((r.nodeid, r.key), "")) for r in results]
    parts += grid_sections(results)
    runs = runs_section(results)
    if runs:
        parts.append(runs)
    pairs = pairs_section(results)
    if pairs:
        parts.append(pairs)
    verdicts = markdown_table(document)
    details = "\n".join(f"- {markdown_text(line)}" for line in note_details(document))
    parts.append(
        "## Verdicts\n\nThis session: "
        + counts_line
        + ("\n\n" + verdicts if verdicts else "")
        + (f"\n\nIn full, the notes the table shortens:\n\n{details}" if details else "")
    )
    return "\n\n".join(parts) + "\n"


def json_document(
    device: str,
    created: str,
    fp: Mapping[str, Any],
    settings: Mapping[str, Any],
    results: Sequence[BenchmarkResult],
    outcomes: Sequence[Any],
    counts: Mapping[Kind, int],
) -> dict:
    """A session's JSON report: each benchmark as report/stored.py keeps it, the outcomes and verdict rows."""
    return {
        "schema_version": 1,
        "device": device,
        "created": created,
        "fingerprint": fp,
        "settings": {k: v for k, v in settings.items()},
        "percentile_method": PERCENTILE_METHOD,
        "definitions": {
            m.name: {"unit": m.unit, "better": m.better, "definition": m.definition} for m in METRICS.values()
        },
        "benchmarks": [StoredResult.of(r).to_json() for r in results],
        "outcomes": [
            {
                "key": o.result.key,
                "nodeid": o.result.nodeid,
                "status": o.status,
                "baseline": o.baseline_path,
                "messages": o.messages,
                "software_drift": {k: list(v) for k, v in o.drift.items()},
                "reference": reference_summary(o.reference) if getattr(o, "reference", None) else None,
            }
            for o in outcomes
        ],
        "verdicts": [{**r.__dict__, "medians_ratio": r.medians_ratio()} for o in outcomes for r in o.rows],
        "counts": dict(counts),
    }


def write_atomic(path: Path, text: str) -> None:
    write_text_atomic(path, text)


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    """Strict JSON: a NaN or infinite value (a failed batch's cell) is written as null."""
    write_atomic(path, strict_json(document))


# The job summary's charts: mermaid `xychart-beta` blocks, which GitHub renders.
CHART_METRIC = "throughput_tokens_per_s"
MAX_CHARTS = 12  # a summary is read on one page


def _quoted(text: str) -> str:
    return '"' + text.replace('"', "'") + '"'


def throughput_charts(document: Mapping[str, Any]) -> str:
    charts = []
    for benchmark in document.get("benchmarks") or []:
        medians = {
            bs: m[CHART_METRIC] for bs, m in batch_medians(benchmark, [CHART_METRIC]).items() if CHART_METRIC in m
        }
        if len(medians) < 2:
            continue
        sizes = sorted(medians)
        oom = [str(b.get("batch_size")) for b in benchmark.get("batches") or [] if b.get("status") == "oom"]
        title = f"{benchmark.get('key')}: throughput vs batch size" + (f" (oom at {', '.join(oom)})" if oom else "")
        charts.append(
            "\n".join(
                [
                    "```mermaid",
                    "xychart-beta",
                    f"    title {_quoted(title)}",
                    f"    x-axis {_quoted('batch size')} [{', '.join(str(bs) for bs in sizes)}]",
                    f"    y-axis {_quoted('tokens/s (median)')} 0 --> {max(medians.values()) * 1.1:.4g}",
                    f"    line [{', '.join(f'{medians[bs]:.4g}' for bs in sizes)}]",
                    "```",
                ]
            )
        )
    if not charts:
        return ""
    more = len(charts) - MAX_CHARTS
    return "\n\n".join(charts[:MAX_CHARTS]) + (f"\n\n({more} more in reports/index.html)" if more > 0 else "") + "\n\n"
