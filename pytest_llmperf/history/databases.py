"""Where a store lives: a SQLite file (the standard library; the default) or a PostgreSQL server (psycopg 3, the
`postgres` extra), behind one small interface, and a location's text (`--llmperf-history`) parsed into one.

Writes take the store's write lock for the whole transaction: SQLite's `BEGIN IMMEDIATE` (WAL mode, so readers go on
reading) with a busy timeout; PostgreSQL's transaction-scoped advisory lock. Two jobs that end at once queue on it
and both land. What goes wrong is a `StoreError` whose text names the store and the fix: locked past the timeout,
not a database, unreachable, or written by a newer pytest-llmperf.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

POSTGRES_HINT = "pip install 'pytest-llmperf[postgres]'"
LOCK_TIMEOUT_S = 60.0
ADVISORY_LOCK = 7_346_112_038  # any constant: the key of the store's write lock on PostgreSQL


class StoreError(Exception):
    """The store cannot be read or written; the message says which store, why, and what to do."""


@dataclass(frozen=True)
class Location:
    dialect: str  # "sqlite" or "postgresql"
    target: str  # the file's path, or the connection URL

    def describe(self) -> str:
        """The store's name for messages, without a password."""
        return self.target if self.dialect == "sqlite" else re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", self.target)


def parse_location(text: str, base: Path) -> Location | None:
    """`off` -> None; `postgresql://...` (or `postgres://`); `sqlite:///relative/path`, `sqlite:////absolute/path`
    (SQLAlchemy's URLs), `sqlite:path` or a path; relative paths from `base`."""
    text = text.strip()
    if text.lower() in ("", "off", "none"):
        return None
    if text.startswith(("postgresql://", "postgres://")):
        return Location("postgresql", text)
    if text.startswith("sqlite:"):  # SQLAlchemy's form: sqlite:///relative/path, sqlite:////absolute/path
        rest = text.removeprefix("sqlite:")
        text = rest[3:] if rest.startswith("///") else rest.removeprefix("//")
    if "://" in text:
        raise ValueError(f"{text!r}: a history store is a file path, sqlite:///PATH, postgresql://URL or off")
    return Location("sqlite", str((base / Path(text).expanduser()).resolve()))


STORE_FOLDER = ".llmperf"  # the default store's folder (settings.DEFAULT_STORE)


def _make_folder(folder: Path) -> None:
    """The store's folder, created with a .gitignore of `*` where the plugin creates it or it is the default
    `.llmperf/` (as pytest does for .pytest_cache): `git add -A` must not commit the store, whose every write would
    then make the tree dirty."""
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    ignore = folder / ".gitignore"
    if (created or folder.name == STORE_FOLDER) and not ignore.exists():
        with suppress(OSError):  # a read-only folder: the store reports its own error
            ignore.write_text("# written by pytest-llmperf: its history store is not part of the repository\n*\n")


class Connection:
    """One connection: `?` placeholders in, the driver's style out; errors as StoreError."""

    def __init__(self, location: Location, timeout: float = LOCK_TIMEOUT_S, *, read_only: bool = False) -> None:
        self.location = location
        self.timeout = timeout
        self.dialect = location.dialect
        self.read_only = read_only
        self._db: Any = self._sqlite() if self.dialect == "sqlite" else self._postgres()

    def _sqlite(self) -> sqlite3.Connection:
        path = Path(self.location.target)
        if self.read_only:
            return self._sqlite_reading(path)
        try:
            _make_folder(path.parent)
            db = sqlite3.connect(path, timeout=self.timeout, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
        except (OSError, sqlite3.Error) as exc:
            raise self.error(exc) from None
        return db

    def _sqlite_reading(self, path: Path) -> sqlite3.Connection:
        """Opened read-only, changing nothing; where the folder cannot hold the write-ahead log's shared memory (a
        read-only folder), opened as immutable: read as it is on disk."""
        uri = f"file:{quote(str(path))}"
        last: sqlite3.Error | None = None
        for mode in ("?mode=ro", "?mode=ro&immutable=1"):
            try:
                db = sqlite3.connect(uri + mode, uri=True, timeout=self.timeout, isolation_level=None)
                db.execute("SELECT count(*) FROM sqlite_master").fetchall()
                return db
            except sqlite3.Error as exc:
                last = exc
        raise self.error(last or sqlite3.Error("cannot open")) from None

    def _postgres(self) -> Any:
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                f"history store {self.location.describe()}: PostgreSQL needs psycopg 3 ({POSTGRES_HINT})"
            ) from None
        try:
            return psycopg.connect(self.location.target, autocommit=True, connect_timeout=int(self.timeout))
        except psycopg.Error as exc:
            raise self.error(exc) from None

    def error(self, exc: BaseException) -> StoreError:
        where = f"history store {self.location.describe()}"
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "locked" in text or "lock timeout" in text:
            return StoreError(
                f"{where} is locked by another job for more than {self.timeout:g} s ({text}); the job's rows "
                "are kept in its rows file: import them later with `pytest-llmperf history import FILE`"
            )
        if "not a database" in text or "malformed" in text:
            return StoreError(
                f"{where} is not a readable database ({text}): restore it from a copy, or move it away and "
                "import the rows files into a new store (`pytest-llmperf history import`)"
            )
        return StoreError(f"{where}: {text}")

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.dialect == "postgresql" else sql

    def execute(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        try:
            cursor = self._db.execute(self._sql(sql), params)
            return list(cursor.fetchall()) if cursor.description else []
        except Exception as exc:
            if isinstance(exc, StoreError):
                raise
            raise self.error(exc) from None

    def executemany(self, sql: str, rows: list[tuple]) -> None:
        if not rows:
            return
        try:
            if self.dialect == "sqlite":
                self._db.executemany(sql, rows)
            else:
                with self._db.cursor() as cursor:
                    cursor.executemany(self._sql(sql), rows)
        except Exception as exc:
            raise self.error(exc) from None

    @contextmanager
    def writing(self) -> Iterator[Connection]:
        """One transaction holding the store's write lock; rolled back on any error."""
        if self.dialect == "sqlite":
            self.execute("BEGIN IMMEDIATE")
        else:
            self.execute("BEGIN")
            self.execute(f"SET LOCAL lock_timeout = '{int(self.timeout * 1000)}ms'")
            self.execute("SELECT pg_advisory_xact_lock(?)", (ADVISORY_LOCK,))
        try:
            yield self
        except BaseException:
            with suppress(StoreError):  # the connection is gone: the transaction went with it
                self.execute("ROLLBACK")
            raise
        self.execute("COMMIT")

    def tables(self) -> set[str]:
        if self.dialect == "sqlite":
            rows = self.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        else:
            rows = self.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        return {r[0] for r in rows}

    def close(self) -> None:
        with suppress(Exception):  # closing a connection the server already dropped
            self._db.close()
