"""Converting baseline files of schema 2 to schema 3, without measuring anything: `pytest-llmperf
migrate-baselines DIR...` (cli.py).

Schema 2 kept every run of every worker process; schema 3 keeps what the gate tests (each process's median, or
the runs of a baseline measured in one process), the runs each process took and the digest of the generated
tokens. Each entry is read by the store's own parser (`BaselineEntry.from_json`, which reduces a schema-2 entry)
and written as the store writes it, under the store's lock, atomically. A file already in schema 3 is left as it
is; a file that cannot be converted (not a baseline, unreadable, schema 1 with one process's runs) is named with
its fix and left as it is, and the others are still converted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import locked, write_text_atomic
from .baseline_entry import BaselineEntry, check_raw_entry
from .baseline_layout import parse, render
from .baselines import SCHEMA_VERSION, BaselineError


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
