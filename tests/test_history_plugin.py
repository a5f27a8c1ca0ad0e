"""The history from a real session (pytester, the simulated engine, a git repository on main): every job appends
its rows to the SQLite store by default and writes its rows file; a store it cannot write is a line that names it,
and fails the session only with --llmperf-history-check=fail. A/B jobs store both sides, the base side in the series.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from pytest_llmperf.history.databases import Location
from pytest_llmperf.history.rows import Job, job_rows
from pytest_llmperf.history.series import build, first_parent_line
from pytest_llmperf.history.store import Store
from pytest_llmperf.judge.verdicts import Outcome, Status
from tests.test_plugin import ENGINE_TEST

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}


def git(path, *args):
    return subprocess.run(
        ["git", *args], cwd=path, check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}
    ).stdout.strip()


@pytest.fixture
def project(project, monkeypatch):
    for name in ("GITHUB_HEAD_REF", "GITHUB_REF_NAME", "GITHUB_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    project.makepyfile(test_engine=ENGINE_TEST.replace("[1, 2, 4], runs=10", "[1, 2], runs=5"))
    git(project.path, "init", "-q", "-b", "main")
    (project.path / ".gitignore").write_text("reports/\nbaselines/\n.llmperf/\n__pycache__/\n")
    git(project.path, "add", "-A")
    git(project.path, "commit", "-qm", "one")
    return project


@pytest.fixture
def run(run):
    return run.with_flags("--llmperf-max-load=1000", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def store_of(project) -> Store:
    return Store(Location("sqlite", str(project.path / ".llmperf" / "history.sqlite")))


def test_every_job_appends_to_the_sqlite_store_and_writes_its_rows_file(project, run):
    run("--llmperf-update").assert_outcomes(passed=1)
    git(project.path, "commit", "-q", "--allow-empty", "-m", "two")
    result = run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*llmperf history: 6 rows of 1 run(s) appended to *history.sqlite*"])
    with store_of(project) as store:
        runs = store.runs()
        assert [r.commit_order for r in runs] == [1, 2] and all(r.on_default_branch for r in runs)
        assert [r.branch for r in runs] == ["main", "main"] and {r.source for r in runs} == {"stored"}
        results = store.results()
        assert {(r.metric, r.batch_size) for r in results} == {
            (m, b) for m in ("prefill_ms", "decode_token_ms", "throughput_tokens_per_s") for b in (1, 2)
        }
        assert all(len(r.process_medians) == 1 and r.value == r.process_medians[0] for r in results)
        assert len(build(runs, results)) == 6  # a series per metric and batch size, two commits each
    rows = (project.path / "reports" / "history-rows.jsonl").read_text().splitlines()
    assert [json.loads(line)["run"]["run_id"] for line in rows] == [r.run_id for r in runs]
    analysis = json.loads((project.path / "reports" / "history.json").read_text())
    assert analysis["series_analysed"] == 6 and analysis["changes"] == []


def test_with_the_store_off_only_the_rows_file_is_written(project, run):
    run("--llmperf-update", "--llmperf-history=off").assert_outcomes(passed=1)
    assert not (project.path / ".llmperf").exists()
    assert (project.path / "reports" / "history-rows.jsonl").exists()


@pytest.mark.parametrize("check", ["report", "fail"])
def test_a_corrupt_store_is_a_line_naming_it_and_fails_only_when_asked(project, run, check):
    store = project.path / "broken.sqlite"
    store.write_bytes(b"not a database " * 100)
    result = run("--llmperf-update", f"--llmperf-history={store}", f"--llmperf-history-check={check}")
    result.stdout.fnmatch_lines(["*llmperf history: history store *broken.sqlite is not a readable database*"])
    assert (result.ret == 0) == (check == "report")
    assert "Traceback" not in result.stdout.str() and "INTERNALERROR" not in result.stdout.str()
    assert (project.path / "reports" / "history-rows.jsonl").exists()  # nothing of the job is lost


def test_the_rows_file_branch_anchor_and_min_effect_options_reach_the_history(project, run):
    git(project.path, "tag", "v1")
    result = run("--llmperf-update", "-o", "llmperf_history_rows=false", "-o", "llmperf_history_branch=main",
                 "-o", "llmperf_history_anchor=v1", "-o", "llmperf_history_min_effect=0.2")  # fmt: skip
    result.assert_outcomes(passed=1)
    assert not (project.path / "reports" / "history-rows.jsonl").exists()
    assert json.loads((project.path / "reports" / "history.json").read_text())["min_effect"] == 0.2
    assert "llmperf history:" in result.stdout.str() and "is no " not in result.stdout.str()
    with store_of(project) as store:
        assert [r.on_default_branch for r in store.runs()] == [True]


def test_a_branch_or_anchor_that_is_no_ref_is_said_not_ignored(project, run):
    result = run("--llmperf-update", "-o", "llmperf_history_branch=trunk", "-o", "llmperf_history_anchor=v9")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*llmperf_history_branch=trunk is no branch of this repository: the job's runs are stored but enter no series",
        "*llmperf_history_anchor=v9 is no commit of this repository: creep is measured from the oldest commit*",
    ])  # fmt: skip
    with store_of(project) as store:
        assert [r.on_default_branch for r in store.runs()] == [False]


def test_an_earlier_jobs_analysis_is_not_shown_as_this_ones(project, run):
    stale = project.path / "reports" / "history.json"
    stale.parent.mkdir()
    stale.write_text('{"format": "pytest-llmperf history analysis", "changes": [], "creep": []}')
    run("--llmperf-update", "--llmperf-history=off").assert_outcomes(passed=1)
    assert not stale.exists()


@pytest.mark.parametrize("check", ["report", "fail"])
def test_runs_that_can_enter_no_series_are_said_and_fail_when_asked(project, run, check):
    shutil.rmtree(project.path / ".git")  # no default branch, as in a directory that is no git repository
    result = run("--llmperf-update", f"--llmperf-history-check={check}")
    result.stdout.fnmatch_lines(["*llmperf history: no default branch found*the job's runs are stored but enter no series"])
    assert (result.ret == 0) == (check == "report")


def test_a_bad_store_option_is_a_usage_error(project, run):
    result = run("--llmperf-history=mysql://somewhere")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value for --llmperf-history*postgresql://URL*"])


@pytest.mark.slow
def test_an_ab_job_stores_both_sides_and_only_the_base_enters_a_series(tmp_path, monkeypatch):
    """Rows of an A/B job's outcomes: side A (Outcome.reference, the compared ref) and side B (the working tree)."""
    from pytest_llmperf.backends.simulated import SimulatedBackend
    from pytest_llmperf.measure.runner import measure
    from pytest_llmperf.measure.scenario import Scenario

    for name in ("GITHUB_HEAD_REF", "GITHUB_REF_NAME"):
        monkeypatch.delenv(name, raising=False)
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "base")
    scenario = Scenario(batch_sizes=(1,), runs=3, warmups=0)

    def measured(seed, processes):
        parts = [
            measure(SimulatedBackend(seed=seed + p), scenario, key="t", nodeid="t.py::t", module="t.py")
            for p in processes
        ]
        for p, part in zip(processes, parts):
            for s in part.batches[0].samples:
                s.process = p
        from pytest_llmperf.measure.records import BenchmarkResult

        return BenchmarkResult.merge(parts)

    outcome = Outcome(measured(10, [1, 3]), Status.COMPARED, reference=measured(20, [0, 2]))
    fingerprint = {"git": {"commit": git(tmp_path, "rev-parse", "HEAD"), "dirty": True}, "python": "3.11"}
    line = first_parent_line(tmp_path, "main")
    runs, results = job_rows(
        Job("cpu", fingerprint, tmp_path, "m", compared_ref="HEAD", started_at="t"), [outcome], line
    )
    assert [(r.source, r.on_default_branch, r.dirty) for r in runs] == [
        ("ab-base", True, False),
        ("ab-head", False, True),
    ]
    base = [r for r in results if r.run_id == runs[0].run_id]
    assert all(len(r.process_medians) == 2 for r in results)
    with Store(Location("sqlite", str(tmp_path / "h.sqlite"))) as store:
        store.append(runs, results)
        series = build(store.runs(), store.results())
    assert sorted(p.value for s in series.values() for p in s.points) == sorted(r.value for r in base)


