"""Baselines on disk (schema 2): per benchmark key and batch size, the per-run values of every metric,
one list per worker process, the per-process medians the gate tests, plus the environment fingerprint,
git commit and date. Where the files lie: judge/baseline_layout.py (one set per device, and per machine
on the cpu target).

Keys are sorted so diffs review well. Writes are atomic (pytest_llmperf/files.py) and hold a lock
around re-read and replace, so two updates of one module at once both land; an update keeps the
entries of tests that were not selected. A file that cannot be read, or holds values the gate cannot
compare, is never overwritten: the error names it, the entry, batch size and metric, and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..files import finite_or_null, locked, write_text_atomic
from .baseline_layout import module_file, other_sets, set_directory
from .baseline_values import check_entry, check_raw_entry
from ..measure.instructions import count_table
from ..measure.metrics import values_by_process
from ..measure.records import BenchmarkResult
from .outputs import Outputs, outputs_by_batch

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
    outputs: dict[int, Outputs] = field(default_factory=dict)  # batch size -> generated ids (judge/outputs.py)
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

    @classmethod
    def of_result(cls, result: BenchmarkResult, *, fingerprint: Mapping[str, Any] | None = None,
                  created: str = "") -> BaselineEntry:
        """What a measured benchmark stores as its baseline (and what an A/B comparison's A side is judged as)."""
        fingerprint = dict(fingerprint or {})
        return cls(
            key=result.key,
            runs={b.batch_size: {**values_by_process(b.samples), **count_table(b.counted)}  # counted: instructions
                  for b in result.batches if b.ok},
            errors={b.batch_size: f"{b.status}: {b.error}" for b in result.batches if not b.ok},
            foreign_load={b.batch_size: b.foreign_load for b in result.batches if b.foreign_load is not None},
            unit="process" if any(len(b.processes) > 1 for b in result.batches if b.ok) else "run",
            outputs=outputs_by_batch(result.batches),
            fingerprint=fingerprint,
            scenario=result.scenario,
            backend={k: v for k, v in result.backend.items() if k != "model_path"},
            git_commit=(fingerprint.get("git") or {}).get("commit"),
            created=created,
        )

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
            if bs in self.outputs:
                batches[str(bs)]["outputs"] = self.outputs[bs].to_json()
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
            outputs={int(bs): _outputs(key, bs, batch["outputs"]) for bs, batch in data["batches"].items()
                     if batch.get("outputs") is not None},
            fingerprint=dict(data.get("fingerprint", {})),
            scenario=dict(data.get("scenario", {})),
            backend=dict(data.get("backend", {})),
            git_commit=data.get("git_commit"),
            created=str(data.get("created", "")),
        )


def _outputs(key: str, batch_size: str, data: Any) -> Outputs:
    if not isinstance(data, Mapping):
        raise ValueError(f"entry {key!r}, batch size {batch_size}: 'outputs' is not an object")
    try:
        return Outputs.from_json(data)
    except ValueError as exc:
        raise ValueError(f"entry {key!r}, batch size {batch_size}: {exc}") from None


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class Lookup:
    """Everything the store knows of one benchmark's baseline: the entry, or why there is none."""

    path: Path
    entry: BaselineEntry | None
    error: str | None = None  # the file cannot be used: the error names it and the fix
    elsewhere: bool = False  # no entry here, but other machines of this target have a set for the module
    note: str = ""  # why this machine has none yet, when other machines (or the old layout) do


