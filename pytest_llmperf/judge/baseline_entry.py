"""One benchmark's baseline as the gate reads it (schema 3), and the one parser of a stored entry.

Per batch size: what the gate tests (each worker process's median of its runs, or the runs when one process
measured them), the runs each process took, the load other processes put on the machine and the digest of the
generated tokens; per entry the fingerprint, scenario, backend and date. `from_json` reads schema 3 and
reduces a schema-2 entry (every run of every process) to it, so the store, its migration
(judge/baselines.py) and readers of committed versions (report/html.py) read entries one way.

What a baseline may hold, checked when a file is read and before an entry is written: a value the gate cannot
compare meaningfully must never reach it. NaN or an empty list crash the rank test, and Infinity, zero or a
negative time give a ratio of nan/inf that passes. Times and throughputs (the metrics of `measure/metrics.py`
METRICS) must be finite and > 0; counters (a hit rate, anything a backend adds) finite and >= 0. Batch sizes are
integers >= 1. Each problem is a ValueError whose text names the entry, batch size and metric; the store adds
the file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..measure.instructions import COUNTS_TAKEN_WITH, INSTRUCTION_METRICS, count_table
from ..measure.metrics import METRICS, values_by_process
from ..measure.records import BenchmarkResult
from .outputs import Outputs, outputs_by_batch

#: What this version writes in an entry and in a batch size's record; anything else there is kept as it is (an
#: update never drops a field it does not know). Schema 2's fields are read and converted, never kept.
ENTRY_FIELDS = ("batches", "values", "errors", "unit", "fingerprint", "scenario", "backend", "git_commit", "created")
BATCH_FIELDS = ("runs_per_process", "foreign_load", "outputs", "runs", "processes")


def stored_value(value: float) -> float:
    """A value as the baseline file keeps it: 6 significant digits (one part in a million; timings scatter by far
    more). The gate compares current values through this too, so a deterministic counter (a hit rate of 51/184)
    ties with its baseline exactly instead of differing in the last digit, which the gate would read as a
    certain shift (both sides constant: no spread)."""
    return float(f"{value:.6g}")


def process_medians(runs: list[list[float]]) -> list[float]:
    """One value per worker process: the median of its runs (the gate's unit)."""
    return [float(np.median(values)) for values in runs if values]


@dataclass
class BaselineEntry:
    key: str
    # batch size -> metric -> what the gate tests: each worker process's median of its runs (unit "process"),
    # or the runs of the one process that measured them (unit "run")
    values: dict[int, dict[str, list[float]]]
    counts: dict[int, list[int]] = field(default_factory=dict)  # batch size -> runs each process took
    errors: dict[int, str] = field(default_factory=dict)  # batch size -> why it did not run ("oom: ...")
    foreign_load: dict[int, float] = field(default_factory=dict)  # batch size -> cores used by other processes
    unit: str = "process"  # "run": measured in one process, the gate tests its runs
    outputs: dict[int, str] = field(default_factory=dict)  # batch size -> digest of its generated ids
    fingerprint: dict[str, Any] = field(default_factory=dict)
    scenario: dict[str, Any] = field(default_factory=dict)
    backend: dict[str, Any] = field(default_factory=dict)
    git_commit: str | None = None
    created: str = ""
    # Fields this version does not know (a person's `comment`, a newer version's addition): kept as they are
    extra: dict[str, Any] = field(default_factory=dict)
    batch_extra: dict[int, dict[str, Any]] = field(default_factory=dict)  # the same, per batch size

    def process_values(self, batch_size: int) -> dict[str, list[float]]:
        """One value per worker process and metric (measured in one process: the median of its runs)."""
        values = self.values.get(batch_size, {})
        if self.unit == "run":
            return {m: [float(np.median(v))] for m, v in values.items() if v}
        return {m: list(v) for m, v in values.items()}

    @classmethod
    def of_result(
        cls, result: BenchmarkResult, *, fingerprint: Mapping[str, Any] | None = None, created: str = ""
    ) -> BaselineEntry:
        """What a measured benchmark stores as its baseline (and what an A/B comparison's A side is judged as)."""
        fingerprint = dict(fingerprint or {})
        if any(b.counted for b in result.batches):  # how its counts were taken: others are not comparable
            fingerprint["counts"] = COUNTS_TAKEN_WITH
        unit = "process" if any(len(b.processes) > 1 for b in result.batches if b.ok) else "run"
        values, counts = {}, {}
        for batch in result.batches:
            if batch.measured:
                per_process = values_by_process(batch.samples)
                # instruction counts (counting workers, --llmperf-instructions): each counting process's median
                values[batch.batch_size] = {
                    **_reduced(per_process, unit),
                    **_reduced(count_table(batch.counted), "process"),
                }
                counts[batch.batch_size] = [sum(s.process == p for s in batch.samples) for p in batch.processes]
        return cls(
            key=result.key,
            values=values,
            counts=counts,
            errors={b.batch_size: f"{b.status}: {b.error}" for b in result.batches if not b.measured},
            foreign_load={b.batch_size: b.foreign_load for b in result.batches if b.foreign_load is not None},
            unit=unit,
            outputs={bs: o.digest for bs, o in outputs_by_batch(result.batches).items()},
            fingerprint=fingerprint,
            scenario=result.scenario,
            backend={k: v for k, v in result.backend.items() if k != "model_path"},
            git_commit=(fingerprint.get("git") or {}).get("commit"),
            created=created,
        )

    def to_json(self) -> dict[str, Any]:
        """Schema 3: per batch size what was measured about it (`batches`) and what the gate tests (`values`);
        the commit is the fingerprint's."""
        batches: dict[str, Any] = {}
        for bs in sorted(self.values):
            batch: dict[str, Any] = dict(self.batch_extra.get(bs, {}))
            if bs in self.counts:
                batch["runs_per_process"] = list(self.counts[bs])
            if bs in self.foreign_load:
                batch["foreign_load"] = round(self.foreign_load[bs], 3)
            if bs in self.outputs:
                batch["outputs"] = self.outputs[bs]
            batches[str(bs)] = batch
        values = {
            str(bs): {m: [stored_value(v) for v in vals] for m, vals in metrics.items()}
            for bs, metrics in sorted(self.values.items())
        }
        fingerprint = dict(self.fingerprint)
        if self.git_commit and not (fingerprint.get("git") or {}).get("commit"):
            fingerprint["git"] = {**(fingerprint.get("git") or {}), "commit": self.git_commit}
        data = {
            **self.extra,
            "batches": batches,
            "values": values,
            "unit": self.unit,
            "fingerprint": fingerprint,
            "scenario": self.scenario,
            "backend": self.backend,
            "created": self.created,
        }
        if self.errors:
            data["errors"] = {str(bs): msg for bs, msg in sorted(self.errors.items())}
        return data

    @classmethod
    def from_json(cls, key: str, data: Mapping[str, Any]) -> BaselineEntry:
        """An entry of schema 3, or of schema 2 (per-run values, one list per process) reduced to schema 3's."""
        unit = str(data.get("unit", "process"))
        values: dict[int, dict[str, list[float]]] = {}
        counts: dict[int, list[int]] = {}
        outputs: dict[int, str] = {}
        for text, metrics in (data.get("values") or {}).items():  # schema 3
            values[int(text)] = {m: [float(v) for v in vals] for m, vals in metrics.items()}
        for text, batch in data["batches"].items():
            bs = int(text)
            if batch.get("runs_per_process") is not None:
                counts[bs] = [int(n) for n in batch["runs_per_process"]]
            if "runs" in batch:  # schema 2: per-run values, one list per process
                per_process = {m: [[float(v) for v in run] for run in runs] for m, runs in batch["runs"].items()}
                values[bs] = _reduced(per_process, unit)
                counts[bs] = [len(runs) for runs in next(iter(per_process.values()), [])]
            elif bs not in values:  # e.g. schema 1's per-run lists, in a history
                raise ValueError(f"entry {key!r}, batch size {bs}: no values")
            if isinstance(batch.get("outputs"), str):
                outputs[bs] = batch["outputs"]
            elif batch.get("outputs") is not None:  # schema 2 kept the ids and text; the digest is what is compared
                outputs[bs] = _outputs(key, text, batch["outputs"]).digest
        return cls(
            key=key,
            values=values,
            counts=counts,
            errors={int(bs): str(msg) for bs, msg in data.get("errors", {}).items()},
            foreign_load={
                int(bs): float(batch["foreign_load"])
                for bs, batch in data["batches"].items()
                if batch.get("foreign_load") is not None
            },
            unit=unit,
            outputs=outputs,
            fingerprint=dict(data.get("fingerprint", {})),
            scenario=dict(data.get("scenario", {})),
            backend=dict(data.get("backend", {})),
            git_commit=data.get("git_commit") or ((data.get("fingerprint") or {}).get("git") or {}).get("commit"),
            created=str(data.get("created", "")),
            extra={k: v for k, v in data.items() if k not in ENTRY_FIELDS},
            batch_extra={
                int(bs): extra
                for bs, batch in data["batches"].items()
                if (extra := {k: v for k, v in batch.items() if k not in BATCH_FIELDS})
            },
        )

    def keeping_extras_of(self, old: BaselineEntry | None) -> BaselineEntry:
        """This entry with the unknown fields of the entry it replaces (of its batch sizes that remain)."""
        if old is None:
            return self
        return replace(
            self,
            extra={**old.extra, **self.extra},
            batch_extra={bs: old.batch_extra[bs] for bs in self.values if bs in old.batch_extra},
        )


def _reduced(per_process: Mapping[str, list[list[float]]], unit: str) -> dict[str, list[float]]:
    """What the gate tests from per-run values, one list per process: the medians, or one process's runs."""
    if unit == "run":
        return {m: [v for run in runs for v in run] for m, runs in per_process.items()}
    return {m: process_medians(runs) for m, runs in per_process.items()}


def _outputs(key: str, batch_size: str, data: Any) -> Outputs:
    if not isinstance(data, Mapping):
        raise ValueError(f"entry {key!r}, batch size {batch_size}: 'outputs' is not an object")
    try:
        return Outputs.from_json(data)
    except ValueError as exc:
        raise ValueError(f"entry {key!r}, batch size {batch_size}: {exc}") from None


UNITS = ("process", "run")
#: Units (worker processes, or runs of one process) a baseline's batch needs: the gate estimates their spread,
#: and of one unit it cannot (its interval would be [0, inf]: every verdict inconclusive, whatever the slowdown).
MIN_UNITS = 2


def _where(key: str, batch: object = None, metric: str | None = None) -> str:
    parts = [f"entry {key!r}"]
    if batch is not None:
        parts.append(f"batch size {batch}")
    if metric is not None:
        parts.append(f"metric {metric}")
    return ", ".join(parts)


def check_value(value: Any, metric: str) -> str | None:
    """Why `value` cannot be a value of `metric`, or None when it can."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value!r} is not a number"
    if not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if metric in METRICS and value <= 0:
        return f"{value!r} is not > 0 (a {'time' if METRICS[metric].unit == 'ms' else 'throughput'} must be positive)"
    if value < 0:
        return f"{value!r} is negative (a counter is >= 0)"
    return None


def check_batch_size(text: Any) -> int:
    """The batch size a JSON key stands for: the decimal digits of an integer >= 1."""
    if not isinstance(text, str) or not text.isdigit() or int(text) < 1:
        raise ValueError(f"batch size {text!r} is not an integer >= 1")
    return int(text)


def check_runs(key: str, batch: object, metric: str, per_process: Any) -> None:
    """Per-process lists of per-run values: at least one process, each with at least one valid value."""
    if not isinstance(per_process, list) or not per_process:
        raise ValueError(
            f"{_where(key, batch, metric)}: expected a non-empty list of per-process lists of runs, got {per_process!r}"
        )
    for values in per_process:
        if not isinstance(values, list) or not values:
            raise ValueError(f"{_where(key, batch, metric)}: a process holds no runs ({values!r})")
        for value in values:
            problem = check_value(value, metric)
            if problem:
                raise ValueError(f"{_where(key, batch, metric)}: value {problem}")


def check_values(key: str, batch: object, metric: str, values: Any) -> None:
    """What the gate tests (schema 3): a non-empty list of valid values, one per process or per run."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"{_where(key, batch, metric)}: expected a non-empty list of values, got {values!r}")
    for value in values:
        problem = check_value(value, metric)
        if problem:
            raise ValueError(f"{_where(key, batch, metric)}: value {problem}")


def check_counts(key: str, batch: object, counts: Any, values: Mapping[str, Any], unit: Any) -> None:
    """Runs per process (schema 3): integers >= 1, one per process (unit process) or adding up to the runs (run).
    Instruction counts come from their own counting processes (one median each) and are not held to them."""
    if (
        not isinstance(counts, list)
        or not counts
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts)
    ):
        raise ValueError(f"{_where(key, batch)}: runs_per_process must be a list of integers >= 1, got {counts!r}")
    expected = sum(counts) if unit == "run" else len(counts)
    for metric, found in values.items():
        if metric not in INSTRUCTION_METRICS and len(found) != expected:
            raise ValueError(
                f"{_where(key, batch, metric)}: {len(found)} values for runs_per_process {counts} "
                f"(unit {unit}): expected {expected}"
            )


