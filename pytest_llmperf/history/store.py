"""The history store: its schema, open (creating or migrating it), append a job's runs and results in one transaction,
read what a series needs, keep people's marks and exclusions.

Appending is idempotent: a run already in the store (its `run_id`) is left as it is, so importing a rows file twice,
or a job's rows file after the job itself wrote to the store, adds nothing the second time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .databases import Connection, Location, StoreError
from .records import Mark, Result, Run

CHECKPOINT = "checkpoint:"  # llmperf_meta's keys of the series' checkpoints (history/alarms.py)

# The store's tables, one schema for SQLite and PostgreSQL, with its version and the migrations between versions.
#
# Version 1 held the runs and their results; version 2 added what people say: marks on changes and excluded runs.
# A store is migrated forward when opened (in one transaction, under the store's write lock); a store whose version is
# newer than this plugin's is refused, never written, with the line to upgrade. Column types are written once, as
# SQLite's and PostgreSQL's common names where they have them; `REAL` becomes `DOUBLE PRECISION` on PostgreSQL.
SCHEMA_VERSION = 2

META = "CREATE TABLE IF NOT EXISTS llmperf_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"

#: The statements that bring a store from version `v - 1` to `v`, by `v`.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE IF NOT EXISTS llmperf_run (
            run_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, started_at TEXT NOT NULL, commit_sha TEXT NOT NULL,
            commit_time TEXT, commit_order INTEGER, branch TEXT, on_default_branch INTEGER NOT NULL,
            dirty INTEGER NOT NULL, source TEXT NOT NULL, target TEXT NOT NULL, machine TEXT NOT NULL,
            machine_fp TEXT NOT NULL, env_fp TEXT NOT NULL, env TEXT NOT NULL, plugin_version TEXT NOT NULL,
            ci_url TEXT)""",
        """CREATE TABLE IF NOT EXISTS llmperf_result (
            run_id TEXT NOT NULL REFERENCES llmperf_run (run_id), test TEXT NOT NULL, metric TEXT NOT NULL,
            batch_size INTEGER NOT NULL, series_key TEXT NOT NULL, unit TEXT NOT NULL, direction INTEGER NOT NULL,
            value REAL NOT NULL, process_medians TEXT NOT NULL, PRIMARY KEY (run_id, test, metric, batch_size))""",
        "CREATE INDEX IF NOT EXISTS llmperf_result_series ON llmperf_result (series_key)",
    ),
    2: (
        "ALTER TABLE llmperf_run ADD COLUMN excluded INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE llmperf_run ADD COLUMN exclude_reason TEXT",
        """CREATE TABLE IF NOT EXISTS llmperf_mark (
            series_key TEXT NOT NULL, commit_sha TEXT NOT NULL, state TEXT NOT NULL, note TEXT NOT NULL,
            marked_at TEXT NOT NULL, PRIMARY KEY (series_key, commit_sha))""",
    ),
}

RUN_COLUMNS = (
    "run_id", "job_id", "started_at", "commit_sha", "commit_time", "commit_order", "branch", "on_default_branch",
    "dirty", "source", "target", "machine", "machine_fp", "env_fp", "env", "plugin_version", "ci_url", "excluded",
    "exclude_reason",
)  # fmt: skip
RESULT_COLUMNS = (
    "run_id", "test", "metric", "batch_size", "series_key", "unit", "direction", "value", "process_medians",
)  # fmt: skip


def statements(version: int, dialect: str) -> tuple[str, ...]:
    """Migration `version`'s statements in a dialect ("sqlite" or "postgresql")."""
    found = MIGRATIONS[version]
    if dialect == "postgresql":
        found = tuple(s.replace(" REAL ", " DOUBLE PRECISION ") for s in found)
    return found


@dataclass(frozen=True)
class Appended:
    runs: int  # runs written now
    results: int
    already: int  # runs the store already held (left as they were)


