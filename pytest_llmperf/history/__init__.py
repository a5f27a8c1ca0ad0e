"""The history of every job's results across jobs: a store (SQLite or PostgreSQL), series per metric, batch size,
test, target and machine class, change points and creep over them (docs/history.md).

A layer between the judge (whose outcomes it stores) and the report (which shows its analysis). Imported when a
session ends or the `pytest-llmperf history` command runs; ruptures (the `history` extra) only when analysing.
"""
