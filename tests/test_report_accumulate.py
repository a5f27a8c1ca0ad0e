"""reports/<device>.md/json accumulate across sessions; the verdict table's units, ratio direction, p and order."""

import json

import pytest

from pytest_llmperf.report import stored, verdict_table
from tests.test_plugin import ENGINE_TEST, project, run  # noqa: F401  (fixture)


def report_json(pytester):
    return json.loads((pytester.path / "reports" / "cpu.json").read_text())


def test_reports_keep_every_benchmark_newest_result_with_when_and_commit(project, run):  # noqa: F811
    project.makepyfile(test_other=ENGINE_TEST.replace("test_engine(", "test_other("))
    run("--llmperf-update", "test_engine.py").assert_outcomes(passed=1)
    first = report_json(project)
    first_created = first["benchmarks"][0]["measured"]["created"]
    assert "commit" in first["benchmarks"][0]["measured"]

    run("--llmperf-update", "test_other.py").assert_outcomes(passed=1)
    data = report_json(project)
    assert [b["key"] for b in data["benchmarks"]] == ["test_engine", "test_other"]
    assert {o["key"]: o["status"] for o in data["outcomes"]} == {"test_engine": "created", "test_other": "created"}
    engine = next(b for b in data["benchmarks"] if b["key"] == "test_engine")
    assert engine["measured"]["created"] == first_created  # kept, not re-stamped
    md = (project.path / "reports" / "cpu.md").read_text()
    assert "## test_engine.py::test_engine" in md and "## test_other.py::test_other" in md
    assert md.count("Measured ") >= 2

    run("test_engine.py").assert_outcomes(passed=1)  # gate one: its entry is replaced, the other kept
    data = report_json(project)
    statuses = {o["key"]: o["status"] for o in data["outcomes"]}
    assert statuses == {"test_engine": "compared", "test_other": "created"}
    assert {v["key"] for v in data["verdicts"]} == {"test_engine"}
    assert len([b for b in data["benchmarks"] if b["key"] == "test_engine"]) == 1
    md = (project.path / "reports" / "cpu.md").read_text()
    verdicts = md.split("## Verdicts")[1]
    assert "| test_other  | prefill_ms" in verdicts and "created" in verdicts and " ms " in verdicts
    assert "(higher is worse)" in verdicts and "(lower is worse)" in verdicts and "tokens/secs" in verdicts


def test_a_corrupt_previous_report_is_kept_aside_and_warned_about(project, run):  # noqa: F811
    reports = project.path / "reports"
    reports.mkdir()
    (reports / "cpu.json").write_text("{ not json")
    result = run("--llmperf-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*llmperf report: *cpu.json: not valid JSON*Moved it to *cpu.json.corrupt-*"])
    aside = list(reports.glob("cpu.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == "{ not json"
    assert report_json(project)["benchmarks"][0]["key"] == "test_engine"


def test_ratio_is_now_over_baseline_improved_shows_its_p_and_order_is_stable(project, run, monkeypatch):  # noqa: F811
    run("--llmperf-update").assert_outcomes(passed=1)
    monkeypatch.setenv("SIM_SEED", "3")
    monkeypatch.setenv("SIM_PREFILL", "0.5")  # twice as fast: prefill latency halves, throughput rises
    result = run()
    result.assert_outcomes(passed=1)
    data = report_json(project)
    rows = verdict_table.document_rows(data)
    improved = [r for r in rows if r["metric"] == "prefill_ms"]
    assert improved and all(r["verdict"] == "improved" for r in improved)
    header, table = verdict_table.table_rows(data, with_measured=True)
    by_metric = {(cells[1], cells[2]): cells for cells in table}
    cells = by_metric[("prefill_ms", "1")]
    base, now = float(cells[3].split()[0]), float(cells[4].split()[0])
    assert cells[3].endswith(" ms") and now < base
    # one ratio: the estimate the verdict rests on, with its interval; the medians' ratio is the JSON report's
    assert "Ratio of medians" not in header and header[5] == "Ratio estimate [95% CI]" and len(header) == len(cells)
    row = next(r for r in improved if r["batch_size"] == 1)
    assert cells[5] == f"{row['ratio']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] (higher is worse)"
    assert row["ratio"] < 1 and row["medians_ratio"] == pytest.approx(now / base, rel=0.01)
    p = float(cells[6].split()[0])
    assert p < 0.05 and "(improving)" in cells[6]
    tput = by_metric[("throughput_tokens_per_s", "1")]
    assert float(tput[4].split()[0]) > float(tput[3].split()[0]) and float(tput[5].split()[0]) > 1
    assert tput[5].endswith("(lower is worse)")
    order = [(c[1], c[2]) for c in table]
    assert order == [(m, bs) for m in ("prefill_ms", "decode_token_ms", "throughput_tokens_per_s")
                     for bs in ("1", "2", "4")]
    # the terminal shows the same rows in the same order
    text = result.stdout.str()
    assert text.index("| prefill_ms ") < text.index("| decode_token_ms ") < text.index("| throughput_tokens_per_s")


def test_order_is_stable_whatever_order_the_rows_come_in():
    rows = [{"key": "t", "nodeid": "m.py::t", "metric": m, "batch_size": bs, "verdict": "pass"}
            for m, bs in [("throughput_tokens_per_s", 1), ("prefill_ms", 4), ("prefill_ms", 1), ("*", 2),
                          ("decode_token_ms", 1)]]
    doc = {"benchmarks": [], "outcomes": [], "verdicts": rows}
    assert [(r["metric"], r["batch_size"]) for r in verdict_table.document_rows(doc)] == [
        ("*", 2), ("prefill_ms", 1), ("prefill_ms", 4), ("decode_token_ms", 1), ("throughput_tokens_per_s", 1)]
    reversed_doc = {**doc, "verdicts": list(reversed(rows))}
    assert verdict_table.document_rows(reversed_doc) == verdict_table.document_rows(doc)


def test_accumulate_replaces_measured_benchmarks_and_keeps_the_rest():
    def doc(created, *keys):
        return {"schema_version": 1, "device": "cpu", "created": created, "fingerprint": {"git": {"commit": created}},
                "benchmarks": [{"key": k, "nodeid": f"m.py::{k}", "batches": []} for k in keys],
                "outcomes": [{"key": k, "nodeid": f"m.py::{k}", "status": "created"} for k in keys],
                "verdicts": [], "counts": {"created": len(keys)}}

    merged = stored.accumulate(doc("t1", "a", "b"), doc("t2", "b", "c"))
    assert [(b["key"], b["measured"]["commit"]) for b in merged["benchmarks"]] == [("a", "t1"), ("b", "t2"),
                                                                                    ("c", "t2")]
    assert merged["counts"] == {"created": 2}
