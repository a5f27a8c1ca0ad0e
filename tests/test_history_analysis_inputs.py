"""Series the analysis cannot take as ratios (a counter that stays at zero) and the markdown section of changes: a
warning, not an exception at the end of a job; test ids escaped in the table; a regression fixed since shown with
the level now."""

from __future__ import annotations

import json

from pytest_llmperf.history import summary
from pytest_llmperf.history.analysis import analyze_series
from pytest_llmperf.history.detect import DEFAULT_METHOD
from pytest_llmperf.history.series import Series, SeriesId
from pytest_llmperf.history.settings import ANALYSIS_FILE, ANALYSIS_FORMAT
from pytest_llmperf.report.history_changes import markdown_section, section
from tests.history_rows import history_rows
from tests.history_synthetic import Case, history
from pytest_llmperf.history.series import build


def test_a_series_of_zeros_is_a_warning_not_an_exception():
    runs, rows = history_rows([0.0] * 12, metric="fetches")
    (series,) = build(runs, rows).values()
    analysis = analyze_series(series)
    assert analysis.changes == [] and analysis.creep is None
    assert "12 job(s) with a value that is zero, negative or not finite" in analysis.warnings[0]
    assert analysis.set_aside == list(range(12))


def test_a_broken_job_is_set_aside_and_the_regression_around_it_still_fails():
    """One job of 40 measured inf, 0 or a negative value: the series is analysed without it, with a line."""
    values = list(history(Case(40, 0.01, ((20, 0.10),)), 0))
    for bad in (float("inf"), 0.0, -1.0):
        runs, rows = history_rows([*values[:30], bad, *values[30:]])
        (series,) = build(runs, rows).values()
        analysis = analyze_series(series)
        assert analysis.set_aside == [30] and "1 job(s) with a value that is zero" in analysis.warnings[0]
        (regression,) = analysis.changes
        assert regression.index == 20 and regression.fails(0.05)


def test_the_markdown_section_escapes_test_ids(tmp_path):
    change = {"id": "k@b", "series": "t.py::t[a|b] decode_token_ms bs 1", "state": "confirmed", "last_good": "a" * 40,
              "first_bad": "b" * 40, "change": 0.08, "kind": "regression", "mark": None}  # fmt: skip
    event = {"state": "confirmed", "kind": "regression", "series_moved": 1, "series": [change["series"]],
             "changes": ["k@b"], "last_good": "a" * 40, "first_bad": "b" * 40, "sizes": [0.08, 0.08], "fails": False,
             "mark": None, "series_total": 1, "shared": False, "changed_there": []}  # fmt: skip
    data = {"format": ANALYSIS_FORMAT, "events": [event], "changes": [change], "creep": []}
    (tmp_path / ANALYSIS_FILE).write_text(json.dumps(data))
    section = markdown_section(tmp_path)
    (row,) = [line for line in section.splitlines() if "decode_token_ms" in line]
    assert "a\\|b" in row and row.count(" | ") == 3  # four columns: the id's `|` is escaped
    assert "+8.0% regression" in row


def test_a_regression_fixed_since_reads_its_level_now_in_both_reports(tmp_path):
    runs, rows = history_rows(history(Case(80, 0.01, ((25, 0.10), (50, -0.09))), 2))
    (series,) = build(runs, rows).values()
    analysis = analyze_series(series)
    regression, gain = analysis.changes
    assert regression.now is not None and abs(regression.now) < 0.01 and gain.now is None
    assert not regression.fails(0.05)
    data = summary.document([analysis], DEFAULT_METHOD, 0.05, "h.sqlite")
    (tmp_path / ANALYSIS_FILE).write_text(json.dumps(data))
    (row,) = [line for line in markdown_section(tmp_path).splitlines() if "regression" in line]
    assert f"+{regression.change:.1%} regression (now {regression.now:+.1%})" in row
    html = section([{"settings": {"report_dir": str(tmp_path)}}])
    assert f"regression (now {regression.now:+.1%})</td>" in html and "(failing)" not in html


def test_a_failing_regression_is_said_so_in_the_html_report(tmp_path):
    runs, rows = history_rows(history(Case(60, 0.01, ((30, 0.10),)), 0))
    (series,) = build(runs, rows).values()
    analysis = analyze_series(series)
    (regression,) = analysis.changes
    assert regression.fails(0.05)
    data = summary.document([analysis], DEFAULT_METHOD, 0.05, "h.sqlite")
    assert data["changes"][0]["fails"] is True
    (tmp_path / ANALYSIS_FILE).write_text(json.dumps(data))
    html = section([{"settings": {"report_dir": str(tmp_path)}}])
    assert "<tr class='change confirmed failing'><td class='state'>confirmed (failing)</td>" in html
    assert f"{regression.change:+.1%} regression, failing" in markdown_section(tmp_path)