class BaselineStore:
    """Reads and writes the baseline files of one device (and machine). Files are read once and cached."""

    def __init__(self, root: Path, device: str, machine: str | None = None, *, rerun: str = "",
                 updating: bool = False) -> None:
        self.root = Path(root)
        self.device = device
        self.machine = machine
        self.updating = updating  # an update run: a schema-1 file reads as empty, and is rewritten as schema 2
        self.rerun = rerun or f"--llmperf-device={device}"  # the options a hint repeats
        self._cache: dict[str, dict[str, BaselineEntry]] = {}
        self.dropped: dict[str, tuple[str, set[str]]] = {}  # schema-1 file -> (module, keys not re-recorded yet)
        self.pruned: dict[str, list[str]] = {}  # file -> stale keys removed by this run

    @classmethod
    def at(cls, directory: Path | str) -> BaselineStore:
        """The store of one set given as its directory (`baselines/a100`, `baselines/cpu/<machine>`), for scripts:
        a set whose files name a machine lies one level below its device's directory."""
        directory = Path(directory)
        for path in sorted(directory.rglob("*.json")):
            try:
                machine = json.loads(path.read_text(encoding="utf-8")).get("machine")
            except (OSError, ValueError, AttributeError):
                continue
            if machine:
                return cls(directory.parent.parent, directory.parent.name, directory.name)
            break
        return cls(directory.parent, directory.name)

    @property
    def device_dir(self) -> Path:
        return self.root / self.device

    @property
    def directory(self) -> Path:
        """This machine's set: `<root>/<device>/<machine>`, or `<root>/<device>` without a machine."""
        return set_directory(self.root, self.device, self.machine)

    def path_for(self, module: str) -> Path:
        """`benchmarks/test_x.py` -> `<root>/<device>[/<machine>]/benchmarks/test_x.json`."""
        return self.directory / module_file(module)

    def update_command(self, module: str) -> str:
        return f"pytest {module} {self.rerun} --llmperf-update"

    def entries(self, module: str) -> dict[str, BaselineEntry]:
        if module not in self._cache:
            self._cache[module] = self._read(self.path_for(module), module)
        return self._cache[module]

    def get(self, module: str, key: str) -> BaselineEntry | None:
        return self.entries(module).get(key)

    def lookup(self, module: str, key: str) -> Lookup:
        """The baseline of one benchmark, or why there is none (one call: a judgement needs nothing else)."""
        path = self.path_for(module)
        try:
            entry = self.get(module, key)
        except BaselineError as exc:
            return Lookup(path, None, error=str(exc))
        if entry is not None:
            return Lookup(path, entry)
        return Lookup(path, None, elsewhere=self.recorded_elsewhere(module), note=self.missing_note(module))

    def recorded_elsewhere(self, module: str) -> bool:
        """Other machines of this target have a set for `module`: not missing, but for other hardware."""
        return bool(self.machine) and bool(other_sets(self.device_dir, self.machine, module))

    def missing_note(self, module: str) -> str:
        """Why this machine has no file for `module` yet, when other machines (or the old layout) do."""
        if not self.machine:
            return ""
        notes = []
        others = other_sets(self.device_dir, self.machine, module)
        if others:
            notes.append(f"this machine ({self.machine}) has no baselines for it yet; the sets of "
                         f"{', '.join(others)} under {self.device_dir} are compared only on their own machines")
        legacy = self.device_dir / module_file(module)
        if legacy.is_file():
            notes.append(f"{legacy} is in the layout from before per-machine baselines and is not read")
        if not notes:
            return ""
        return ("; ".join(notes) + f". Recording this machine's set writes {self.path_for(module)} and leaves the "
                "other files alone.")

    def _load(self, path: Path) -> dict[str, Any] | None:
        """The file's JSON document (None when it does not exist), checked up to its schema version."""
        if not path.exists():
            return None
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
        if data["schema_version"] not in (1, SCHEMA_VERSION):
            raise BaselineError(
                f"baseline file {path} has schema_version {data['schema_version']!r}; this pytest-llmperf reads "
                f"{SCHEMA_VERSION}. Upgrade pytest-llmperf, or move the file away and re-record it with "
                "--llmperf-update")
        if data.get("device") != self.device:
            raise BaselineError(
                f"baseline file {path} is for device {data.get('device')!r}, but it lies under the directory of "
                f"device {self.device!r}. Move it to {self.root / str(data.get('device'))}/ (git mv), or move it "
                f"away and record this device's own with {self.rerun} --llmperf-update (an update never "
                "overwrites a file it cannot use)")
        return data

    def _entries_of(self, path: Path, data: Mapping[str, Any]) -> dict[str, BaselineEntry]:
        fix = f"Fix it from version control (git checkout -- {path}) or move it away and run with --llmperf-update"
        benchmarks = data.get("benchmarks", {})
        if not isinstance(benchmarks, Mapping):
            raise BaselineError(f"baseline file {path} is malformed ('benchmarks' is not an object). {fix}")
        try:
            for key, entry in benchmarks.items():
                check_raw_entry(key, entry)
            return {key: BaselineEntry.from_json(key, entry) for key, entry in benchmarks.items()}
        except ValueError as exc:
            raise BaselineError(f"baseline file {path}: {exc}. {fix}") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise BaselineError(f"baseline file {path} is malformed ({type(exc).__name__}: {exc}). {fix}") from None

    def _read(self, path: Path, module: str) -> dict[str, BaselineEntry]:
        data = self._load(path)
        if data is None:
            return {}
        if data["schema_version"] == 1 and self.updating:
            return {}
        if data["schema_version"] == 1:
            raise BaselineError(
                f"baseline file {path} holds per-run values of one process (schema 1); this pytest-llmperf gates "
                f"per-process values (schema 2) and cannot convert them. Re-record it on this machine: "
                f"{self.update_command(module)}")
        return self._entries_of(path, data)

    def _read_for_update(self, path: Path, module: str) -> dict[str, BaselineEntry]:
        """The entries to keep: a schema-1 file's cannot be kept; they are dropped, and named at the end."""
        data = self._load(path)
        if data is None:
            return {}
        if data["schema_version"] == 1:
            old = data.get("benchmarks")
            self.dropped.setdefault(str(path), (module, set(old) if isinstance(old, Mapping) else set()))
            return {}
        return self._entries_of(path, data)

    def write(self, module: str, entry: BaselineEntry) -> Path:
        """Add or replace one entry and write the module's file atomically, keeping the other entries."""
        path = self.path_for(module)
        try:
            check_entry(entry)
        except ValueError as exc:
            raise BaselineError(f"not written to {path}: {exc}; a measurement the gate cannot compare is never "
                                "stored (the backend returned an impossible value). The file is unchanged") from None

        def change(entries: dict[str, BaselineEntry]) -> None:
            entries[entry.key] = entry
            if str(path) in self.dropped:
                self.dropped[str(path)][1].discard(entry.key)
        return self._rewrite(module, change)

    def prune(self, module: str, keys: list[str]) -> list[str]:
        """Remove the entries `keys` (of tests that no longer exist) from the module's file; the keys removed."""
        path = self.path_for(module)
        removed: list[str] = []

        def change(entries: dict[str, BaselineEntry]) -> None:
            removed.extend(k for k in keys if entries.pop(k, None) is not None)
        if path.exists():
            self._rewrite(module, change)
        if removed:
            self.pruned[str(path)] = sorted(removed)
        return removed

    def _rewrite(self, module: str, change: Any) -> Path:
        path = self.path_for(module)
        try:
            with locked(path):
                entries = dict(self._read_for_update(path, module))  # re-read under the lock: keep what others wrote
                change(entries)
                document = {"schema_version": SCHEMA_VERSION, "device": self.device, "machine": self.machine,
                            "module": module, "benchmarks": {key: e.to_json() for key, e in sorted(entries.items())}}
                # metadata such as the scenario's max_load=inf is null in strict JSON; values were checked above
                text = json.dumps(finite_or_null(document), indent=1, sort_keys=True, allow_nan=False)
                write_text_atomic(path, text + "\n")
        except OSError as exc:
            raise BaselineError(f"cannot write baseline file {path}: {exc}; the previous file is unchanged. Make "
                                "the directory writable or point --llmperf-baseline-dir elsewhere") from None
        self._cache[module] = entries
        return path

    def dropped_entries(self) -> list[tuple[str, str, list[str]]]:
        """(file, module, keys): schema-1 entries an update dropped because their tests were not re-recorded."""
        return [(path, module, sorted(keys)) for path, (module, keys) in sorted(self.dropped.items()) if keys]
