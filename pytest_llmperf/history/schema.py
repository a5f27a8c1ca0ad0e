"""The store's tables, one schema for SQLite and PostgreSQL, with its version and the migrations between versions.

Version 1 held the runs and their results; version 2 added what people say: marks on changes and excluded runs.
A store is migrated forward when opened (in one transaction, under the store's write lock); a store whose version is
newer than this plugin's is refused, never written, with the line to upgrade. Column types are written once, as
SQLite's and PostgreSQL's common names where they have them; `REAL` becomes `DOUBLE PRECISION` on PostgreSQL.
"""

from __future__ import annotations

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
