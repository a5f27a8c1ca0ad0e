"""What a baseline may hold: checked when a file is read and before an entry is written.

A value the gate cannot compare meaningfully must never reach it: NaN or an empty list crash the rank
test, and Infinity, zero or a negative time give a ratio of nan/inf that passes. Times and throughputs
(the metrics of `measure/metrics.py` METRICS) must be finite and > 0; counters (a hit rate, anything
a backend adds) finite and >= 0. Batch sizes are integers >= 1. Each problem is a ValueError whose
text names the entry, batch size and metric; the store adds the file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..measure.instructions import INSTRUCTION_METRICS
from ..measure.metrics import METRICS

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
