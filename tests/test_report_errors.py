"""Errors that must not hide the verdict: reports that cannot be written, a bad GITHUB_STEP_SUMMARY,
--llmperf-json at a directory; and reports that are strict JSON."""

import json

import pytest

from pytest_llmperf.report.markdown import write_json

from .test_plugin import project, run  # noqa: F401  (fixture)


def _strict(text):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def blocked(project):
    """A report directory that cannot be created (its parent is a file; root ignores read-only modes)."""
    (project.path / "blocker").write_text("a file")
    return project.path / "blocker" / "reports"


def test_an_unwritable_report_dir_still_shows_the_regression_and_one_error_line(project, run, blocked, monkeypatch):
    run("--llmperf-update").assert_outcomes(passed=1)
    monkeypatch.setenv("SIM_DECODE", "1.5")
    result = run(f"--llmperf-report-dir={blocked}")
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*decode_token_ms (decode) at batch size 1 regressed*",
                                 "*| test_engine | decode_token_ms*regressed*",
                                 f"llmperf: cannot write the report under {blocked}: *set --llmperf-report-dir"])
    assert result.stdout.str().count("cannot write the report") == 1
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_an_unwritable_report_dir_fails_a_passing_session_with_the_reason(project, run, blocked):
    result = run("--llmperf-update", f"--llmperf-report-dir={blocked}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["*1 created*", f"llmperf: cannot write the report under {blocked}: *"])
    assert "INTERNALERROR" not in result.stdout.str()


@pytest.mark.parametrize("where", ["directory", "missing parent"])
def test_a_bad_github_step_summary_path_is_one_warning_line(project, run, monkeypatch, where):
    path = project.path if where == "directory" else project.path / "no" / "such" / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(path))
    result = run("--llmperf-update")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"llmperf: warning: cannot append the summary to GITHUB_STEP_SUMMARY={path}: *"])
    assert (project.path / "reports" / "cpu.json").exists()  # the reports are complete


def test_llmperf_json_at_a_directory_is_refused_naming_the_option(project, run):
    (project.path / "out").mkdir()
    result = run("--llmperf-json=out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--llmperf-json={project.path / 'out'} is a directory; give a file path*"])


def test_llmperf_json_that_cannot_be_written_names_the_option_and_keeps_the_reports(project, run):
    (project.path / "blocker").write_text("a file")
    result = run("--llmperf-update", "--llmperf-json=blocker/out.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["llmperf: cannot write --llmperf-json=*blocker/out.json: *Give a writable file path"])
    _strict((project.path / "reports" / "cpu.json").read_text())


def test_reports_are_strict_json_with_null_for_non_finite_values(tmp_path, project, run):
    path = tmp_path / "r.json"
    write_json(path, {"a": float("nan"), "b": [float("inf"), 1.5]})
    assert _strict(path.read_text()) == {"a": None, "b": [None, 1.5]}
    run("--llmperf-update").assert_outcomes(passed=1)
    _strict((project.path / "reports" / "cpu.json").read_text())


def test_a_report_dir_that_is_a_file_is_refused_up_front(project, run):
    (project.path / "taken").write_text("a file")
    result = run("--llmperf-report-dir=taken")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--llmperf-report-dir={project.path / 'taken'} is a file; give a directory*"])
    assert (project.path / "taken").read_text() == "a file"
