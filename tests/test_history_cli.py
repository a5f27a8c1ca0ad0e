"""`pytest-llmperf history ...` on a store holding a series with a step: import, analyze, changes, mark, exclude,
export, migrate, and clear errors (exit 2, one line) for a missing store or a bad rows file."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from pytest_llmperf.cli import main
from pytest_llmperf.history import rows as rows_jsonl
from pytest_llmperf.history.databases import Location
from pytest_llmperf.history.store import Store
from tests.history_rows import history_rows, sha
from tests.history_synthetic import Case, history


@pytest.fixture
def rows_file(tmp_path):
    runs, rows = history_rows(history(Case(40, 0.01, ((25, 0.10),)), 2))
    path = tmp_path / "reports" / "history-rows.jsonl"
    rows_jsonl.append(path, runs, rows)
    return path


@pytest.fixture
def store(tmp_path, rows_file, monkeypatch):
    monkeypatch.delenv("LLMPERF_HISTORY", raising=False)
    path = tmp_path / "h.sqlite"
    assert main(["history", "--store", str(path), "import", str(rows_file)]) == 0
    return path


def test_import_twice_adds_nothing_the_second_time(store, rows_file, capsys):
    capsys.readouterr()
    assert main(["history", "--store", str(store), "import", str(rows_file)]) == 0
    assert "0 run(s) and 0 result(s) imported, 40 already there" in capsys.readouterr().out


@pytest.mark.slow
def test_analyze_finds_the_step_and_fails_only_when_asked(store, tmp_path, capsys):
    out = tmp_path / "analysis.json"
    assert main(["history", "--store", str(store), "analyze", "--repo", str(tmp_path), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "confirmed   regression   +10." in text and f"{sha(24)[:12]}..{sha(25)[:12]}" in text
    assert main(["history", "--store", str(store), "analyze", "--repo", str(tmp_path), "--fail"]) == 1
    text = capsys.readouterr().out
    assert "1 failing" in text and "a regression of at least 5% since the job at " in text


@pytest.mark.slow
def test_a_change_marked_expected_no_longer_fails(store, tmp_path, capsys):
    main(["history", "--store", str(store), "changes", "--repo", str(tmp_path), "--state", "confirmed"])
    change_id = capsys.readouterr().out.split()[0]
    assert main(["history", "--store", str(store), "mark", change_id, "--as", "expected", "--note", "new kernel"]) == 0
    assert main(["history", "--store", str(store), "analyze", "--repo", str(tmp_path), "--fail"]) == 0
    assert "marked expected" in capsys.readouterr().out
    assert main(["history", "--store", str(store), "mark", "nope@123", "--as", "expected"]) == 2
    assert "no change nope@123" in capsys.readouterr().err


@pytest.mark.slow
def test_excluded_runs_leave_the_series(store, tmp_path, capsys):
    with Store(Location("sqlite", str(store))) as opened:
        jobs = [r.job_id for r in opened.runs()[25:]]
    for job in jobs:
        assert main(["history", "--store", str(store), "exclude", job, "--reason", "a bad runner"]) == 0
    capsys.readouterr()
    main(["history", "--store", str(store), "changes", "--repo", str(tmp_path)])
    assert capsys.readouterr().out.strip().endswith("0 change(s) in 1 series")
    assert main(["history", "--store", str(store), "exclude", "nothing", "--reason", "x"]) == 2


@pytest.mark.slow
def test_export_writes_what_otavas_csv_reader_expects(store, tmp_path, capsys):
    out = tmp_path / "otava"
    assert main(["history", "--store", str(store), "export", "--out", str(out), "--repo", str(tmp_path)]) == 0
    (csv_file,) = out.glob("*.csv")
    rows = list(csv.DictReader(csv_file.open()))
    assert len(rows) == 40 and list(rows[0]) == ["time", "commit", "commit_time", "decode_token_ms"]
    assert rows[0]["time"] < rows[1]["time"] and rows[25]["commit"] == sha(25)
    import yaml

    config = yaml.safe_load((out / "otava.yaml").read_text())
    (test,) = config["tests"].values()
    assert test["type"] == "csv" and test["metrics"]["decode_token_ms"]["direction"] == -1
    assert test["file"] == str(csv_file.resolve()) and test["attributes"] == ["commit", "commit_time"]


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["history", "--store", str(tmp_path / "none.sqlite"), "changes"]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["history", "--store", str(tmp_path / "h.sqlite"), "import", str(bad)]) == 2
    assert "bad.jsonl, line 1" in capsys.readouterr().err
    assert main(["history", "--store", str(tmp_path / "h.sqlite"), "import", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl: cannot read the rows file" in capsys.readouterr().err
    assert not (tmp_path / "h.sqlite").exists()  # a rows file that cannot be read creates no store


def test_the_installed_command_runs_history(store):
    done = subprocess.run(
        [sys.executable, "-m", "pytest_llmperf", "history", "--store", str(store), "migrate"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "schema version 2" in done.stdout


def test_an_anchor_git_does_not_know_and_an_unwritable_out_are_one_line_and_exit_2(store, tmp_path, capsys):
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    capsys.readouterr()
    args = ["history", "--store", str(store), "analyze", "--repo", str(tmp_path / "repo")]
    assert main([*args, "--anchor", "v9"]) == 2
    assert "--anchor v9 is no commit of the repository" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    assert main([*args, "--out", str(tmp_path / "taken")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("note: ")]
    assert len(err) == 1 and "taken" in err[0] and "Traceback" not in err[0]


def _store_of(values, tmp_path):
    runs, rows = history_rows(values)
    path = tmp_path / "rows.jsonl"
    rows_jsonl.append(path, runs, rows)
    store = tmp_path / "fixed.sqlite"
    assert main(["history", "--store", str(store), "import", str(path)]) == 0
    return store


@pytest.mark.slow
@pytest.mark.parametrize(("back", "failing"), [(-0.09, 0), (-0.03, 1)])
def test_a_regression_fixed_since_no_longer_fails(tmp_path, capsys, back, failing):
    """+10% at commit 25, then a confirmed gain at 50: undone (-9%: back within 1% of the old level) it no longer
    fails; half undone (-3%: still 6.7% worse than before it) it still does. Both stay listed, with `now`."""
    store = _store_of(history(Case(80, 0.01, ((25, 0.10), (50, back))), 2), tmp_path)
    capsys.readouterr()
    code = main(["history", "--store", str(store), "analyze", "--repo", str(tmp_path), "--fail"])
    out = capsys.readouterr().out
    assert code == failing and f"2 confirmed, {failing} failing" in out
    main(["history", "--store", str(store), "changes", "--repo", str(tmp_path), "--state", "failing"])
    assert capsys.readouterr().out.strip().endswith(f"{failing} change(s) in 1 series")
    (regression,) = [line for line in out.splitlines() if "confirmed   regression" in line]
    now = float(regression.split(", now ")[1].split("%")[0])
    assert abs(now - ((1.10 * (1 + back)) - 1) * 100) < 1.0  # the newest level against the level before the step
