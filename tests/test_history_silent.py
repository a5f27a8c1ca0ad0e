"""Nothing silent, and a command line with the plugin's manners: a rewritten default branch, a broken job, a relative
sqlite URL, a conflicting re-import, a store on a read-only disk; every user mistake one line and exit 2, rows
validated on import with the line and field named, nothing created when an import fails."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pytest_llmperf.cli import main
from pytest_llmperf.history import rows as rows_jsonl
from pytest_llmperf.history.databases import Location, parse_location
from pytest_llmperf.history.store import Store
from tests.history_rows import history_rows
from tests.history_synthetic import Case, history

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}


@pytest.fixture(autouse=True)
def _no_store_variable(monkeypatch):
    monkeypatch.delenv("LLMPERF_HISTORY", raising=False)


def git(path: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True, env=env).stdout.strip()


def imported(tmp_path: Path, values, name: str = "h.sqlite", **overrides) -> str:
    runs, rows = history_rows(values, **overrides)
    path = tmp_path / f"{name}.jsonl"
    rows_jsonl.append(path, runs, rows)
    store = str(tmp_path / name)
    assert main(["history", "--store", store, "import", str(path)]) == 0
    return store


def step() -> list[float]:
    return list(history(Case(40, 0.01, ((20, 0.10),)), 0))


@pytest.mark.slow
def test_runs_of_a_rewritten_default_branch_are_said_analysed_and_can_be_re_placed(tmp_path, capsys):
    """40 jobs recorded on main, whose commits a force-push replaced: the regression among them is still found and
    fails `analyze --fail`, the runs are counted in a note, and `replace` moves a run onto its new commit."""
    store = imported(tmp_path, step())
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "commit", "-q", "--allow-empty", "-m", "rewritten")
    capsys.readouterr()
    assert main(["history", "--store", store, "analyze", "--repo", str(repo), "--fail"]) == 1
    said = capsys.readouterr()
    assert "note: 40 stored run(s) at 40 commit(s) recorded on the default branch are no longer on" in said.err
    assert "placed by when their jobs ran" in said.err and "history replace OLD NEW" in said.err
    assert "1 failing" in said.out
    with Store(Location("sqlite", store)) as opened:
        old = opened.runs()[0].commit_sha
    assert main(["history", "--store", store, "replace", old[:10], "HEAD", "--repo", str(repo)]) == 0
    assert "1 run(s) moved onto" in capsys.readouterr().out
    main(["history", "--store", store, "changes", "--repo", str(repo)])
    assert "note: 39 stored run(s)" in capsys.readouterr().err
    assert main(["history", "--store", store, "import", str(tmp_path / "h.sqlite.jsonl")]) == 0  # moved, not other
    assert "0 run(s) and 0 result(s) imported, 40 already there" in capsys.readouterr().out
    assert main(["history", "--store", store, "replace", "f00", "HEAD", "--repo", str(repo)]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("bad", [math.inf, 0.0, -3.0])
def test_one_broken_job_among_40_leaves_the_regression_failing(tmp_path, capsys, bad):
    values = step()
    store = imported(tmp_path, [*values[:30], bad, *values[30:]])
    capsys.readouterr()
    assert main(["history", "--store", store, "analyze", "--repo", str(tmp_path), "--fail"]) == 1
    out = capsys.readouterr().out
    assert "1 job(s) with a value that is zero, negative or not finite" in out and "set aside, the rest analysed" in out


def test_sqlite_urls_resolve_as_sqlalchemy_does(tmp_path):
    assert parse_location("sqlite:///rel/h.sqlite", tmp_path) == Location("sqlite", str(tmp_path / "rel/h.sqlite"))
    assert parse_location("sqlite:////abs/h.sqlite", tmp_path) == Location("sqlite", "/abs/h.sqlite")


def test_a_second_rows_file_with_the_same_run_ids_and_other_values_is_refused_naming_them(tmp_path, capsys):
    store = imported(tmp_path, step())
    runs, rows = history_rows([v * 1.2 for v in step()])
    other = tmp_path / "other.jsonl"
    rows_jsonl.append(other, runs, rows)
    capsys.readouterr()
    assert main(["history", "--store", store, "import", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds run(s) job0000:stored, job0001:stored, job0002:stored and 37" in err
    with Store(Location("sqlite", store)) as opened:
        assert {r.value for r in opened.results()} == {r.value for r in history_rows(step())[1]}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["analyze", "--min-effect", "-1"], "--min-effect: expected a relative size above 0 and below 1"),
        (["analyze", "--min-effect", "nan"], "--min-effect: expected a relative size above 0 and below 1"),
        (["changes", "--min-effect", "five"], "--min-effect: expected a relative size such as 0.05"),
        (["analyze", "--repo", "/nonexistent"], "--repo: /nonexistent is no directory"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_a_usage_mistake_is_one_line_and_exit_2(tmp_path, argv, said):
    done = subprocess.run(
        [sys.executable, "-m", "pytest_llmperf", "history", "--store", str(tmp_path / "h.sqlite"), *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"value": float("nan")}, "field 'value' is NaN"),
        ({"direction": 7}, "field 'direction' is 7"),
        ({"batch_size": -3}, "field 'batch_size' is -3"),
    ],
)
def test_a_bad_result_is_refused_with_its_line_and_field_and_creates_no_store(tmp_path, capsys, change, said):
    runs, rows = history_rows(step())
    path = tmp_path / "rows.jsonl"
    rows_jsonl.append(path, runs, rows)
    lines = path.read_text().splitlines()
    data = json.loads(lines[6])
    data["results"][0].update(change)
    lines[6] = json.dumps(data)
    path.write_text("\n".join(lines) + "\n")
    assert main(["history", "--store", str(tmp_path / "h.sqlite"), "import", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rows.jsonl, line 7: result 'test_engine.py::test_engine'" in err and said in err
    assert not (tmp_path / "h.sqlite").exists()


def test_a_commit_that_is_no_sha_and_a_binary_file_are_refused(tmp_path, capsys):
    runs, rows = history_rows(step()[:3], commit_sha="main~2")
    path = tmp_path / "rows.jsonl"
    rows_jsonl.append(path, runs, rows)
    assert main(["history", "--store", str(tmp_path / "h.sqlite"), "import", str(path)]) == 2
    assert "line 1: run field 'commit_sha' is 'main~2', not a git commit's sha" in capsys.readouterr().err
    binary = tmp_path / "store.sqlite"
    binary.write_bytes(b"SQLite format 3\x00\xff\xfe" + bytes(range(256)))
    assert main(["history", "--store", str(tmp_path / "h.sqlite"), "import", str(binary)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "store.sqlite: not a rows file (not UTF-8 text" in err
    assert not (tmp_path / "h.sqlite").exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to read as another user"
)
def test_a_store_this_user_cannot_write_is_read_all_the_same(tmp_path):
    """The store and its folder read-only to the user reading them (nobody): changes and analyze work; a write is
    one line."""
    folder = Path(tempfile.mkdtemp(prefix="llmperf-ro-"))
    try:
        store = imported(folder, step())
        for path in folder.iterdir():
            path.chmod(0o444)
        folder.chmod(0o555)
        root = Path(__file__).resolve().parents[1]

        def as_nobody(*command: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, *command],
                capture_output=True, text=True, check=False, cwd="/", env={**os.environ, "PYTHONPATH": str(root)},
            )  # fmt: skip

        if as_nobody("-c", "import numpy, pytest, pytest_llmperf.history.detect").returncode != 0:
            pytest.skip("this Python environment is not readable by the user nobody")
        read = as_nobody("-m", "pytest_llmperf", "history", "--store", store, "changes", "--repo", "/")
        assert read.returncode == 0 and "confirmed   regression" in read.stdout, read.stderr
        history = ("-m", "pytest_llmperf", "history", "--store", store)
        assert as_nobody(*history, "analyze", "--repo", "/", "--fail").returncode == 1
        written = as_nobody(*history, "exclude", "job0001", "--reason", "x")
        assert written.returncode == 2 and written.stderr.count("\n") == 1 and "readonly" in written.stderr
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)
