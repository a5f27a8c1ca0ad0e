"""Rows for the history's tests: runs and results as a job would write them, on a made-up first-parent line."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pytest_llmperf.history.records import Result, Run, SeriesId

TEST = "test_engine.py::test_engine"


def sha(i: int) -> str:
    return hashlib.sha1(str(i).encode()).hexdigest()


def run(i: int, *, job: str | None = None, source: str = "stored", env_fp: str = "env0", **overrides) -> Run:
    job = job or f"job{i:04d}"
    fields = dict(
        run_id=f"{job}:{source}",
        job_id=job,
        started_at=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
        commit_sha=sha(i),
        source=source,
        target="cpu",
        machine="test-machine",
        machine_fp="hw0",
        env_fp=env_fp,
        commit_time=f"2025-12-01T00:{i // 60:02d}:{i % 60:02d}Z",
        commit_order=i + 1,
        branch="main",
        on_default_branch=source != "ab-head",
        env={"python": "3.11"},
        plugin_version="0.1.0",
    )
    fields.update(overrides)
    return Run(**fields)


def results(r: Run, values: dict[tuple[str, int], Sequence[float]]) -> list[Result]:
    """One result per (metric, batch size): its per-process medians given, the value their median."""
    out = []
    for (metric, bs), medians in values.items():
        ordered = sorted(medians)
        mid = len(ordered) // 2
        value = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        key = SeriesId(TEST, metric, bs, r.target, r.machine).key
        out.append(Result(r.run_id, TEST, metric, bs, key, "ms", -1, value, tuple(medians)))
    return out


def history_rows(values: Sequence[float], metric: str = "decode_token_ms", bs: int = 1, **run_overrides):
    """A series of one value per commit: (runs, results)."""
    runs, rows = [], []
    for i, v in enumerate(values):
        r = run(i, **run_overrides)
        runs.append(r)
        rows += results(r, {(metric, bs): [v * 0.99, v, v * 1.01]})
    return runs, rows
