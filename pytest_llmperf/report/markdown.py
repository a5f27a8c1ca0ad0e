"""Reports per hardware target: `reports/<device>.md` (the seeds' tables) and `reports/<device>.json`.

Markdown, per benchmark: the experiment parameters, the latency table and the throughput table of
TGI's benchmark tool (seed 000); per sweep group, bigcode-inference-benchmark's grid (seed 003);
for backends with offload counters, a Fiddler-style runs table (seed 004) and, for two policies measured
side by side, their paired ratio; then the verdicts.
The JSON holds every run's metric values (report/stored.py says what is kept of a run), the summaries,
the verdicts, the definitions and the fingerprint; the markdown is rendered from it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..files import strict_json, write_text_atomic
from ..judge.fingerprint import describe_cpu
from ..judge.verdicts import Kind
from ..measure.metrics import METRICS, PERCENTILE_METHOD
from ..measure.records import BenchmarkResult
from .benchmark_tables import benchmark_section, runs_taken
from .stored import StoredBatch, StoredResult, reference_summary, stored
from .tables import markdown_text, table
from .verdict_table import markdown_table, measured_cell, note_details


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
