"""The history store against SQLite and a real PostgreSQL server (tests/postgres_server.py): one transaction per job,
idempotent appends and imports, marks and exclusions, migrations, two writers at once, and clear errors for a store
that is locked, corrupt or newer than the plugin."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmperf.history import rows as rows_jsonl
from pytest_llmperf.history.databases import Location, StoreError, parse_location
from pytest_llmperf.history.records import Mark
from pytest_llmperf.history.store import SCHEMA_VERSION, Store
from tests.history_rows import history_rows, results, run
from tests.postgres_server import fresh_database, postgres_server


@pytest.fixture(scope="module")
def postgres():
    with postgres_server() as url:
        yield url


# The PostgreSQL side starts a server: slow (tests/conftest.py cannot see a fixture asked for by name).
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def location(request, tmp_path):
    if request.param == "sqlite":
        return Location("sqlite", str(tmp_path / "history.sqlite"))
    url = request.getfixturevalue("postgres")
    return Location("postgresql", fresh_database(url, f"t_{abs(hash(request.node.nodeid)) % 10**9}"))


def test_a_job_appended_reads_back_the_same_and_twice_adds_nothing(location):
    runs, rows = history_rows([100.0, 101.0, 99.5])
    with Store(location) as store:
        first = store.append(runs, rows)
        again = store.append(runs, rows)
        assert (first.runs, first.results, first.already) == (3, 3, 0)
        assert (again.runs, again.results, again.already) == (0, 0, 3)
        assert store.runs() == runs
        assert sorted(store.results(), key=lambda r: r.run_id) == sorted(rows, key=lambda r: r.run_id)
        assert store.results([rows[0].series_key]) and store.results(["other"]) == []


def test_a_job_is_one_transaction(location):
    """A job whose rows fail to insert leaves nothing of itself behind: here a result of a run that is not there
    (the foreign key refuses it) after its job's run was inserted."""
    good = run(1)
    with Store(location) as store:
        with pytest.raises(StoreError), store.db.writing():
            store.db.execute(
                "INSERT INTO llmperf_run (run_id, job_id, started_at, commit_sha, on_default_branch, dirty, source, "
                "target, machine, machine_fp, env_fp, env, plugin_version) VALUES ('x:stored', 'x', 't', 's', 1, 0, "
                "'stored', 'cpu', 'm', 'h', 'e', '{}', '')"
            )
            store.db.execute(
                "INSERT INTO llmperf_result (run_id, test, metric, batch_size, series_key, unit, direction, value, "
                "process_medians) VALUES ('no-such-run', 't', 'm', 1, 'k', 'ms', -1, 1.0, '[]')"
            )
        assert store.runs() == []
        store.append([good], results(good, {("decode_token_ms", 1): [1.0]}))
        assert [r.run_id for r in store.runs()] == [good.run_id]


def test_marks_and_exclusions_are_kept(location):
    runs, rows = history_rows([100.0, 101.0])
    with Store(location) as store:
        store.append(runs, rows)
        store.mark(Mark(rows[0].series_key, runs[1].commit_sha, "expected", "new kernel", "2026-01-02T00:00:00Z"))
        store.mark(Mark(rows[0].series_key, runs[1].commit_sha, "false_positive", "noisy", "2026-01-03T00:00:00Z"))
        assert store.exclude(runs[0].job_id, "a busy runner") == 1
        assert store.exclude("nothing", "x") == 0
    with Store(location) as store:
        assert [(m.state, m.note) for m in store.marks()] == [("false_positive", "noisy")]
        assert [(r.excluded, r.exclude_reason) for r in store.runs()] == [(True, "a busy runner"), (False, None)]
        assert store.unmark(rows[0].series_key, runs[1].commit_sha) == 1 and store.marks() == []


def test_a_store_of_schema_1_is_migrated_and_keeps_its_rows(location):
    with Store.__new__(Store) as old:  # a store as version 1 wrote it
        old.location = location
        from pytest_llmperf.history.databases import Connection

        old.db = Connection(location)
        old.migrate_to(1)
        old.db.execute(
            "INSERT INTO llmperf_run (run_id, job_id, started_at, commit_sha, on_default_branch, dirty, source, "
            "target, machine, machine_fp, env_fp, env, plugin_version) VALUES "
            "('j:stored', 'j', '2026-01-01T00:00:00Z', 'abc', 1, 0, 'stored', 'cpu', 'm', 'h', 'e', '{}', '0.0.1')"
        )
        assert old.version() == 1
    with Store(location) as store:
        assert store.version() == SCHEMA_VERSION
        (only,) = store.runs()
        assert (only.run_id, only.excluded, only.exclude_reason) == ("j:stored", False, None)
        assert store.marks() == []


