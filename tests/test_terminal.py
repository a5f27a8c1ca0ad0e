"""The summary's own lines, on outcomes built here: how old the baselines are, one count per benchmark."""

from datetime import datetime, timezone

from pytest_llmperf.judge.verdicts import Kind, Outcome, Row, Status, Verdict, counts
from pytest_llmperf.measure.records import BenchmarkResult
from pytest_llmperf.report.summary import SessionSummary
from pytest_llmperf.report.terminal import baseline_age, counts_line, judged_line


def outcome(key, status=Status.COMPARED, verdicts=(), created=""):
    result = BenchmarkResult(key, f"t.py::{key}", "t.py", {}, {}, [])
    rows = [Row(key, result.nodeid, "prefill_ms", 1, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, v) for v in verdicts]
    return Outcome(result, status, rows=rows, baseline_created=created)


def test_the_age_of_the_stored_baselines_is_said_and_ab_has_none():
    now = datetime(2026, 11, 24, 23, 0, tzinfo=timezone.utc)
    found = [outcome("a", verdicts=[Verdict.PASS], created="2026-11-21T10:00:00+00:00"),
             outcome("b", verdicts=[Verdict.PASS], created="2026-11-24T20:00:00+00:00"), outcome("c")]
    line = baseline_age(found, now)
    assert line.startswith("stored baselines recorded 3 h to 4 days ago (oldest: a, 2026-11-21)")
    assert "--llmperf-compare" in line
    assert baseline_age([outcome("c", verdicts=[Verdict.PASS])], now) is None


def test_each_benchmark_counts_once_and_new_or_refused_is_not_judged():
    found = [outcome("a", verdicts=[Verdict.PASS, Verdict.INCONCLUSIVE]), outcome("b", verdicts=[Verdict.REGRESSED]),
             outcome("c", verdicts=[Verdict.NEW]), outcome("d", status=Status.NEW),
             outcome("e", verdicts=[Verdict.UNGATED, Verdict.UNGATED]), outcome("f", status=Status.CREATED)]
    assert [o.kind for o in found] == [Kind.INCONCLUSIVE, Kind.REGRESSED, Kind.NEW, Kind.NEW, Kind.REFUSED,
                                       Kind.CREATED]
    assert sum(counts(found).values()) == len(found)
    assert counts_line(counts(found)) == "1 regressed, 1 inconclusive, 1 created, 2 new, 1 refused"
    session = SessionSummary(outcomes=found, mode="gate", device="cpu")
    line, colour = judged_line(session)
    assert line.startswith("llmperf: judged 2 of 6 benchmarks (") and colour == "yellow"
    assert "2 new: " in line and "1 refused: nothing gated was measured" in line


def test_a_session_that_compared_nothing_says_so_in_red():
    session = SessionSummary(outcomes=[outcome("d", status=Status.NEW)], skipped_here=1, mode="gate", device="cpu")
    line, colour = judged_line(session)
    assert line == ("llmperf: judged 0 of 2 benchmarks (1 new: new test; 1 skipped: they run on other devices than "
                    "cpu): nothing was compared") and colour == "red"
