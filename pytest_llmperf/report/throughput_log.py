"""Seed 002's dated throughput log: one table per target that gains a row when baselines are updated.

`reports/<device>-throughput-log.json` is the record (rows per target, oldest first);
`reports/<device>-throughput-log.md` is rendered from it in seed 002's layout:

    ## <target>

    Date | Device | dtype | batch size | cache length | max input length | max output length | throughput (token/s)
    ---- | ------ | ----- | ---------- | ------------ | ---------------- | ----------------- | --------------------
    2024-04-24 | TPU v5e-8 | bfloat16 | 128 | 2048 | 1024 | 1024 | 8249

Pure functions plus one writer (`append_row`), which rewrites both files atomically under a lock
(pytest_llmperf/files.py), so a crash never leaves half a log and two updates at once both land.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..files import locked, write_text_atomic
from ..measure.metrics import values_by_metric
from ..measure.records import BenchmarkResult

SCHEMA_VERSION = 1
HEADER = (
    "Date",
    "Device",
    "dtype",
    "batch size",
    "cache length",
    "max input length",
    "max output length",
    "throughput (token/s)",
)


@dataclass(frozen=True)
class ThroughputRow:
    date: str  # YYYY-MM-DD
    device: str
    dtype: str
    batch_size: int
    cache_length: int | None
    max_input_length: int | None
    max_output_length: int | None
    throughput: float  # generated tokens per second, median over runs

    def cells(self) -> list[str]:
        def opt(v: int | None) -> str:
            return "" if v is None else str(v)

        return [
            self.date,
            self.device,
            self.dtype,
            str(self.batch_size),
            opt(self.cache_length),
            opt(self.max_input_length),
            opt(self.max_output_length),
            f"{self.throughput:.0f}",
        ]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ThroughputRow:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


def render_table(rows: Sequence[ThroughputRow]) -> str:
    """Seed 002's table: `|`-separated header, dashes, one line per row (oldest first)."""
    lines = [" | ".join(HEADER), " | ".join("-" * len(h) for h in HEADER)]
    lines += [" | ".join(row.cells()) for row in rows]
    return "\n".join(lines)


def render_log(targets: Mapping[str, Sequence[ThroughputRow]], title: str = "Benchmark results") -> str:
    parts = [f"# {title}"]
    for target in targets:
        parts.append(f"## {target}\n\n{render_table(targets[target])}")
    return "\n\n\n".join(parts) + "\n"


def rows_from_result(result: BenchmarkResult, date: str) -> list[ThroughputRow]:
    """One row per batch size that ran: median `throughput_tokens_per_s` over its runs.

    Device, dtype, cache length and max input/output length come from the backend's
    description (JetStream's fixture records them); the batch size is the number of concurrent
    requests of the run. The max output length falls back to the scenario's decode length.
    """
    b, s = result.backend, result.scenario
    rows = []
    for batch in result.batches:
        if not batch.ok:
            continue
        values = values_by_metric(batch.samples).get("throughput_tokens_per_s")
        if not values:
            continue
        rows.append(
            ThroughputRow(
                date=date,
                device=str(b.get("device", "unknown")),
                dtype=str(b.get("dtype", "unknown")),
                batch_size=batch.batch_size,
                cache_length=b.get("cache_length"),
                max_input_length=b.get("max_input_length") or s.get("sequence_length"),
                max_output_length=b.get("max_output_length") or s.get("decode_length"),
                throughput=float(statistics.median(values)),
            )
        )
    return rows


def log_paths(report_dir: Path, device: str) -> tuple[Path, Path]:
    return Path(report_dir) / f"{device}-throughput-log.md", Path(report_dir) / f"{device}-throughput-log.json"


def read_log(json_path: Path) -> dict[str, list[ThroughputRow]]:
    """The rows per target stored at `json_path` ({} when it does not exist)."""
    try:
        data = json.loads(Path(json_path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"throughput log {json_path} is not readable JSON ({exc}); fix or remove it") from exc
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"throughput log {json_path} has schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}"
        )
    return {t: [ThroughputRow.from_json(r) for r in rows] for t, rows in data.get("targets", {}).items()}


def append_rows(report_dir: Path, device: str, target: str, rows: Iterable[ThroughputRow]) -> tuple[Path, Path]:
    """Add rows to `target`'s table in the device's log; rewrite the JSON and markdown atomically."""
    md_path, json_path = log_paths(report_dir, device)
    with locked(json_path):  # two updates at once: both rows land
        targets = read_log(json_path)
        targets.setdefault(target, []).extend(rows)
        doc = {
            "schema_version": SCHEMA_VERSION,
            "device": device,
            "targets": {t: [asdict(r) for r in rs] for t, rs in targets.items()},
        }
        write_text_atomic(json_path, json.dumps(doc, indent=1) + "\n")
        write_text_atomic(md_path, render_log(targets, title=f"Benchmark results: {device}"))
    return md_path, json_path


def append_row(report_dir: Path, device: str, target: str, row: ThroughputRow) -> tuple[Path, Path]:
    return append_rows(report_dir, device, target, [row])