def test_a_store_from_a_newer_plugin_is_refused_and_left_alone(location):
    with Store(location) as store:
        store.db.execute("UPDATE llmperf_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match=r"schema version 99, written by a newer pytest-llmperf.*upgrade"):
        Store(location)
    with Store.__new__(Store) as raw:
        from pytest_llmperf.history.databases import Connection

        raw.location, raw.db = location, Connection(location)
        assert raw.version() == 99


WRITER = """
import sys
from pytest_llmperf.history.databases import Location
from pytest_llmperf.history.store import Store
from tests.history_rows import history_rows

dialect, target, worker, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with Store(Location(dialect, target)) as store:
    for j in range(jobs):
        store.append(*history_rows([100.0 + j], job=f"w{worker}-{j}"))
"""


def test_two_jobs_writing_at_once_lose_nothing(location):
    """Two processes (plain subprocesses: multiprocessing's spawn would leave its resource tracker running)."""
    Store(location).close()  # the schema exists; the writers race on rows
    root = Path(__file__).resolve().parents[1]
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, location.dialect, location.target, str(w), "15"], cwd=root)
        for w in range(2)
    ]
    assert [p.wait(120) for p in writers] == [0, 0]
    with Store(location) as store:
        assert len(store.runs()) == 30 and len(store.results()) == 30


def test_a_locked_sqlite_store_is_a_clear_error_naming_the_import(tmp_path):
    location = Location("sqlite", str(tmp_path / "h.sqlite"))
    Store(location).close()
    holder = sqlite3.connect(location.target, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreError, match=r"h\.sqlite is locked by another job.*history import"):
            with Store(location, timeout=0.2) as store:
                store.append(*history_rows([1.0]))
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_corrupt_sqlite_store_is_a_clear_error(tmp_path):
    path = tmp_path / "h.sqlite"
    path.write_bytes(b"this is not a database, just text " * 200)
    with pytest.raises(StoreError, match=r"h\.sqlite is not a readable database.*history import"):
        Store(Location("sqlite", str(path)))
    assert path.read_bytes().startswith(b"this is not a database")


def test_an_unreachable_postgres_store_names_it_without_its_password():
    location = Location("postgresql", "postgresql://me:secret@127.0.0.1:1/none")
    with pytest.raises(StoreError) as caught:
        Store(location, timeout=2)
    assert "me:***@127.0.0.1:1/none" in str(caught.value) and "secret" not in str(caught.value)


def test_locations(tmp_path):
    assert parse_location("off", tmp_path) is None
    assert parse_location("h.sqlite", tmp_path) == Location("sqlite", str(tmp_path / "h.sqlite"))
    assert parse_location("sqlite:////abs/h.db", tmp_path) == Location("sqlite", "/abs/h.db")
    assert parse_location("sqlite:///rel/h.db", tmp_path) == Location("sqlite", str(tmp_path / "rel/h.db"))
    assert parse_location("postgres://u@h/db", tmp_path).dialect == "postgresql"
    with pytest.raises(ValueError, match="postgresql://URL"):
        parse_location("mysql://x", tmp_path)


def test_rows_files_import_once_and_only_once(location, tmp_path):
    runs, rows = history_rows([100.0, 102.0, 98.0])
    path = tmp_path / "reports" / rows_jsonl.FILE_NAME
    rows_jsonl.append(path, runs[:2], rows[:2])
    rows_jsonl.append(path, runs[2:], rows[2:])
    assert len(path.read_text().splitlines()) == 3
    with Store(location) as store:
        store.append(runs[:1], rows[:1])  # the job that also wrote to the store
        (done,) = rows_jsonl.import_files(store, rows_jsonl.read_files([path]))
        assert (done[1].runs, done[1].already) == (2, 1)
        (again,) = rows_jsonl.import_files(store, rows_jsonl.read_files([path]))
        assert (again[1].runs, again[1].already) == (0, 3)
        assert len(store.results()) == 3


def test_a_bad_rows_file_names_its_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    runs, rows = history_rows([1.0])
    rows_jsonl.append(path, runs, rows)
    path.write_text(path.read_text() + '{"format": "something else"}\n')
    with pytest.raises(rows_jsonl.RowsFileError, match=r"rows\.jsonl, line 2: not a line of a pytest-llmperf rows"):
        rows_jsonl.read(path)
