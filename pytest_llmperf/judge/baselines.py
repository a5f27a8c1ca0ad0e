"""Baselines on disk: `<baseline_dir>/<device>/<test module path>.json`, one file per module per device.

A file holds, per benchmark key and batch size, the raw per-run values of every metric, plus the
environment fingerprint, git commit and date. Keys are sorted so diffs review well. Writes go to a
temporary file in the same directory, then `os.replace` (atomic); an update keeps the entries of
tests that were not selected. A file that cannot be read is never overwritten: the error names it
and the fix, and the file stays as it was.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA_VERSION = 2


def stored_value(value: float) -> float:
    """A per-run value as the baseline file keeps it: 10 significant digits. The gate compares current
    values through this too, so a deterministic counter (a hit rate of 51/184) ties with its baseline
    exactly instead of differing in the 7th digit, which a rank test reads as a complete shift."""
    return float(f"{value:.10g}")


class BaselineError(Exception):
    """A baseline file or directory that cannot be used; the message names it and the fix."""


def process_medians(runs: list[list[float]]) -> list[float]:
    """One value per worker process: the median of its runs (the gate's unit)."""
    return [float(np.median(values)) for values in runs if values]


@dataclass
class BaselineEntry:
    key: str
    runs: dict[int, dict[str, list[list[float]]]]  # batch size -> metric -> per-process lists of per-run values
    errors: dict[int, str] = field(default_factory=dict)  # batch size -> why it did not run ("oom: ...")
    foreign_load: dict[int, float] = field(default_factory=dict)  # batch size -> cores used by other processes
    unit: str = "process"  # "run": measured in one process, the gate tests its runs
    fingerprint: dict[str, Any] = field(default_factory=dict)
    scenario: dict[str, Any] = field(default_factory=dict)
    backend: dict[str, Any] = field(default_factory=dict)
    git_commit: str | None = None
    created: str = ""

    def process_values(self, batch_size: int) -> dict[str, list[float]]:
        return {m: process_medians(per_process) for m, per_process in self.runs.get(batch_size, {}).items()}

    @property
    def batches(self) -> dict[int, dict[str, list[float]]]:
        return {bs: {m: [v for values in per_process for v in values] for m, per_process in metrics.items()}
                for bs, metrics in self.runs.items()}

    def to_json(self) -> dict[str, Any]:
        batches: dict[str, Any] = {}
        for bs, metrics in sorted(self.runs.items()):
            batches[str(bs)] = {
                "runs": {m: [[stored_value(v) for v in values] for values in per_process]
                         for m, per_process in sorted(metrics.items())},
                "processes": {m: [stored_value(v) for v in vals] for m, vals in sorted(self.process_values(bs).items())},
            }
            if bs in self.foreign_load:
                batches[str(bs)]["foreign_load"] = round(self.foreign_load[bs], 3)
        return {"batches": batches, "errors": {str(bs): msg for bs, msg in sorted(self.errors.items())},
                "unit": self.unit, "fingerprint": self.fingerprint, "scenario": self.scenario,
                "backend": self.backend, "git_commit": self.git_commit, "created": self.created}

    @classmethod
    def from_json(cls, key: str, data: Mapping[str, Any]) -> BaselineEntry:
        return cls(
            key=key,
            runs={int(bs): {m: [[float(v) for v in values] for values in per_process]
                            for m, per_process in batch["runs"].items()} for bs, batch in data["batches"].items()},
            errors={int(bs): str(msg) for bs, msg in data.get("errors", {}).items()},
            foreign_load={int(bs): float(batch["foreign_load"]) for bs, batch in data["batches"].items()
                          if batch.get("foreign_load") is not None},
            unit=str(data.get("unit", "process")),
            fingerprint=dict(data.get("fingerprint", {})),
            scenario=dict(data.get("scenario", {})),
            backend=dict(data.get("backend", {})),
            git_commit=data.get("git_commit"),
            created=str(data.get("created", "")),
        )


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


class BaselineStore:
    """Reads and writes the baseline files of one device. Files are read once and cached."""

    def __init__(self, root: Path, device: str) -> None:
        self.root = Path(root)
        self.device = device
        self._cache: dict[str, dict[str, BaselineEntry]] = {}

    @property
    def device_dir(self) -> Path:
        return self.root / self.device

    def path_for(self, module: str) -> Path:
        """`benchmarks/test_x.py` -> `<root>/<device>/benchmarks/test_x.json`."""
        relative = Path(module)
        return self.device_dir / relative.with_suffix(".json")

    def entries(self, module: str) -> dict[str, BaselineEntry]:
        if module not in self._cache:
            self._cache[module] = self._read(self.path_for(module))
        return self._cache[module]

    def get(self, module: str, key: str) -> BaselineEntry | None:
        return self.entries(module).get(key)

    def _read(self, path: Path) -> dict[str, BaselineEntry]:
        if not path.exists():
            return {}
        fix = f"Fix it from version control (git checkout -- {path}) or move it away and run with --llmperf-update"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise BaselineError(f"cannot read baseline file {path}: {exc}. {fix}") from None
        except json.JSONDecodeError as exc:
            raise BaselineError(f"baseline file {path} is not valid JSON ({exc}). {fix}; "
                                "the file was left as it is") from None
        if not isinstance(data, dict) or "schema_version" not in data:
            raise BaselineError(f"baseline file {path} has no schema_version: not a pytest-llmperf baseline. {fix}")
        if data["schema_version"] != SCHEMA_VERSION:
            raise BaselineError(
                f"baseline file {path} has schema_version {data['schema_version']!r}; this pytest-llmperf reads "
                f"{SCHEMA_VERSION}. Upgrade pytest-llmperf, or regenerate with --llmperf-update after moving the "
                "file away")
        if data.get("device") != self.device:
            raise BaselineError(
                f"baseline file {path} is for device {data.get('device')!r}, but it lies under the directory of "
                f"device {self.device!r}. Move it to {self.root / str(data.get('device'))}/ or regenerate it with "
                f"--llmperf-device={self.device} --llmperf-update")
        try:
            return {key: BaselineEntry.from_json(key, entry) for key, entry in data.get("benchmarks", {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BaselineError(f"baseline file {path} is malformed ({type(exc).__name__}: {exc}). {fix}") from None

    def write(self, module: str, entry: BaselineEntry) -> Path:
        """Add or replace one entry and write the module's file atomically, keeping the other entries."""
        path = self.path_for(module)
        entries = dict(self._read(path))  # re-read: never drop what another run wrote meanwhile
        entries[entry.key] = entry
        document = {
            "schema_version": SCHEMA_VERSION,
            "device": self.device,
            "module": module,
            "benchmarks": {key: e.to_json() for key, e in sorted(entries.items())},
        }
        text = json.dumps(document, indent=1, sort_keys=True) + "\n"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        except OSError as exc:
            raise BaselineError(f"cannot write baselines under {path.parent}: {exc}. Make the directory writable "
                                "or point --llmperf-baseline-dir elsewhere") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            os.unlink(tmp)
            raise BaselineError(f"cannot write baseline file {path}: {exc}; the previous file is unchanged") from None
        self._cache[module] = entries
        return path