def test_a_confirmed_regression_fails_the_job_only_when_asked_and_until_marked(project, run):
    """A real job at the end of 40 earlier jobs on main (the first job's rows, rescaled, one per commit): decode at
    batch 1 was 10% faster before commit 20. The job measures the slower level, so the regression is still in
    effect: said with report, failing the session with fail, and passing once marked expected."""
    import dataclasses

    import numpy as np

    from pytest_llmperf.cli import main

    run("--llmperf-update").assert_outcomes(passed=1)
    rng = np.random.default_rng(7)
    with store_of(project) as store:
        (first,) = store.runs()
        measured = store.results()
        store.exclude(first.run_id, "its rows are copied below")
        for k in range(40):
            git(project.path, "commit", "-q", "--allow-empty", "-m", f"earlier {k}")
            sha = git(project.path, "rev-parse", "HEAD")
            earlier = dataclasses.replace(first, run_id=f"earlier{k}:stored", job_id=f"earlier{k}", commit_sha=sha)
            scaled = []
            for r in measured:
                size = 0.9 if (r.metric, r.batch_size, k < 20) == ("decode_token_ms", 1, True) else 1.0
                value = r.value * size * (1 + rng.normal(0, 0.01))
                scaled.append(dataclasses.replace(r, run_id=earlier.run_id, value=value, process_medians=(value,)))
            store.append([earlier], scaled)
    git(project.path, "commit", "-q", "--allow-empty", "-m", "this job")
    said = run("--llmperf-history-check=report")
    said.assert_outcomes(passed=1)
    said.stdout.fnmatch_lines(["*llmperf history: regression +1*decode_token_ms bs 1*, confirmed, failing, between*"])
    failed = run("--llmperf-history-check=fail")
    assert failed.ret != 0
    failed.stdout.fnmatch_lines(["*1 confirmed regression(s) of at least 5%, still in effect, that nobody marked*"])
    store_path = str(project.path / ".llmperf" / "history.sqlite")
    change = json.loads((project.path / "reports" / "history.json").read_text())["changes"][0]
    assert change["fails"] and change["series"].startswith("test_engine.py::")
    change_id = f"{change['series_key']}@{change['first_bad'][:12]}"
    assert main(["history", "--store", store_path, "mark", change_id, "--as", "expected"]) == 0
    run("--llmperf-history-check=fail").assert_outcomes(passed=1)