def _check_raw_batch(key: str, text: str, batch: Any, values: Any, unit: Any) -> None:
    """One batch size of an entry: schema 3 (its 'values' beside it), or schema 2 ('runs', one list per process)."""
    if not isinstance(batch, Mapping):
        raise ValueError(f"{_where(key, text)}: expected an object, got {type(batch).__name__}")
    if "runs" in batch:  # schema 2
        if not isinstance(batch["runs"], Mapping) or not batch["runs"]:
            raise ValueError(f"{_where(key, text)}: expected {{'runs': {{metric: [[values]]}}}}")
        for metric, per_process in batch["runs"].items():
            check_runs(key, text, metric, per_process)
        return
    if not isinstance(values, Mapping) or not isinstance(values.get(text), Mapping) or not values[text]:
        raise ValueError(f"{_where(key, text)}: no values ('values': {{{text!r}: {{metric: [values]}}}})")
    for metric, found in values[text].items():
        check_values(key, text, metric, found)
    if batch.get("runs_per_process") is not None:
        check_counts(key, text, batch["runs_per_process"], values[text], unit)
    if batch.get("outputs") is not None and not (
        isinstance(batch["outputs"], str) and batch["outputs"].startswith("sha256:")
    ):
        raise ValueError(f"{_where(key, text)}: outputs {batch['outputs']!r} is not a digest (sha256:...)")


