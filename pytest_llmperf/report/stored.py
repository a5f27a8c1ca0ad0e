"""The JSON report: what it keeps of a measured benchmark (what its markdown is rendered from), and how
`reports/<device>.json` accumulates over sessions.

Per run: the worker process that took it, its value of every metric (6 significant digits), the tokens it
generated, and its NVML readings and failed requests where it has them. Per batch size: the summary
(percentiles of the runs), the status, and what the runs generated (digest and first sequence, or how many
distinct outputs). Per benchmark: the run-quality notes. The raw timings a run is computed from (every
token's arrival, every decode step, the generated ids) are not kept: the reports show percentiles and
medians of the runs' values, the plots per-run values, and the gate reads the baselines, not the report.

A report written before this format (raw runs) is read by rebuilding its runs (`RunSample`) and reducing
them the same way, so an accumulated report shrinks as it is rewritten.

`reports/<device>.json` accumulates: every benchmark measured on the device, newest result per benchmark.

A session's document replaces the entries of the benchmarks it measured and keeps the others from the
previous report; each benchmark records when and at which commit it was measured. A previous report
that cannot be read is not lost: it is moved aside to `<name>.corrupt-<UTC time>` and the caller warns.
The markdown is rendered from the accumulated document, the same way for every benchmark; entries an
older version wrote with raw runs are reduced to the format above when the report is rewritten.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..judge.outputs import observed
from ..judge.quality import quality_notes
from ..measure.backend import GenerationRequest, sample_problem
from ..measure.instructions import count_table
from ..measure.metrics import generated_tokens, run_values, summarize
from ..measure.records import BatchResult, BenchmarkResult, RunSample

SIGNIFICANT_DIGITS = 6  # a run's values vary by more than 1e-6 between runs; the tables print 4 digits


def _rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def is_value(value: Any) -> bool:
    """A metric value a report can plot and summarise: a finite number. A report written before runs were checked
    (measure/backend.py check_sample) may hold null where a backend returned NaN; such values are left out."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_metric_values(runs: Any, metric: str) -> list[tuple[Any, float]]:
    """(process, value) of `metric` for each of a report batch's runs (JSON) that holds a finite value of it."""
    return [
        (run.get("process", 0), float(run["values"][metric]))
        for run in runs or []
        if isinstance(run, Mapping) and is_value((run.get("values") or {}).get(metric))
    ]


def batch_medians(benchmark: Mapping[str, Any], metrics: Iterable[str]) -> dict[int, dict[str, float]]:
    """Per batch size that ran and metric, the median of the per-process medians of the runs (with one
    process: the median of its runs), as the baseline points are (report/html.py)."""
    metrics = list(metrics)
    medians: dict[int, dict[str, float]] = {}
    for batch in benchmark.get("batches") or []:
        if batch.get("status", "ok") != "ok":
            continue
        for metric in metrics:
            per_process: dict[Any, list[float]] = {}
            for process, value in run_metric_values(batch.get("runs"), metric):
                per_process.setdefault(process, []).append(value)
            if per_process:
                medians.setdefault(int(batch["batch_size"]), {})[metric] = float(
                    np.median([np.median(v) for v in per_process.values()])
                )
    return medians


@dataclass
class StoredRun:
    """One run as the report keeps it."""

    values: dict[str, float]  # metric -> value (run_values)
    process: int = 0
    tokens: int = 0  # generated tokens of the whole batch
    gpu: dict[str, float] = field(default_factory=dict)  # NVML: energy, clocks, throttle reasons
    failed_requests: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, sample: RunSample) -> StoredRun:
        return cls(
            {k: _rounded(v) for k, v in run_values(sample).items()},
            sample.process,
            generated_tokens(sample),
            dict(sample.gpu),
            list(sample.failed_requests),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"process": self.process, "values": self.values, "tokens": self.tokens}
        if self.gpu:
            data["gpu"] = self.gpu
        if self.failed_requests:
            data["failed_requests"] = self.failed_requests
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoredRun:
        values = {k: float(v) for k, v in (data.get("values") or {}).items() if is_value(v)}
        return cls(
            values,
            int(data.get("process") or 0),
            int(data.get("tokens") or 0),
            dict(data.get("gpu") or {}),
            list(data.get("failed_requests") or []),
        )