def test_a_store_committed_by_mistake_leaves_later_jobs_clean(project, run):
    """No `.llmperf/` in .gitignore: the folder ignores itself, so `git add -A` leaves the store out; committed by
    force anyway, the jobs after it still measure a clean tree, enter the series and say "clean" in their reports."""
    (project.path / ".gitignore").write_text("reports/\nbaselines/\n__pycache__/\n")
    git(project.path, "commit", "-qam", "no .llmperf/ in .gitignore")
    run("--llmperf-update").assert_outcomes(passed=1)
    assert (project.path / ".llmperf" / ".gitignore").read_text().splitlines()[-1] == "*"
    git(project.path, "add", "-A")
    assert ".llmperf" not in git(project.path, "status", "--porcelain")
    git(project.path, "add", "-f", ".llmperf")
    git(project.path, "commit", "-qm", "the store, by mistake")
    for n in range(2):
        git(project.path, "commit", "-q", "--allow-empty", "-m", f"next {n}")
        result = run()
        result.assert_outcomes(passed=1)
        assert "enter no series" not in result.stdout.str()
        # the report's fingerprint reads the tree by the same rule (judge/fingerprint.py's `dirty`)
        report = json.loads((project.path / "reports" / "cpu.json").read_text())
        assert report["fingerprint"]["git"]["dirty"] is False
    with store_of(project) as store:
        later = store.runs()[1:]
    assert [(r.dirty, r.on_default_branch) for r in later] == [(False, True), (False, True)]


def test_a_job_whose_runs_enter_no_series_says_why(project, run):
    run("--llmperf-update").assert_outcomes(passed=1)
    (project.path / "notes.txt").write_text("one\n")
    git(project.path, "add", "notes.txt")
    git(project.path, "commit", "-qm", "notes")
    (project.path / "notes.txt").write_text("two\n")
    run().stdout.fnmatch_lines(
        ["*llmperf history: the working tree has uncommitted changes (dirty) besides the plugin's own files: the "
         "job's runs are stored but enter no series*"]
    )  # fmt: skip
    git(project.path, "checkout", "-q", "-b", "feature")
    git(project.path, "commit", "-qam", "on a branch")
    sha = git(project.path, "rev-parse", "HEAD")
    run().stdout.fnmatch_lines(
        [f"*llmperf history: commit {sha[:12]} is not on the default branch's first-parent line*enter no series*"]
    )
