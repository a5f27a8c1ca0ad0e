"""A job's rows: from the judge's outcomes to the store's runs and results, and the rows file that holds them as
JSON lines beside the reports.

Per benchmark and side, per batch size that ran, per gated metric: the median of each worker process's runs (the
gate's unit; measured in one process, the median of its runs) and their median, the value a series plots. In an A/B
job `Outcome.reference` is side A, the compared ref (the base run), and `Outcome.result` side B, the working tree
(the head run); otherwise the result is the job's one run.
"""

from __future__ import annotations

import importlib.metadata
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..files import locked, write_text_atomic
from ..judge.baseline_entry import process_medians
from ..judge.fingerprint import SOFTWARE_KEYS
from ..judge.verdicts import Outcome
from ..measure.metrics import METRICS, gated_metrics, metric_better, values_by_process
from ..measure.records import BenchmarkResult
from ..measure.scenario import Scenario
from . import series
from .records import Result, Run, SeriesId, digest
from .store import Appended, Store

HARDWARE_KEYS = ("cpu_model", "cpu_signature", "cpu_isa", "cpu_cores_physical", "cpu_cores_logical", "ram_gb")


@dataclass(frozen=True)
class Job:
    """What a job says about itself: typed inputs, not the session."""

    target: str
    fingerprint: Mapping[str, Any]
    rootdir: Path
    machine: str | None = None  # the baseline set's machine name (the cpu target's CPU slug), if any
    compared_ref: str | None = None  # the git ref of an A/B job's side A
    default_branch: str | None = None  # llmperf_history_branch; None: found from git
    started_at: str = ""
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])


def machine_class(job: Job) -> str:
    """A series' machine: the baseline set's name where there is one (the cpu target: its CPU), else the GPUs'
    product and count (a GPU target's runners differ in CPU and host, not in what is measured)."""
    if job.machine:
        return job.machine
    gpus = [str(g.get("name")) for g in job.fingerprint.get("gpus") or []]
    if gpus:
        return ", ".join(f"{gpus.count(n)}x {n}" for n in sorted(set(gpus)))
    return str(job.fingerprint.get("cpu_model") or "machine")


def _software(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    found = {k: fingerprint.get(k) for k in SOFTWARE_KEYS}
    found["driver"] = sorted({str(g.get("driver")) for g in fingerprint.get("gpus") or []})
    return found


def _hardware(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    found = {k: fingerprint.get(k) for k in HARDWARE_KEYS}
    found["gpus"] = [(g.get("name"), g.get("memory_gb")) for g in fingerprint.get("gpus") or []]
    return found


def _plugin_version() -> str:
    try:
        return importlib.metadata.version("pytest-llmperf")
    except importlib.metadata.PackageNotFoundError:
        return ""


def results_of(result: BenchmarkResult, run_id: str, target: str, machine: str) -> list[Result]:
    """One row per batch size that ran and gated metric it measured."""
    test = f"{result.module}::{result.key}"
    metrics = gated_metrics(Scenario.from_json(result.scenario).metrics, result.splits_prefill)
    rows = []
    for batch in result.batches:
        if not batch.ok:
            continue
        per_process = values_by_process(batch.samples)
        for metric in metrics:
            runs = [r for r in per_process.get(metric, []) if r]
            if not runs:
                continue
            medians = tuple(process_medians(runs))
            rows.append(
                Result(
                    run_id,
                    test,
                    metric,
                    batch.batch_size,
                    SeriesId(test, metric, batch.batch_size, target, machine).key,
                    METRICS[metric].unit if metric in METRICS else "",
                    1 if metric_better(metric, result.counters_better) == "higher" else -1,
                    float(np.median(medians)),
                    medians,
                )
            )
    return rows


def job_rows(
    job: Job, outcomes: Sequence[Outcome], line: list[str], dirty: bool | None = None
) -> tuple[list[Run], list[Result]]:
    """The job's runs (one, or A/B's base and head) and their results; `line`: the default branch's first-parent
    commits, oldest first (job.py finds it once per job); `dirty`: whether the tree has changes besides the plugin's
    own files (judge/fingerprint.py's dirty; None: the fingerprint's word)."""
    branch = series.default_branch(job.rootdir, job.default_branch) if line else None
    git = job.fingerprint.get("git") or {}
    changed = bool(git.get("dirty")) if dirty is None else dirty
    machine = machine_class(job)
    common: dict[str, Any] = {
        "job_id": job.job_id,
        "started_at": job.started_at,
        "target": job.target,
        "machine": machine,
        "machine_fp": digest(_hardware(job.fingerprint)),
        "env_fp": digest(_software(job.fingerprint)),
        "env": _software(job.fingerprint),
        "plugin_version": _plugin_version(),
        "ci_url": series.ci_url(),
    }
    sides: list[tuple[str, str, bool, list[BenchmarkResult]]] = []
    if job.compared_ref is not None:
        sides.append(("ab-base", job.compared_ref, False, [o.reference for o in outcomes if o.reference is not None]))
        sides.append(("ab-head", "HEAD", changed, [o.result for o in outcomes]))
    else:
        sides.append(("stored", "HEAD", changed, [o.result for o in outcomes]))
    runs, results = [], []
    for source, ref, dirty, measured in sides:
        placed = series.place(job.rootdir, ref, line)
        sha = placed.sha if placed else str(git.get("commit") or "unknown")
        run_id = f"{job.job_id}:{source}"
        rows = [row for r in measured for row in results_of(r, run_id, job.target, machine)]
        if not rows:
            continue
        on_line = placed is not None and placed.order is not None and not dirty and source != "ab-head"
        runs.append(
            Run(
                run_id=run_id,
                commit_sha=sha,
                source=source,
                commit_time=placed.time if placed else None,
                commit_order=placed.order if placed else None,
                branch=branch if source == "ab-base" and on_line else series.current_branch(job.rootdir),
                on_default_branch=on_line,
                dirty=dirty,
                **common,
            )
        )
        results += rows
    return runs, results


# The rows file: a job's runs and results as JSON lines beside its reports (`<report dir>/history-rows.jsonl`), for
# a runner without a database; `pytest-llmperf history import FILE...` merges such files into any store, once.
#
# One line per run: `{"format": "pytest-llmperf history rows", "version": 1, "run": {...}, "results": [...]}`. Jobs
# that share a report directory append under the file's lock. Importing is idempotent (the store skips a run it holds),
# so the same artifact may be imported by every job on main.
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
