"""`pytest-llmperf bisect` (issue 49): the search and what a step's report says (fast), and bisections of real git
histories of a user's project whose simulated engine got slower at a known commit (slow: each step is an A/B job).

The engine's timings come from a cost model with seeded noise (tests/bisect_projects.py), not from the clock: a
step's verdict is the same on a busy machine. The margins: a 2% lognormal noise per run gives a step's ratio a 95%
interval of about +-0.01 at 4 processes of 3 runs a side, so a 10% step is 0.05 beyond the A/B tolerance (0.05) and
a 3% step 0.02 within it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from pytest_llmperf.bisection import BAD, GOOD, SKIP, Bisection, Search, Step, step_outcome, step_table
from pytest_llmperf.bisection_run import drop_set_here, split_argv
from pytest_llmperf.files import strict_json
from pytest_llmperf.orchestrate.options import OPTIONS

from .bisect_projects import PYTEST_ARGS, git, make_history

STEP_ARGS = (*PYTEST_ARGS, "--llmperf-processes=4", "-o", "llmperf_max_processes=4")


def search_for(first_bad: int, commits: int, skipped: frozenset[int] = frozenset()) -> tuple[Search, list[int]]:
    """A search run against an oracle: commits at or after `first_bad` are bad; those in `skipped` cannot decide."""
    search, asked = Search([f"c{i}" for i in range(commits)]), []
    while (index := search.next()) is not None:
        asked.append(index)
        search.record(index, SKIP if index in skipped else BAD if index >= first_bad else GOOD)
    return search, asked


@pytest.mark.parametrize("commits", [1, 2, 3, 7, 8, 31, 32, 40])
def test_the_search_finds_every_first_bad_commit_in_log2_steps(commits):
    for first_bad in range(commits):
        search, asked = search_for(first_bad, commits)
        assert search.bad == first_bad and search.suspects() == [first_bad]
        assert len(asked) <= math.ceil(math.log2(commits)) if commits > 1 else not asked
        assert len(set(asked)) == len(asked)


def test_a_skipped_commit_costs_a_step_and_one_next_to_the_first_bad_one_is_named():
    search, asked = search_for(20, 31, frozenset({14}))
    assert search.bad == 20 and asked[0] == 14 and asked[1] == 15  # the nearest untested commit to the middle
    assert len(asked) <= 6
    search, _ = search_for(20, 31, frozenset({19}))
    assert search.suspects() == [19, 20]  # 19 may be it: both are named


def verdict_row(metric, verdict, ratio, batch_size=1):
    return {"nodeid": "t.py::test_engine", "metric": metric, "batch_size": batch_size, "ratio": ratio,
            "ci_low": ratio - 0.01, "ci_high": ratio + 0.01, "verdict": verdict}  # fmt: skip


def test_a_steps_outcome_comes_from_its_reports_verdicts():
    bad = {"verdicts": [verdict_row("prefill_ms", "pass", 1.0), verdict_row("decode_token_ms", "regressed", 1.1),
                        verdict_row("throughput_tokens_per_s", "regressed", 0.8)]}  # fmt: skip
    outcome, why, row = step_outcome(bad, 1)
    assert (outcome, why, row.metric, row.ratio) == (BAD, "2 row(s) regressed", "throughput_tokens_per_s", 0.8)
    assert step_outcome(bad, 1, metrics=["prefill_ms"])[0] == GOOD  # only the series' rows decide
    assert step_outcome(bad, 1, batch_size=4)[0] == SKIP
    good = {"verdicts": [verdict_row("prefill_ms", "pass", 1.04), verdict_row("decode_token_ms", "improved", 0.99)]}
    assert step_outcome(good, 0)[2].metric == "prefill_ms"  # the largest change
    assert step_outcome(good, 0, focus=("decode_token_ms", 1))[2].metric == "decode_token_ms"
    undecided = {"verdicts": [verdict_row("decode_token_ms", "inconclusive", 1.05), verdict_row("x", "pass", 1.0)]}
    assert step_outcome(undecided, 1)[:2] == (SKIP, "1 row(s) inconclusive at the cap: undecided")
    nothing = {"verdicts": [verdict_row("decode_token_ms", "refused", 1.0)], "counts": {"refused": 1}}
    assert step_outcome(nothing, 1)[:2] == (SKIP, "nothing compared (1 refused; pytest exited 1)")
    outcome, why, row = step_outcome(None, 2)
    assert (outcome, row) == (SKIP, None) and "does not collect or build" in why and "exited 2" in why


def test_the_report_has_every_step_and_the_result():
    result = Bisection("a" * 40, "b" * 40, 31, "pytest tests --llmperf-compare=aaaa")
    outcome, why, row = step_outcome({"verdicts": [verdict_row("decode_token_ms", "regressed", 1.1)]}, 1)
    result.steps += [Step(1, "c" * 40, "commit 16", "a" * 40, "bisect", SKIP, "no report", None, 2.0, 2, "l1"),
                     Step(2, "d" * 40, "commit 21", "e" * 40, "confirm", outcome, why, row, 20.0, 1, "l2")]  # fmt: skip
    result.first_bad, result.subject, result.status, result.confirmed_by = "d" * 40, "commit 21", "found", 2
    assert result.verdict() == (
        "first bad commit: dddddddddddd commit 21 (against its parent: decode_token_ms bs 1 ratio 1.100 "
        "[1.090, 1.110] regressed)"
    )
    assert result.exit_code() == 0
    document = json.loads(strict_json(result.document()))
    assert [s["outcome"] for s in document["steps"]] == ["skip", "bad"] and document["first_bad"] == "d" * 40
    text = step_table(result.steps, markdown=False)
    assert "| 2 (confirm) | dddddddddd commit 21 |" in text and "1.100 [1.090, 1.110]" in text
    assert "skip: no report" in result.markdown()


def test_the_steps_pytest_arguments_follow_a_double_dash():
    assert split_argv(["A", "B", "--out", "x", "--", "tests", "-k", "decode"]) == (
        ["A", "B", "--out", "x"],
        ["tests", "-k", "decode"],
    )
    assert split_argv(["A", "B"]) == (["A", "B"], [])


def user_env(tmp):
    """A user's environment: not the suite's options (PYTEST_ADDOPTS) nor the plugin's one variable (the history
    store); temporary files (the steps' worktrees) under `tmp`."""
    suites = {"PYTEST_ADDOPTS", *(o.env for o in OPTIONS if o.env)}
    return {**{k: v for k, v in os.environ.items() if k not in suites}, "TMPDIR": str(tmp)}


def bisect(project, *args, tmp):
    """`pytest-llmperf bisect ARGS` in the project, as a user runs it (its temporary worktrees under `tmp`)."""
    return subprocess.run([sys.executable, "-m", "pytest_llmperf", "bisect", *args], cwd=project,
                          env=user_env(tmp), capture_output=True, text=True, timeout=900)  # fmt: skip


@pytest.mark.slow
def test_a_10_percent_step_in_32_commits_is_found_in_6_ab_jobs_and_the_worktrees_are_gone(tmp_path):
    project, tmp = tmp_path / "project", tmp_path / "tmp"
    tmp.mkdir()
    shas = make_history(project, 32, {21: 1.10})
    done = bisect(project, shas[0], "main", "--", *STEP_ARGS, tmp=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((project / "reports" / "bisect" / "bisect.json").read_text())
    assert report["first_bad"] == shas[21] and report["status"] == "found"
    steps = report["steps"]
    assert len(steps) <= 6 and steps[-1]["role"] == "confirm" and steps[-1]["against"] == shas[20]
    assert steps[-1]["row"]["metric"] in ("decode_token_ms", "throughput_tokens_per_s", "decode_tokens_per_s")
    assert f"bisect: first bad commit: {shas[21][:12]} commit 21 (x1.1 decode)" in done.stdout
    assert "bisect: step 1 (bisect):" in done.stdout and "s in all)" in done.stdout  # the live lines
    assert "| step" in (project / "reports" / "bisect" / "bisect.md").read_text()
    assert git(project, "worktree", "list").count("\n") == 0  # only the project's own
    assert list(tmp.iterdir()) == []


@pytest.mark.slow
def test_a_commit_that_does_not_collect_is_skipped_and_said_and_a_3_percent_step_is_not_the_cause(tmp_path):
    project, tmp = tmp_path / "project", tmp_path / "tmp"
    tmp.mkdir()
    # the first step takes commit 3, which does not collect; commit 2 is 3% slower, within the tolerance
    shas = make_history(project, 8, {2: 1.03, 5: 1.10}, broken={3})
    done = bisect(project, shas[0], shas[-1], "--", *STEP_ARGS, tmp=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((project / "reports" / "bisect" / "bisect.json").read_text())
    first = report["steps"][0]
    assert (first["commit"], first["outcome"]) == (shas[3], "skip")
    assert "does not collect or build" in first["why"]
    assert f"bisect: step 1: {shas[3][:10]} skip: no report (pytest exited" in done.stdout
    assert report["first_bad"] == shas[5] and report["status"] == "found"
    assert [s["outcome"] for s in report["steps"] if s["commit"] == shas[4]] == ["good"]  # 3% above GOOD: passes
    assert list(tmp.iterdir()) == []


def test_options_each_step_sets_itself_are_left_out():
    assert drop_set_here(["tests", "--llmperf-compare=main", "--llmperf-json", "r.json", "-k", "x"]) == (
        ["tests", "-k", "x"],
        ["--llmperf-compare=main", "--llmperf-json r.json"],
    )


@pytest.fixture
def history_store(tmp_path, monkeypatch):
    """A store whose decode series of test_engine.py::test_engine stepped 10% at the job of commit 25."""
    from pytest_llmperf.history import rows as rows_jsonl
    from tests.history_rows import history_rows
    from tests.history_synthetic import Case, history

    monkeypatch.delenv("LLMPERF_HISTORY", raising=False)
    runs, rows = history_rows(history(Case(40, 0.01, ((25, 0.10),)), 2))
    rows_jsonl.append(tmp_path / "rows.jsonl", runs, rows)
    store = tmp_path / "h.sqlite"
    from pytest_llmperf.cli import main

    assert main(["history", "--store", str(store), "import", str(tmp_path / "rows.jsonl")]) == 0
    return store


@pytest.mark.slow  # imports rows into a store and reads git: a process
def test_history_bisect_takes_the_changes_range_series_and_target(history_store, tmp_path, capsys):
    from pytest_llmperf.history.cli import main as history_main
    from tests.history_rows import sha

    base = ["--store", str(history_store)]
    history_main([*base, "changes", "--repo", str(tmp_path), "--state", "confirmed"])
    change_id = capsys.readouterr().out.split()[0]
    asked = []
    assert history_main([*base, "bisect", change_id, "--repo", str(tmp_path), "--", "--llmperf-rtol=0.1"],
                        run_bisect=lambda argv: asked.append(argv) or 0) == 0  # fmt: skip
    assert asked == [[sha(24), sha(25), "--metric=decode_token_ms", "--batch-size=1", "--",
                      "test_engine.py::test_engine", "--llmperf-device=cpu", "--llmperf-rtol=0.1"]]  # fmt: skip
    assert f"{change_id}: pytest-llmperf bisect {sha(24)} {sha(25)} --metric=decode_token_ms" in capsys.readouterr().out
    assert history_main([*base, "bisect", "nope@123", "--repo", str(tmp_path)]) == 2
    assert "no change or event nope@123" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        history_main([*base, "changes", "--", "x"])  # only bisect takes pytest arguments
    assert "arguments after -- are for bisect only: x" in capsys.readouterr().err


@pytest.mark.slow
def test_history_bisect_runs_the_bisection(history_store, tmp_path, capsys, monkeypatch):
    from pytest_llmperf.cli import main

    base = ["history", "--store", str(history_store)]
    main([*base, "changes", "--repo", str(tmp_path), "--state", "confirmed"])
    change_id = capsys.readouterr().out.split()[0]
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    assert main([*base, "bisect", change_id, "--repo", str(tmp_path)]) == 2  # the made-up commits are not in it
    assert "pytest-llmperf bisect: error: GOOD " in capsys.readouterr().err


def test_a_red_ab_job_prints_the_bisect_command_of_its_two_commits():
    from pytest_llmperf.judge.verdicts import Outcome, Row, Status, Verdict
    from pytest_llmperf.measure.records import BenchmarkResult
    from pytest_llmperf.report.summary import SessionSummary
    from pytest_llmperf.report.terminal import bisect_line, summary_lines

    def outcome(key, verdict):
        result = BenchmarkResult(key, f"t.py::{key}", "t.py", {}, {}, [])
        row = Row(key, result.nodeid, "decode_token_ms", 1, 1.0, 1.1, 1.1, 1.05, 1.15, 0.001, 0.001, verdict)
        return Outcome(result, Status.COMPARED, rows=[row])

    def session(**git):
        return SessionSummary(
            device="cpu", mode="gate", outcomes=[outcome("a", Verdict.REGRESSED), outcome("b", Verdict.PASS)],
            compared_to="origin/main (1111111111)", compared_commit="1" * 40,
            fingerprint={"git": {"commit": "2" * 40, "dirty": False, **git}},
            rerun=lambda: "pytest --llmperf-device=cpu --llmperf-compare=origin/main --llmperf-compare-deps=build "
                          "--llmperf-rtol=0.1 -o llmperf_warmups=0",
        )  # fmt: skip

    line = "find the commit that did it: pytest-llmperf bisect 111111111111 222222222222 -- t.py::a " \
           "--llmperf-device=cpu --llmperf-compare-deps=build --llmperf-rtol=0.1 -o llmperf_warmups=0"  # fmt: skip
    assert line in summary_lines(session())
    assert bisect_line(session(dirty=True)) == []  # the change is not (only) in a commit
    assert bisect_line(session(commit="1" * 40)) == []  # A/B against HEAD: one commit
    packages = replace(session(), changed_packages=["fastlib", "numpy"])
    assert bisect_line(packages) == [
        line,
        line.replace("the commit that did it:", "the package that did it (2 changed):").replace(
            "222222222222 --", "222222222222 --packages --"
        ),
    ]
    with_base = replace(packages, rerun=lambda: "pytest --llmperf-device=cpu --llmperf-base-python=/opt/base/python")
    assert bisect_line(with_base) == [  # --packages builds GOOD's environment: the prepared one is left out there
        "find the commit that did it: pytest-llmperf bisect 111111111111 222222222222 -- t.py::a --llmperf-device=cpu "
        "--llmperf-base-python=/opt/base/python",
        "find the package that did it (2 changed): pytest-llmperf bisect 111111111111 222222222222 --packages -- "
        "t.py::a --llmperf-device=cpu",
    ]


@pytest.mark.slow
def test_sigterm_mid_step_stops_its_pytest_and_removes_every_worktree(tmp_path):
    import signal
    import time

    project, tmp = tmp_path / "project", tmp_path / "tmp"
    tmp.mkdir()
    shas = make_history(project, 4, {2: 1.10})
    proc = subprocess.Popen([sys.executable, "-m", "pytest_llmperf", "bisect", shas[0], shas[-1], "--", *STEP_ARGS],
                            cwd=project, env=user_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        seen = ""
        for line in proc.stdout:
            seen += line
            if line.startswith("bisect: step 1 (bisect)"):
                break
        # the step's pytest is measuring once its own worktree of GOOD sits beside the step's worktree; a step takes
        # seconds (7 s on a quiet machine), its process lines come only every 8 s, so they are no signal to wait for
        deadline = time.monotonic() + 120
        while len(list(tmp.iterdir())) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # a cancelled CI job
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, seen + out
    assert "bisect: interrupted after 0 step(s)" in out
    report = json.loads((project / "reports" / "bisect" / "bisect.json").read_text())
    assert report["status"] == "interrupted"
    assert git(project, "worktree", "list").count("\n") == 0
    deadline = time.monotonic() + 30  # the step's pytest removes its own worktree of GOOD as it stops
    while list(tmp.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(tmp.iterdir()) == []


def test_a_result_its_parent_does_not_confirm_or_skipped_neighbours_fail_and_say_why():
    result = Bisection("a" * 40, "b" * 40, 8, "pytest")
    result.first_bad, result.subject, result.status = "d" * 40, "commit 5", "not-confirmed"
    assert "against its parent it is not" in result.verdict() and "accumulated" in result.verdict()
    assert result.exit_code() == 1
    result.status, result.suspects = "ambiguous", ["c" * 40, "d" * 40]
    assert result.verdict().startswith("the first bad commit is one of cccccccccccc, dddddddddddd")
    result.status = "interrupted"
    assert result.exit_code() == 130
