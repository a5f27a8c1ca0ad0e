"""Baselines on disk (schema 3): the store that reads and writes one device's (and machine's) files, and the
conversion of files of schema 2 to schema 3. What an entry holds and the one parser of it:
judge/baseline_entry.py (what the gate tests, one value per worker process or the runs of one process, the runs
each process took, the outputs' digest, the fingerprint; the raw runs go to the report). Where the files lie, and
their text, one line per metric and batch size, so a reviewer reads the diff: judge/baseline_layout.py.

Writes are atomic (pytest_llmperf/files.py) and hold a lock around re-read and replace, so two updates of one
module at once both land; an update keeps the entries of tests that were not selected. A file that cannot be
read, or holds values the gate cannot compare, is never overwritten: the error names it, the entry, batch size
and metric, and the fix. A file of schema 2 (every run of every process) is never rewritten in passing, by a
gate or an update: the error names the command that converts it without measuring (`pytest-llmperf
migrate-baselines DIR...`, cli.py; `migrate` below).

Migration: schema 2 kept every run of every worker process; schema 3 keeps what the gate tests (each process's
median, or the runs of a baseline measured in one process), the runs each process took and the digest of the
generated tokens. Each entry is read by the store's own parser (`BaselineEntry.from_json`, which reduces a
schema-2 entry) and written as the store writes it, under the store's lock, atomically. A file already in schema
3 is left as it is; a file that cannot be converted (not a baseline, unreadable, schema 1 with one process's
runs) is named with its fix and left as it is, and the others are still converted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..files import WriteRefused, locked, write_text_atomic
from .baseline_entry import BaselineEntry, check_entry, check_raw_entry, process_medians, stored_value
from .baseline_layout import DuplicateKey, module_file, other_sets, parse, render, set_directory

__all__ = [
    "SCHEMA_VERSION",
    "BaselineEntry",
    "BaselineError",
    "BaselineStore",
    "Lookup",
    "process_medians",
    "stored_value",
]

SCHEMA_VERSION = 3
#: The command that converts files of an older schema, named wherever one is met.
MIGRATE_COMMAND = "pytest-llmperf migrate-baselines"
#: What this version writes at the top of a file; anything else there is kept as it is (an update never drops a
#: field it does not know: a person's notes, or what a newer version added). Entries keep theirs likewise.
FILE_FIELDS = ("schema_version", "device", "machine", "module", "benchmarks")


class BaselineError(Exception):
    """A baseline file or directory that cannot be used; the message names it and the fix."""


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

    def __init__(
        self, root: Path, device: str, machine: str | None = None, *, rerun: str = "", updating: bool = False
    ) -> None:
        self.root = Path(root)
        self.device = device
        self.machine = machine
        self.updating = updating  # an update run: a schema-1 file reads as empty, and is rewritten as schema 3
        self.rerun = rerun or f"--llmperf-device={device}"  # the options a hint repeats
        self._cache: dict[str, dict[str, BaselineEntry]] = {}
        self.dropped: dict[str, tuple[str, set[str]]] = {}  # schema-1 file -> (module, keys not re-recorded yet)
        self.pruned: dict[str, list[str]] = {}  # file -> stale keys removed by this run
        self.cleared: list[Path] = []  # temporary files a killed writer had left, removed by this run

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
        return bool(self.machine and other_sets(self.device_dir, self.machine, module))

    def missing_note(self, module: str) -> str:
        """Why this machine has no file for `module` yet, when other machines (or the old layout) do."""
        if not self.machine:
            return ""
        notes = []
        others = other_sets(self.device_dir, self.machine, module)
        if others:
            notes.append(
                f"this machine ({self.machine}) has no baselines for it yet; the sets of "
                f"{', '.join(others)} under {self.device_dir} are compared only on their own machines"
            )
        legacy = self.device_dir / module_file(module)
        if legacy.is_file():
            notes.append(f"{legacy} is in the layout from before per-machine baselines and is not read")
        if not notes:
            return ""
        return (
            "; ".join(notes) + f". Recording this machine's set writes {self.path_for(module)} and leaves the "
            "other files alone."
        )

    def _load(self, path: Path) -> dict[str, Any] | None:
        """The file's JSON document (None when it does not exist), checked up to its schema version."""
        if path.is_symlink() and not path.exists():
            raise BaselineError(
                f"baseline file {path} is a symbolic link to {os.readlink(path)}, which does not "
                "exist. Fix the link, or remove it and record the baselines with --llmperf-update "
                "(an update never writes through a link to nothing)"
            )
        if not path.exists():
            return None
        fix = f"Fix it from version control (git checkout -- {path}) or move it away and run with --llmperf-update"
        try:
            data = parse(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise BaselineError(f"cannot read baseline file {path}: {exc}. {fix}") from None
        except DuplicateKey as exc:
            raise BaselineError(
                f"baseline file {path}: {exc}. Remove all but one copy by hand, or move the file away and re-record "
                "it with --llmperf-update; the file was left as it is"
            ) from None
        except json.JSONDecodeError as exc:
            raise BaselineError(
                f"baseline file {path} is not valid JSON ({exc}). {fix}; the file was left as it is"
            ) from None
        if not isinstance(data, dict) or "schema_version" not in data:
            raise BaselineError(f"baseline file {path} has no schema_version: not a pytest-llmperf baseline. {fix}")
        if data["schema_version"] not in (1, 2, SCHEMA_VERSION):
            raise BaselineError(
                f"baseline file {path} has schema_version {data['schema_version']!r}; this pytest-llmperf reads "
                f"{SCHEMA_VERSION}. Upgrade pytest-llmperf, or move the file away and re-record it with "
                "--llmperf-update"
            )
        if data.get("device") != self.device:
            raise BaselineError(
                f"baseline file {path} is for device {data.get('device')!r}, but it lies under the directory of "
                f"device {self.device!r}. Move it to {self.root / str(data.get('device'))}/ (git mv), or move it "
                f"away and record this device's own with {self.rerun} --llmperf-update (an update never "
                "overwrites a file it cannot use)"
            )
        return data

    def _entries_of(self, path: Path, data: Mapping[str, Any]) -> dict[str, BaselineEntry]:
        fix = f"Fix it from version control (git checkout -- {path}) or move it away and run with --llmperf-update"
        if "benchmarks" not in data:  # every file this version writes has it, empty or not: not "no baselines"
            raise BaselineError(f"baseline file {path} is malformed (it has no 'benchmarks'). {fix}")
        benchmarks = data["benchmarks"]
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
        self._refuse_old(path, data)
        if data["schema_version"] == 1 and self.updating:
            return {}
        if data["schema_version"] == 1:
            raise BaselineError(
                f"baseline file {path} holds per-run values of one process (schema 1); this pytest-llmperf gates "
                f"per-process values (schema {SCHEMA_VERSION}) and cannot convert them. Re-record it on this machine: "
                f"{self.update_command(module)}"
            )
        return self._entries_of(path, data)

    def _refuse_old(self, path: Path, data: Mapping[str, Any]) -> None:
        """A schema-2 file is converted by its own command, never rewritten in passing by a gate or an update."""
        if data["schema_version"] == 2:
            raise BaselineError(
                f"baseline file {path} is in the format of schema 2 (every run of every process); this pytest-llmperf "
                f"reads schema {SCHEMA_VERSION} (what the gate tests, one line per metric and batch size). Convert "
                f"the set once, without measuring, and commit the result: {MIGRATE_COMMAND} {path.parent}"
            )

    def _read_for_update(self, path: Path, module: str, data: Mapping[str, Any] | None) -> dict[str, BaselineEntry]:
        """The entries of the file's document `data` to keep: a schema-1 file's cannot be kept; they are dropped,
        and named at the end."""
        if data is None:
            return {}
        self._refuse_old(path, data)
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
            raise BaselineError(
                f"not written to {path}: {exc}; a baseline the gate cannot compare with is never "
                "stored. The file is unchanged"
            ) from None

        def change(entries: dict[str, BaselineEntry]) -> None:
            entries[entry.key] = entry.keeping_extras_of(entries.get(entry.key))
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
            with locked(path) as left:
                self.cleared += left
                data = self._load(path)  # re-read under the lock: keep what others wrote
                entries = dict(self._read_for_update(path, module, data))
                change(entries)
                # top-level fields this version does not write are kept (a person's notes, a newer version's)
                unknown = {k: v for k, v in (data or {}).items() if k not in FILE_FIELDS}
                document = {
                    **unknown,
                    "schema_version": SCHEMA_VERSION,
                    "device": self.device,
                    "machine": self.machine,
                    "module": module,
                    "benchmarks": {key: e.to_json() for key, e in sorted(entries.items())},
                }
                # metadata such as the scenario's max_load=inf is null in strict JSON; values were checked above
                write_text_atomic(path, render(document))
        except WriteRefused as exc:
            raise BaselineError(f"baseline file not written: {exc}; the previous file is unchanged") from None
        except OSError as exc:
            raise BaselineError(
                f"cannot write baseline file {path}: {exc}; the previous file is unchanged. Make "
                "the directory writable or point --llmperf-baseline-dir elsewhere"
            ) from None
        self._cache[module] = entries
        return path

    def dropped_entries(self) -> list[tuple[str, str, list[str]]]:
        """(file, module, keys): schema-1 entries an update dropped because their tests were not re-recorded."""
        return [(path, module, sorted(keys)) for path, (module, keys) in sorted(self.dropped.items()) if keys]


@dataclass(frozen=True)
class Migrated:
    """What became of one file."""

    path: Path
    converted: bool  # False: already in the current schema, left as it is
    entries: int
    lines_before: int
    lines_after: int


def baseline_files(paths: Iterable[Path]) -> list[Path]:
    """The JSON files under each directory given (recursively), and each file given, in order."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.json") if p.is_file())
        elif path.is_file():
            found.append(path)
        else:
            raise BaselineError(
                f"{path}: no such file or directory; give a baseline set's directory, e.g. baselines/cpu"
            )
    return found


def _converted_document(path: Path, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or "schema_version" not in data or not isinstance(data.get("benchmarks"), Mapping):
        raise BaselineError(f"{path} is not a pytest-llmperf baseline (no schema_version or benchmarks); left as it is")
    version = data["schema_version"]
    if version == 1:
        module = data.get("module") or "<its test module>"
        raise BaselineError(
            f"{path} holds per-run values of one process (schema 1), which the gate cannot use as "
            f"per-process values; left as it is. Re-record it on its machine: pytest {module} "
            f"--llmperf-device={data.get('device', '<device>')} --llmperf-update"
        )
    if version != 2:
        raise BaselineError(
            f"{path} has schema_version {version!r}, which this pytest-llmperf does not convert "
            f"(it reads {SCHEMA_VERSION}); left as it is"
        )
    entries = {}
    for key, entry in data["benchmarks"].items():
        try:
            check_raw_entry(key, entry)
            entries[key] = BaselineEntry.from_json(key, entry)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BaselineError(
                f"{path}: {exc}; left as it is. Fix it from version control or re-record it with --llmperf-update"
            ) from None
    return {
        **{k: v for k, v in data.items() if k != "benchmarks"},
        "schema_version": SCHEMA_VERSION,
        "benchmarks": {key: entry.to_json() for key, entry in sorted(entries.items())},
    }


def migrate_file(path: Path) -> Migrated:
    """Convert one file in place (a schema-3 file is left as it is); BaselineError names a file that cannot be."""
    with locked(path):
        try:
            text = path.read_text(encoding="utf-8")
            data = parse(text)
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: not JSON, or a key given twice
            raise BaselineError(f"cannot read {path} ({exc}); left as it is") from None
        lines = text.count("\n")
        if isinstance(data, dict) and data.get("schema_version") == SCHEMA_VERSION:
            return Migrated(path, False, len(data.get("benchmarks") or {}), lines, lines)
        document = _converted_document(path, data)
        new = render(document)
        try:
            write_text_atomic(path, new)
        except OSError as exc:
            raise BaselineError(f"cannot write {path} ({exc}); left as it is") from None
    return Migrated(path, True, len(document["benchmarks"]), lines, new.count("\n"))


def migrate(paths: Iterable[Path]) -> tuple[list[Migrated], list[str]]:
    """Convert every baseline file under `paths`: (what became of each, the errors of those left as they were)."""
    done: list[Migrated] = []
    errors: list[str] = []
    try:
        files = baseline_files(paths)
    except BaselineError as exc:
        return [], [str(exc)]
    for path in files:
        try:
            done.append(migrate_file(path))
        except BaselineError as exc:
            errors.append(str(exc))
    return done, errors