class Store:
    def __init__(self, location: Location, *, timeout: float | None = None, read_only: bool = False) -> None:
        """`read_only`: for reading only (a store on a read-only disk, or one this user may not write): nothing is
        created or migrated; an older store is read after `pytest-llmperf history migrate` only."""
        self.location = location
        self.db = Connection(location, read_only=read_only, **({} if timeout is None else {"timeout": timeout}))
        try:
            if read_only:
                self._check_readable()
            else:
                self._migrate()
        except BaseException:
            self.db.close()
            raise

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    # -- schema -----------------------------------------------------------------------------------------------
    def version(self) -> int:
        if "llmperf_meta" not in self.db.tables():
            if self.db.tables() & {"llmperf_run", "llmperf_result"}:
                raise StoreError(f"history store {self.location.describe()} has llmperf tables but no version")
            return 0
        rows = self.db.execute("SELECT value FROM llmperf_meta WHERE key = 'schema_version'")
        return int(rows[0][0]) if rows else 0

    def _check_readable(self) -> None:
        found = self.version()
        self._refuse_newer(found)
        if found < SCHEMA_VERSION:
            raise StoreError(
                f"history store {self.location.describe()} has schema version {found}: bring it to version "
                f"{SCHEMA_VERSION} with `pytest-llmperf history migrate` (which writes it) before reading it"
            )

    def _migrate(self) -> None:
        found = self.version()
        self._refuse_newer(found)
        if found == SCHEMA_VERSION:
            return
        with self.db.writing():
            found = self.version()  # another job may have migrated it meanwhile
            self._refuse_newer(found)
            self.db.execute(META)
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for statement in statements(version, self.db.dialect):
                    self.db.execute(statement)
            self._set_version(SCHEMA_VERSION)

    def migrate_to(self, version: int) -> None:
        """Bring an empty or older store to `version` (tests build older stores with it)."""
        with self.db.writing():
            self.db.execute(META)
            for v in range(self.version() + 1, version + 1):
                for statement in statements(v, self.db.dialect):
                    self.db.execute(statement)
            self._set_version(version)

    def _set_version(self, version: int) -> None:
        self.db.execute("DELETE FROM llmperf_meta WHERE key = 'schema_version'")
        self.db.execute("INSERT INTO llmperf_meta (key, value) VALUES ('schema_version', ?)", (str(version),))

    def _refuse_newer(self, found: int) -> None:
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"history store {self.location.describe()} has schema version {found}, written by a newer "
                f"pytest-llmperf (this one reads up to {SCHEMA_VERSION}): upgrade pytest-llmperf; the store is "
                "left as it is"
            )

    # -- writing ----------------------------------------------------------------------------------------------
    def append(self, runs: Sequence[Run], results: Sequence[Result]) -> Appended:
        """Write a job's runs and their results in one transaction; runs already stored are skipped whole, and runs
        already stored with other values (a second rows file reusing run ids) refuse the whole append, naming them."""
        with self.db.writing():
            known = self._known({r.run_id for r in runs})
            self._refuse_conflicts([r for r in runs if r.run_id in known], results)
            new = [r for r in runs if r.run_id not in known]
            fresh = {r.run_id for r in new}
            rows = [r for r in results if r.run_id in fresh]
            self.db.executemany(_insert("llmperf_run", RUN_COLUMNS), [_run_row(r) for r in new])
            self.db.executemany(_insert("llmperf_result", RESULT_COLUMNS), [_result_row(r) for r in rows])
        return Appended(len(new), len(rows), len(runs) - len(new))

    def _refuse_conflicts(self, runs: Sequence[Run], results: Sequence[Result]) -> None:
        """Refuse rows of runs the store holds where their results differ from those it holds (their commit may
        differ: `pytest-llmperf history replace` moves stored runs onto the commit that replaced theirs)."""
        if not runs:
            return
        ids = sorted({r.run_id for r in runs})
        marks = ",".join("?" * len(ids))
        held_results = self.db.execute(
            f"SELECT {', '.join(RESULT_COLUMNS)} FROM llmperf_result WHERE run_id IN ({marks})", ids
        )

        def measured(rows: Iterable[Result]) -> dict[tuple, str]:  # repr: NaN equals NaN
            return {(r.run_id, r.test, r.metric, r.batch_size): repr((r.value, r.process_medians)) for r in rows}

        held = measured(_results_of(held_results))
        wanted = set(ids)
        coming = measured(r for r in results if r.run_id in wanted)
        differ = {key[0] for key in held.keys() | coming.keys() if held.get(key) != coming.get(key)}
        if differ:
            shown = ", ".join(sorted(differ)[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
            raise StoreError(
                f"history store {self.location.describe()} already holds run(s) {shown} with other values: nothing "
                "of these rows was written (two jobs' rows files with the same run ids? import the right one, or "
                "set the stored runs aside with `pytest-llmperf history exclude`)"
            )

    def _known(self, run_ids: set[str]) -> set[str]:
        if not run_ids:
            return set()
        marks = ",".join("?" * len(run_ids))
        return {
            r[0] for r in self.db.execute(f"SELECT run_id FROM llmperf_run WHERE run_id IN ({marks})", sorted(run_ids))
        }

    def exclude(self, run_id: str, reason: str, *, undo: bool = False) -> int:
        """Set a run aside from every series (or take it back); the number of runs changed (0: no such run)."""
        with self.db.writing():
            found = self.db.execute("SELECT run_id FROM llmperf_run WHERE run_id = ? OR job_id = ?", (run_id, run_id))
            self.db.execute(
                "UPDATE llmperf_run SET excluded = ?, exclude_reason = ? WHERE run_id = ? OR job_id = ?",
                (0 if undo else 1, None if undo else reason, run_id, run_id),
            )
        return len(found)

    def replace_commit(self, old: str, new: str) -> int:
        """Move the runs (and marks) of commit `old` onto `new`, the commit that replaced it on the default branch;
        their recorded place on it is dropped (git's line gives it). The number of runs moved."""
        with self.db.writing():
            found = self.db.execute("SELECT run_id FROM llmperf_run WHERE commit_sha = ?", (old,))
            self.db.execute(
                "UPDATE llmperf_run SET commit_sha = ?, commit_order = NULL, on_default_branch = 1 "
                "WHERE commit_sha = ?",
                (new, old),
            )
            self.db.execute("UPDATE llmperf_mark SET commit_sha = ? WHERE commit_sha = ?", (new, old))
        return len(found)

    def mark(self, mark: Mark) -> None:
        with self.db.writing():
            self.db.execute(
                "DELETE FROM llmperf_mark WHERE series_key = ? AND commit_sha = ?", (mark.series_key, mark.commit_sha)
            )
            self.db.execute(
                "INSERT INTO llmperf_mark (series_key, commit_sha, state, note, marked_at) VALUES (?, ?, ?, ?, ?)",
                (mark.series_key, mark.commit_sha, mark.state, mark.note, mark.marked_at),
            )

    def unmark(self, series_key: str, commit_sha: str) -> int:
        with self.db.writing():
            found = self.db.execute(
                "SELECT 1 FROM llmperf_mark WHERE series_key = ? AND commit_sha = ?", (series_key, commit_sha)
            )
            self.db.execute(
                "DELETE FROM llmperf_mark WHERE series_key = ? AND commit_sha = ?", (series_key, commit_sha)
            )
        return len(found)

    # -- reading ----------------------------------------------------------------------------------------------
    def runs(self) -> list[Run]:
        rows = self.db.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM llmperf_run ORDER BY started_at, run_id")
        return [_run_of(r) for r in rows]

    def results(self, series_keys: Iterable[str] | None = None) -> list[Result]:
        sql = f"SELECT {', '.join(RESULT_COLUMNS)} FROM llmperf_result"
        keys = sorted(set(series_keys)) if series_keys is not None else None
        if keys is not None:
            if not keys:
                return []
            sql += f" WHERE series_key IN ({','.join('?' * len(keys))})"
        rows = self.db.execute(sql + " ORDER BY run_id, test, metric, batch_size", keys or ())
        return _results_of(rows)

    def checkpoints(self, series_keys: Iterable[str]) -> dict[str, str]:
        """The kept checkpoints of these series' reads (history/alarms.py), by series key."""
        keys = sorted({CHECKPOINT + k for k in series_keys})
        if not keys:
            return {}
        rows = self.db.execute(f"SELECT key, value FROM llmperf_meta WHERE key IN ({','.join('?' * len(keys))})", keys)
        return {key.removeprefix(CHECKPOINT): value for key, value in rows}

    def keep_checkpoints(self, texts: Mapping[str, str]) -> None:
        """Replace the series' checkpoints, all in one transaction."""
        if not texts:
            return
        with self.db.writing():
            self.db.executemany(
                "INSERT INTO llmperf_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = "
                "excluded.value",
                [(CHECKPOINT + k, v) for k, v in sorted(texts.items())],
            )

    def marks(self) -> list[Mark]:
        rows = self.db.execute("SELECT series_key, commit_sha, state, note, marked_at FROM llmperf_mark")
        return [Mark(*r) for r in rows]


def _insert(table: str, columns: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) ON CONFLICT DO NOTHING"


def _run_row(run: Run) -> tuple:
    data = run.to_json()
    data["env"] = json.dumps(run.env, sort_keys=True)
    for name in ("on_default_branch", "dirty", "excluded"):
        data[name] = int(bool(data[name]))
    return tuple(data[c] for c in RUN_COLUMNS)


def _run_of(row: Sequence) -> Run:
    data = dict(zip(RUN_COLUMNS, row))
    data["env"] = json.loads(data["env"] or "{}")
    for name in ("on_default_branch", "dirty", "excluded"):
        data[name] = bool(data[name])
    return Run(**data)


def _result_row(result: Result) -> tuple:
    data = result.to_json()
    data["process_medians"] = json.dumps(data["process_medians"])
    return tuple(data[c] for c in RESULT_COLUMNS)


def _results_of(rows: Sequence[Sequence]) -> list[Result]:
    """Stored results (checked when they were written: Result.from_json checks what a rows file brings). Their
    process medians are parsed in one call: a job's end reads every result of its series' history."""
    medians = json.loads(f"[{','.join(row[-1] for row in rows)}]")
    return [Result(*row[:-1], tuple(m)) for row, m in zip(rows, medians)]  # type: ignore[call-arg]  # RESULT_COLUMNS' order