def check_raw_entry(key: str, data: Any) -> None:
    """An entry as read from JSON (schema 3, or schema 2 on its way to conversion), before it becomes a
    BaselineEntry."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{_where(key)}: expected an object, got {type(data).__name__}")
    if data.get("unit", "process") not in UNITS:
        raise ValueError(f"{_where(key)}: unit {data.get('unit')!r} is not one of {', '.join(UNITS)}")
    batches = data.get("batches")
    if not isinstance(batches, Mapping):
        raise ValueError(f"{_where(key)}: 'batches' is missing or not an object")
    for text, batch in batches.items():
        try:
            check_batch_size(text)
        except ValueError as exc:
            raise ValueError(f"{_where(key)}: {exc}") from None
        _check_raw_batch(key, text, batch, data.get("values"), data.get("unit", "process"))
        load = batch.get("foreign_load")
        if load is not None and (check_value(load, "foreign_load") is not None):
            raise ValueError(f"{_where(key, text)}: foreign_load {check_value(load, 'foreign_load')}")
    extra = sorted(set(data.get("values") or {}) - set(batches)) if isinstance(data.get("values"), Mapping) else []
    if extra:
        raise ValueError(f"{_where(key)}: values of batch size {extra[0]} that 'batches' does not list")
    errors = data.get("errors", {})
    if not isinstance(errors, Mapping):
        raise ValueError(f"{_where(key)}: 'errors' is not an object")
    for text in errors:
        try:
            check_batch_size(text)
        except ValueError as exc:
            raise ValueError(f"{_where(key)}: errors: {exc}") from None


def too_few_units(key: str, unit: str, values: Mapping[Any, Mapping[str, Any]]) -> str | None:
    """Why a baseline's batches hold too few units (worker processes' medians, or one process's runs) of a timed
    metric to be compared with (fewer than MIN_UNITS), or None. Instruction counts are held to a tolerance, not
    tested, so one counting process is enough for them."""
    for batch_size, metrics in sorted(values.items()):
        for metric, units_of in metrics.items():
            units = len(units_of)
            if metric in INSTRUCTION_METRICS or units >= MIN_UNITS:
                continue
            what = (
                ("worker process" + ("es" if units != 1 else ""))
                if unit == "process"
                else ("run" + ("s" if units != 1 else ""))
            )
            return (
                f"{_where(key, batch_size)}: the baseline holds {units} {what}; the gate needs at least "
                f"{MIN_UNITS} to estimate their spread"
            )
    return None


def check_entry(entry: Any) -> None:
    """An entry about to be written (a BaselineEntry): the same rules, on the measured values."""
    for batch_size, metrics in entry.values.items():
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"{_where(entry.key)}: batch size {batch_size!r} is not an integer >= 1")
        for metric, values in metrics.items():
            check_values(entry.key, batch_size, metric, list(values) if isinstance(values, (list, tuple)) else values)
        if batch_size in entry.counts:
            check_counts(entry.key, batch_size, list(entry.counts[batch_size]), metrics, entry.unit)
    for batch_size, load in entry.foreign_load.items():
        problem = check_value(load, "foreign_load")
        if problem:
            raise ValueError(f"{_where(entry.key, batch_size)}: foreign_load {problem}")
    if entry.unit not in UNITS:
        raise ValueError(f"{_where(entry.key)}: unit {entry.unit!r} is not one of {', '.join(UNITS)}")