@dataclass
class StoredBatch:
    """One batch size: its runs, or why it did not run; what its runs generated."""

    batch_size: int
    runs: list[StoredRun] = field(default_factory=list)
    status: str = "ok"  # ok | oom | error
    error: str | None = None
    warmups: int = 0
    foreign_load: float | None = None
    retaken: int = 0
    outputs: dict[str, Any] | None = None  # {"digest", "sequence_0"} when the runs agree, else {"distinct": n}
    counts: dict[str, list[float]] = field(default_factory=dict)  # instructions of each counted run (instructions.py)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.runs)

    @property
    def oom(self) -> bool:
        return self.status == "oom"

    @property
    def counted_only(self) -> bool:
        """Counted under callgrind and not timed (--llmperf-instructions-only)."""
        return self.status == "ok" and not self.runs and bool(self.counts)

    def values(self) -> dict[str, list[float]]:
        """Per-run values of every metric that all runs measured, in run order (measure.metrics.values_by_metric)."""
        if not self.runs:
            return {}
        names = set(self.runs[0].values).intersection(*(r.values for r in self.runs[1:]))
        return {name: [r.values[name] for r in self.runs] for name in sorted(names)}

    @classmethod
    def of(cls, batch: BatchResult) -> StoredBatch:
        seen = observed(batch.samples) if batch.ok else None
        outputs: dict[str, Any] | None = None
        if seen is not None and seen.outputs is not None:
            first = seen.outputs.texts[0] if seen.outputs.texts else " ".join(map(str, seen.outputs.tokens[0]))
            outputs = {"digest": seen.outputs.digest, "sequence_0": first[:200]}
        elif seen is not None:
            outputs = {"distinct": seen.distinct}
        counts = {m: [v for values in runs for v in values] for m, runs in count_table(batch.counted).items()}
        return cls(
            batch.batch_size,
            [StoredRun.of(s) for s in batch.samples],
            batch.status,
            batch.error,
            batch.warmups,
            batch.foreign_load,
            batch.retaken,
            outputs,
            counts,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "status": self.status,
            "error": self.error,
            "warmups": self.warmups,
            "foreign_load": self.foreign_load,
            "retaken": self.retaken,
            "outputs": self.outputs,
            "runs": [r.to_json() for r in self.runs],
            "summary": {m: summarize(v).to_json() for m, v in self.values().items()},
            **({"counts": self.counts} if self.counts else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoredBatch:
        runs = [StoredRun.from_json(r) for r in data.get("runs") or [] if not _null_values(r)]
        return cls(
            int(data["batch_size"]),
            runs,
            str(data.get("status") or "ok"),
            data.get("error"),
            int(data.get("warmups") or 0),
            data.get("foreign_load"),
            int(data.get("retaken") or 0),
            data.get("outputs"),
            {str(m): [float(v) for v in values] for m, values in (data.get("counts") or {}).items()},
        )


@dataclass
class StoredResult:
    """A measured benchmark as the report keeps it (the report's counterpart of measure.records.BenchmarkResult)."""

    key: str
    nodeid: str
    module: str
    scenario: dict[str, Any]
    backend: dict[str, Any]
    batches: list[StoredBatch]
    group: str | None = None
    splits_prefill: bool = False
    run_quality: list[str] = field(default_factory=list)  # judge/quality.py's notes, made from the raw runs

    def batch(self, batch_size: int) -> StoredBatch | None:
        return next((b for b in self.batches if b.batch_size == batch_size), None)

    @classmethod
    def of(cls, result: BenchmarkResult) -> StoredResult:
        return cls(
            result.key,
            result.nodeid,
            result.module,
            dict(result.scenario),
            dict(result.backend),
            [StoredBatch.of(b) for b in result.batches],
            result.group,
            result.splits_prefill,
            quality_notes(result),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "nodeid": self.nodeid,
            "module": self.module,
            "group": self.group,
            "scenario": self.scenario,
            "backend": self.backend,
            "splits_prefill": self.splits_prefill,
            "run_quality": self.run_quality,
            "batches": [b.to_json() for b in self.batches],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoredResult:
        """A report's benchmark entry; one written with raw runs is reduced from them."""
        if _has_raw_runs(data):
            return cls.of(raw_result(data))
        return cls(
            str(data["key"]),
            str(data["nodeid"]),
            str(data.get("module") or ""),
            dict(data.get("scenario") or {}),
            dict(data.get("backend") or {}),
            [StoredBatch.from_json(b) for b in data.get("batches") or []],
            data.get("group"),
            bool(data.get("splits_prefill")),
            list(data.get("run_quality") or []),
        )


def stored(result: BenchmarkResult | StoredResult) -> StoredResult:
    return result if isinstance(result, StoredResult) else StoredResult.of(result)


def _has_raw_runs(data: Mapping[str, Any]) -> bool:
    return any("token_times_ns" in run for b in data.get("batches") or [] for run in b.get("runs") or [])


def _usable(sample: RunSample) -> bool:
    """A raw run of an older report that is a measurement (one with a NaN time, written as null, is not)."""
    return sample_problem(sample, GenerationRequest(sample.batch_size, 1, 1, "")) is None


def raw_result(data: Mapping[str, Any]) -> BenchmarkResult:
    """A benchmark entry of a report written with raw runs, as the record it was made from (its runs that
    measured nothing, such as null times, left out)."""
    names = {f.name for f in fields(RunSample)}
    batches = [
        BatchResult(
            batch_size=int(b["batch_size"]),
            samples=[
                s
                for run in b.get("runs") or []
                if _usable(s := RunSample(**{k: v for k, v in run.items() if k in names}))
            ],
            warmups=int(b.get("warmups") or 0),
            error=b.get("error"),
            oom=b.get("status") == "oom",
            foreign_load=b.get("foreign_load"),
            retaken=int(b.get("retaken") or 0),
        )
        for b in data.get("batches") or []
    ]
    return BenchmarkResult(
        key=data["key"],
        nodeid=data["nodeid"],
        module=data.get("module", ""),
        scenario=data.get("scenario") or {},
        backend=data.get("backend") or {},
        batches=batches,
        group=data.get("group"),
    )


def _null_values(run: Mapping[str, Any]) -> bool:
    return any(not is_value(v) for v in (run.get("values") or {}).values())


def _has_null_values(data: Mapping[str, Any]) -> bool:
    return any(_null_values(run) for b in data.get("batches") or [] for run in b.get("runs") or [])


def compact_entry(data: Mapping[str, Any]) -> dict[str, Any]:
    """A report's benchmark entry in this format, its other keys (e.g. `measured`) kept; runs with null values
    (NaN from a backend, before runs were checked) are left out, and the summaries are made again without them."""
    if not _has_raw_runs(data) and not _has_null_values(data):
        return dict(data)
    return {**data, **StoredResult.from_json(data).to_json()}


def reference_summary(result: BenchmarkResult) -> dict[str, Any]:
    """What the report keeps of an A/B comparison's reference side: per batch size its status, how many runs,
    the summary of its runs' values, and each worker process's median per metric by process index (what the
    gate paired with this side's processes: scripts/replay_gate.py replays the gate from them)."""
    reduced = StoredResult.of(result)
    return {
        "key": reduced.key,
        "nodeid": reduced.nodeid,
        "backend": reduced.backend,
        "batches": [
            {
                "batch_size": b.batch_size,
                "status": b.status,
                "runs": len(b.runs),
                "summary": {m: summarize(v).to_json() for m, v in b.values().items()},
                "processes": _process_medians(b),
                "process_runs": _process_runs(b),
            }
            for b in reduced.batches
        ],
    }


def _process_runs(batch: StoredBatch) -> dict[str, dict[str, list[float]]]:
    """{metric: {process index: that process's runs, in the order taken}} (the gate tests them: judge/stats.py)."""
    found: dict[str, dict[int, list[float]]] = {}
    for run in batch.runs:
        for metric, value in run.values.items():
            found.setdefault(metric, {}).setdefault(run.process, []).append(_rounded(value))
    return {m: {str(p): v for p, v in sorted(per.items())} for m, per in sorted(found.items())}


def _process_medians(batch: StoredBatch) -> dict[str, dict[str, float]]:
    """{metric: {process index: the median of that process's runs}}."""
    return {m: {p: _rounded(float(np.median(v))) for p, v in per.items()} for m, per in _process_runs(batch).items()}


def compact_reference(data: Any) -> Any:
    """An outcome's `reference` of an older report (the reference side's raw result) as reference_summary."""
    if isinstance(data, Mapping) and any("samples" in b for b in data.get("batches") or []):
        return reference_summary(BenchmarkResult.from_json(dict(data)))
    return data


SCHEMA_VERSION = 1


class ReportError(Exception):
    """A report file that is missing, unreadable or not a pytest-llmperf report (the message names it)."""


def identity(entry: Mapping[str, Any]) -> tuple[str, str]:
    return str(entry.get("nodeid")), str(entry.get("key"))


def read_report(path: Path) -> dict[str, Any]:
    """A pytest-llmperf JSON report, or ReportError saying what is wrong with the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if (
        not isinstance(document, dict)
        or not isinstance(document.get("benchmarks"), list)
        or "device" not in document
        or "schema_version" not in document
    ):
        raise ReportError(
            f"{path}: not a pytest-llmperf report (expected the JSON that pytest-llmperf writes to "
            "reports/<device>.json, with schema_version, device and benchmarks)"
        )
    for i, benchmark in enumerate(document["benchmarks"]):
        batches = benchmark.get("batches") if isinstance(benchmark, dict) else None
        if (
            not isinstance(batches, list)
            or not {"key", "nodeid"} <= set(benchmark)
            or not all(isinstance(b, dict) and isinstance(b.get("batch_size"), int) for b in batches)
        ):
            raise ReportError(
                f"{path}: benchmarks[{i}] is damaged (each needs key, nodeid and batches with a "
                "batch_size); restore the file from the job's artifacts or re-run the benchmarks"
            )
    return document


def stamp(document: dict[str, Any]) -> dict[str, Any]:
    """Mark each benchmark of a session's document with when and at which commit it was measured."""
    git = (document.get("fingerprint") or {}).get("git") or {}
    measured = {"created": document.get("created"), "commit": git.get("commit"), "dirty": bool(git.get("dirty"))}
    for benchmark in document.get("benchmarks") or []:
        benchmark.setdefault("measured", dict(measured))
    for outcome in document.get("outcomes") or []:
        outcome.setdefault("measured", dict(measured))
    return document


def accumulate(previous: Mapping[str, Any] | None, current: dict[str, Any]) -> dict[str, Any]:
    """The current session's document, plus every benchmark of `previous` it did not measure again."""
    current = stamp(current)
    if not previous:
        return current
    previous = stamp(json.loads(json.dumps(previous)))  # an older report has no stamps: its own date and commit
    measured_now = {identity(b) for b in current.get("benchmarks") or []}
    measured_now |= {identity(o) for o in current.get("outcomes") or []}
    merged = dict(current)
    for name in ("benchmarks", "outcomes", "verdicts"):
        kept = [e for e in previous.get(name) or [] if identity(e) not in measured_now]
        merged[name] = kept + list(current.get(name) or [])
    # a report written before this module's format shrinks as it is rewritten
    merged["benchmarks"] = [compact_entry(b) for b in merged["benchmarks"]]
    merged["outcomes"] = [{**o, "reference": compact_reference(o.get("reference"))} for o in merged["outcomes"]]
    merged["benchmarks"].sort(key=identity)
    merged["outcomes"].sort(key=identity)
    merged["counts"] = dict(current.get("counts") or {})  # this session's; the others' are in their rows
    return merged


def load_previous(path: Path, now: datetime | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(previous report or None, warning or None). A corrupt one is moved to <name>.corrupt-<time>."""
    if not path.exists():
        return None, None
    try:
        return read_report(path), None
    except ReportError as exc:
        stamp_ = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
        aside = path.with_name(f"{path.name}.corrupt-{stamp_}")
        try:
            os.replace(path, aside)
        except OSError as move_error:
            return None, (
                f"{exc}; could not move it aside ({move_error}); the report now holds this session's benchmarks only"
            )
        return None, (f"{exc}. Moved it to {aside} (nothing lost); the report now holds this session's benchmarks only")


def update_report(path: Path, session_document: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The accumulated document to write to `path` (reports/<device>.json), and a warning when the previous
    report could not be read (it was moved aside, see load_previous)."""
    previous, warning = load_previous(path)
    if previous is not None and previous.get("device") != session_document.get("device"):
        warning = (
            f"{path} holds device {previous.get('device')!r}, this session measured "
            f"{session_document.get('device')!r}: its benchmarks are not carried over"
        )
        previous = None
    return accumulate(previous, session_document), warning
