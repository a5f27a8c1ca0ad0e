"""Exports read by other tools: pytest-benchmark's results (its JSON, storage, compare), JUnit XML properties, and
the files of benchmark dashboards (`--llmperf-export`).

pytest-benchmark: every measured metric at every batch size becomes one of pytest-benchmark's own
`stats.Metadata` records, added to its session's benchmarks before it finishes. pytest-benchmark then
computes the statistics itself (min, max, mean, stddev, median, iqr, q1, q3, outliers, ops, ...) and
writes `--benchmark-json`, `--benchmark-save/--benchmark-autosave`, compares with `--benchmark-compare`
and shows its table, exactly as for its own benchmarks. Its values are seconds, lower is better:
latency metrics (ms) are exported in seconds; a throughput metric (tokens/s, higher is better) is
exported as its reciprocal, seconds per token, so that lower stays better for `pytest-benchmark
compare` and `--benchmark-compare-fail`, and `stats.ops` (1 / mean) reads as tokens per second.
`extra_info` says what each entry holds (metric, unit, exported_as, better). github-action-benchmark's
`pytest` tool would chart every entry as `stats.ops` in "iter/sec"; `--llmperf-export` writes its custom
files with real units instead (below).

JUnit (`--junitxml`): each benchmark's outcome, medians, ratios and verdicts become <property> elements
named after the test. pytest's default family, xunit2, allows properties only on the <testsuite> (Jenkins'
junit-10.xsd; pytest itself warns about `record_property` under xunit2), so there they are testsuite
properties, as `record_testsuite_property` writes them (added to the file pytest wrote, at the session's end: the
benchmarks measured in worker processes have no fixtures to ask); with `junit_family = xunit1` they are the test's
own `user_properties`, on its <testcase>.

Dashboards: files written with `--llmperf-export` into the report directory.

- `github-action-benchmark`: `<device>.customSmallerIsBetter.json` (latencies, memory) and
  `<device>.customBiggerIsBetter.json` (throughputs), the two files that action's custom tools read: a JSON
  array of {name, value, unit, range, extra}; one entry per benchmark, batch size and metric, in the
  metric's own unit (its `pytest` tool reads pytest-benchmark's JSON and calls every unit "iter/sec").
- `bencher`: `<device>.bmf.json`, Bencher Metric Format: {benchmark: {measure: {value, lower_value,
  upper_value}}}; one benchmark per test and batch size, one measure per metric, named with its unit
  (`prefill_ms (ms)`), since a measure Bencher does not know gets no unit of its own.

The value is the median over the runs' per-process medians (with one process, the median of its runs),
what the gate compares; the spread is the 25th and 75th percentile of the runs. Exported: the metrics the
gate tests, end-to-end throughput, and peak memory, of this session's benchmarks (a dashboard entry belongs
to the commit that measured it, so benchmarks carried over from earlier sessions are left out).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..files import write_text_atomic
from ..judge.rows import unit_of
from ..judge.verdicts import Row, reason_of
from ..measure.metrics import MEMORY_METRICS, METRICS, gated_metrics, metric_better, values_by_metric
from ..measure.records import BenchmarkResult
from ..measure.scenario import Scenario
from .stored import StoredBatch, StoredResult
from .summary import SessionSummary, Written


def exported_values(metric: str, values: Sequence[float]) -> tuple[list[float], dict[str, str]] | None:
    """Values in pytest-benchmark's unit (seconds, lower is better) and how they were made; None when the
    metric is neither a time nor a throughput (e.g. an offload hit rate)."""
    definition = METRICS.get(metric)
    if definition is None:
        return None
    if definition.unit == "ms":
        return [v / 1000 for v in values], {"unit": "s", "exported_as": f"{metric} / 1000", "better": "lower"}
    if definition.better == "higher" and "tokens" in definition.unit:
        if any(v <= 0 for v in values):
            return None
        return (
            [1 / v for v in values],
            {"unit": "s/token", "exported_as": f"1 / {metric} (stats.ops is tokens/s)", "better": "lower"},
        )
    return None


def benchmark_records(device: str, results: Iterable[BenchmarkResult]) -> list[Any]:
    """pytest-benchmark `Metadata` records for our results (pytest-benchmark computes their statistics)."""
    from pytest_benchmark.stats import Metadata  # only called when pytest-benchmark is active

    records = []
    for result in results:
        for batch in result.batches:
            if not batch.ok:
                continue
            for metric, values in values_by_metric(batch.samples).items():
                exported = exported_values(metric, values)
                if exported is None or not values:
                    continue
                data, how = exported
                suffix = f"[bs={batch.batch_size}]:{metric}"
                fixture = SimpleNamespace(
                    name=f"{result.key}{suffix}",
                    fullname=f"{result.module}::{result.key}{suffix}",
                    group=f"llmperf:{device}",
                    param=str(batch.batch_size),
                    params={"batch_size": batch.batch_size},
                    extra_info={
                        "device": device,
                        "metric": metric,
                        "batch_size": batch.batch_size,
                        "metric_unit": METRICS[metric].unit,
                        "metric_better": METRICS[metric].better,
                        **how,
                    },
                    cprofile_stats=None,
                    has_error=False,
                )
                record = Metadata(
                    fixture,
                    iterations=1,
                    options={
                        "runs": len(values),
                        "warmups": result.scenario.get("warmups"),
                        "timer": "llmperf",
                        "sequence_length": result.scenario.get("sequence_length"),
                        "decode_length": result.scenario.get("decode_length"),
                    },
                )
                for value in data:
                    record.update(value)
                records.append(record)
    return records


def add_to_pytest_benchmark(config: Any, device: str, results: Sequence[BenchmarkResult]) -> int:
    """Hand our results to pytest-benchmark's session when it is active and asked to write or compare
    (--benchmark-json, --benchmark-save/-autosave, --benchmark-compare); returns how many."""
    bench = getattr(config, "_benchmarksession", None)
    if bench is None or not results:
        return 0
    if not (bench.json or bench.save or bench.autosave or bench.compare):
        return 0  # nothing of pytest-benchmark's asked for: keep its table out of a plain run's output
    records = benchmark_records(device, results)
    bench.benchmarks.extend(records)
    if bench.json and isinstance(bench.json, (str, os.PathLike)):
        # pytest-benchmark opens the file without making its folder; a fresh clone has no reports/ yet
        Path(bench.json).parent.mkdir(parents=True, exist_ok=True)
    return len(records)


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def junit_properties(outcomes: Iterable[Any]) -> list[tuple[str, str]]:
    """(name, value) pairs for JUnit <property> elements, each named `llmperf <test id> ...`: the outcome
    (its kind, judge/verdicts.py: passed, regressed, inconclusive, refused, missing, created..., as the summary
    counts it) and why nothing was judged; per row the medians (with units), the ratio of the medians, the gate's HL
    ratio with its 95% CI, and the verdict; without rows, the medians measured now."""
    props: list[tuple[str, str]] = []
    for outcome in outcomes:
        result = outcome.result
        prefix = f"llmperf {result.nodeid}" + (f" {result.key.split('::')[-1]}" if "::" in result.key else "")
        props.append((f"{prefix} outcome", str(outcome.kind)))
        reason = reason_of(outcome)
        if reason:
            props.append((f"{prefix} not judged because", reason))
        if not outcome.rows:  # created, updated, refused, missing: the medians measured now
            for batch in result.batches:
                if not batch.ok:
                    props.append((f"{prefix} bs={batch.batch_size}", batch.status))
                    continue
                for metric, values in sorted(values_by_metric(batch.samples).items()):
                    if metric in METRICS and values:
                        props.append(
                            (
                                f"{prefix} bs={batch.batch_size} {metric} median ({unit_of(metric)})",
                                _num(float(np.median(values))),
                            )
                        )
        for row in outcome.rows:
            props.extend(row_properties(prefix, row))
    return props


def row_properties(prefix: str, row: Row) -> list[tuple[str, str]]:
    """One verdict row: the medians, `ratio now/baseline (medians, ...)` = now median / baseline median (the JSON
    report's `medians_ratio`), `estimated ratio now/baseline` = the gate's estimate with its 95% CI where the row has
    one (the tables' "Ratio estimate [95% CI]"), and the verdict."""
    name = f"{prefix} bs={row.batch_size} {row.metric}"
    if row.metric == "*":
        return [(f"{name} verdict", row.verdict + (f": {row.note}" if row.note else ""))]
    unit = unit_of(row.metric)
    props = [(f"{name} baseline median ({unit})", _num(row.baseline)), (f"{name} now median ({unit})", _num(row.now))]
    worse = "higher" if metric_better(row.metric) == "lower" else "lower"
    if row.medians_ratio() is not None:
        props.append((f"{name} ratio now/baseline (medians, {worse} is worse)", _num(row.medians_ratio())))
    if row.ratio is not None and row.ci_low is not None and row.ci_high is not None:
        props.append((f"{name} estimated ratio now/baseline ({worse} is worse)", _num(row.ratio)))
        props.append((f"{name} estimated ratio 95% CI", f"{_num(row.ci_low)} to {_num(row.ci_high)}"))
    props.append((f"{name} verdict", row.verdict + (f": {row.note}" if row.verdict == "refused" and row.note else "")))
    return props


def measured_seconds(outcomes: Iterable[Any]) -> float:
    """Wall time of the timed runs behind these outcomes (every process, both sides of an A/B comparison):
    the time of a test measured in worker processes, whose own call in the pytest process only reports."""
    total_ns = 0
    for outcome in outcomes:
        for result in (outcome.result, getattr(outcome, "reference", None)):
            for batch in result.batches if result is not None else ():
                total_ns += sum(s.end_to_end_ns for s in batch.samples)
    return total_ns / 1e9


#: What XML 1.0 cannot hold (a server's colour codes in a note): written as pytest's JUnit writer does, `#x1B`.
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def add_suite_properties(path: Path, properties: Sequence[tuple[str, str]]) -> None:
    """Add <property> elements to the <testsuite> of the JUnit XML file pytest wrote, after any it holds (the
    schema's place for them), replacing the file atomically."""
    import xml.etree.ElementTree as ET

    from ..files import write_atomic

    tree = ET.parse(path)
    root = tree.getroot()
    suite = root.find("testsuite") if root.tag == "testsuites" else root
    if suite is None:
        raise ValueError(f"{path}: no <testsuite> element")
    found = suite.find("properties")
    if found is None:
        found = ET.Element("properties")
        suite.insert(0, found)
    for name, value in properties:
        text = _NOT_XML.sub(lambda m: f"#x{ord(m.group()):02X}", str(value))
        ET.SubElement(found, "property", name=_NOT_XML.sub("?", name), value=text)
    write_atomic(path, lambda handle: tree.write(handle, encoding="utf-8", xml_declaration=True), text=False)


# Dashboards (--llmperf-export).
FORMATS = ("github-action-benchmark", "bencher")
DASHBOARD_UNITS = {"tokens/secs": "tokens/s"}


def dashboard_unit(metric: str) -> str:
    unit = METRICS[metric].unit
    return DASHBOARD_UNITS.get(unit, unit)


def exported_metrics(result: StoredResult) -> list[str]:
    gated = gated_metrics(Scenario.from_json(result.scenario).metrics, result.splits_prefill)
    wanted = [*gated, "throughput_tokens_per_s", *MEMORY_METRICS]
    return [m for i, m in enumerate(wanted) if m in METRICS and m not in wanted[:i]]


def points(result: StoredResult) -> Iterator[tuple[StoredBatch, str, float, float, float, int, int]]:
    """(batch, metric, median of the process medians, p25 and p75 of the runs, runs, processes) per batch size
    that ran and exported metric it measured."""
    metrics = exported_metrics(result)
    for batch in result.batches:
        if not batch.ok:
            continue
        per_process: dict[int, list[Any]] = {}
        for run in batch.runs:
            per_process.setdefault(run.process, []).append(run)
        for metric, values in batch.values().items():
            if metric not in metrics or not all(np.isfinite(values)):
                continue
            medians = [np.median([r.values[metric] for r in runs]) for runs in per_process.values()]
            low, high = np.percentile(values, [25, 75])
            yield batch, metric, float(np.median(medians)), float(low), float(high), len(values), len(per_process)


def _test_name(result: StoredResult) -> str:
    return result.nodeid + (f" {result.key.split('::')[-1]}" if "::" in result.key else "")


def github_action_benchmark(
    results: Sequence[StoredResult], device: str, commit: str | None
) -> dict[str, list[dict[str, Any]]]:
    """{"customSmallerIsBetter": [...], "customBiggerIsBetter": [...]}, entries sorted by name."""
    files: dict[str, list[dict[str, Any]]] = {"customSmallerIsBetter": [], "customBiggerIsBetter": []}
    for result in results:
        for batch, metric, value, low, high, runs, processes in points(result):
            unit = dashboard_unit(metric)
            tool = "customBiggerIsBetter" if METRICS[metric].better == "higher" else "customSmallerIsBetter"
            files[tool].append(
                {
                    "name": f"{device} {_test_name(result)} bs={batch.batch_size} {metric}",
                    "value": float(f"{value:.6g}"),
                    "unit": unit,
                    "range": f"runs p25-p75: {low:.4g} to {high:.4g} {unit}",
                    "extra": (
                        (
                            f"median of {runs} runs (1 process)"
                            if processes == 1
                            else f"median of {processes} process medians ({runs} runs)"
                        )
                        + "\n"
                        f"commit {str(commit or 'unknown')[:12]}\n{METRICS[metric].definition}"
                    ),
                }
            )
    for entries in files.values():
        entries.sort(key=lambda e: e["name"])
    return files


def bencher_metric_format(results: Sequence[StoredResult]) -> dict[str, dict[str, dict[str, float]]]:
    """Bencher Metric Format: benchmark (`<test id> bs=<n>`) -> measure (`<metric> (<unit>)`) -> metric."""
    bmf: dict[str, dict[str, dict[str, float]]] = {}
    for result in results:
        for batch, metric, value, low, high, _, _ in points(result):
            bmf.setdefault(f"{_test_name(result)} bs={batch.batch_size}", {})[
                f"{metric} ({dashboard_unit(metric)})"
            ] = {
                "value": value,
                "lower_value": low,
                "upper_value": high,
            }
    return bmf


def export_files(report_dir: Path, document: Mapping[str, Any], formats: Sequence[str]) -> dict[Path, Any]:
    """The files `formats` ask for, from a session's JSON document: path -> JSON content."""
    device = str(document.get("device"))
    results = [StoredResult.from_json(b) for b in document.get("benchmarks") or []]
    commit = ((document.get("fingerprint") or {}).get("git") or {}).get("commit")
    files: dict[Path, Any] = {}
    if "github-action-benchmark" in formats:
        for tool, entries in github_action_benchmark(results, device, commit).items():
            files[Path(report_dir) / f"{device}.{tool}.json"] = entries
    if "bencher" in formats:
        files[Path(report_dir) / f"{device}.bmf.json"] = bencher_metric_format(results)
    return files


def write_session_exports(session: SessionSummary, document: Mapping[str, Any], written: Written) -> None:
    """At the end of a session: write the files of --llmperf-export; each path joins `written`, a file that cannot
    be written its errors."""
    for path, content in export_files(session.report_dir, document, session.export).items():
        try:
            write_text_atomic(path, json.dumps(content, indent=1, allow_nan=False) + "\n")
            written.paths.append(path)
        except OSError as exc:
            written.errors.append(
                f"llmperf: cannot write {path} (--llmperf-export): {exc}. Make the report "
                "directory writable or set --llmperf-report-dir"
            )
