"""The rows file: a job's runs and results as JSON lines beside its reports (`<report dir>/history-rows.jsonl`), for
a runner without a database; `pytest-llmperf history import FILE...` merges such files into any store, once.

One line per run: `{"format": "pytest-llmperf history rows", "version": 1, "run": {...}, "results": [...]}`. Jobs
that share a report directory append under the file's lock. Importing is idempotent (the store skips a run it holds),
so the same artifact may be imported by every job on main.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..files import locked, write_text_atomic
from .records import Result, Run
from .store import Appended, Store

FORMAT = "pytest-llmperf history rows"
VERSION = 1
FILE_NAME = "history-rows.jsonl"


class RowsFileError(ValueError):
    """A rows file that cannot be read; the message names the file and line."""


def lines_of(runs: Sequence[Run], results: Sequence[Result]) -> list[str]:
    return [
        json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "run": run.to_json(),
                "results": [r.to_json() for r in results if r.run_id == run.run_id],
            },
            sort_keys=True,
        )
        for run in runs
    ]


def append(path: Path, runs: Sequence[Run], results: Sequence[Result]) -> Path:
    """Add the job's lines to the rows file (created if missing), atomically under its lock."""
    with locked(path):
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old and not old.endswith("\n"):
            old += "\n"
        write_text_atomic(path, old + "".join(line + "\n" for line in lines_of(runs, results)))
    return path


def read(path: Path) -> list[tuple[Run, list[Result]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RowsFileError(f"{path}: cannot read the rows file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise RowsFileError(f"{path}: not a rows file (not UTF-8 text; a rows file is history-rows.jsonl)") from None
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"not a line of a pytest-llmperf rows file (its format is not {FORMAT!r})")
            if int(data.get("version", 0)) > VERSION:
                raise ValueError(
                    f"rows of version {data.get('version')}, written by a newer pytest-llmperf (this one reads up "
                    f"to {VERSION}): upgrade pytest-llmperf"
                )
            run = Run.from_json(data["run"])
            results = [Result.from_json(r) for r in data.get("results") or []]
        except (ValueError, KeyError, TypeError) as exc:
            raise RowsFileError(f"{path}, line {number}: {exc}") from None
        if any(r.run_id != run.run_id for r in results):
            raise RowsFileError(f"{path}, line {number}: results of another run than {run.run_id}")
        found.append((run, results))
    return found


def read_files(paths: Iterable[Path]) -> list[tuple[Path, list[tuple[Run, list[Result]]]]]:
    """Every rows file read and checked, before a store is opened: a path that cannot be read creates nothing."""
    return [(path, read(path)) for path in paths]


def import_files(
    store: Store, parsed: Iterable[tuple[Path, list[tuple[Run, list[Result]]]]]
) -> list[tuple[Path, Appended]]:
    """Merge rows files read by `read_files` into the store, one transaction per file."""
    done = []
    for path, jobs in parsed:
        runs = [run for run, _ in jobs]
        results = [r for _, rows in jobs for r in rows]
        done.append((path, store.append(runs, results)))
    return done
