"""Files for benchmark dashboards, written with `--llmperf-export` into the report directory.

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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..files import write_text_atomic
from ..measure.metrics import MEMORY_METRICS, METRICS, gated_metrics
from ..measure.scenario import Scenario
from .stored import StoredBatch, StoredResult
from .summary import SessionSummary, Written

FORMATS = ("github-action-benchmark", "bencher")
UNITS = {"tokens/secs": "tokens/s"}


def unit_of(metric: str) -> str:
    unit = METRICS[metric].unit
    return UNITS.get(unit, unit)


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
            unit = unit_of(metric)
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
            bmf.setdefault(f"{_test_name(result)} bs={batch.batch_size}", {})[f"{metric} ({unit_of(metric)})"] = {
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
