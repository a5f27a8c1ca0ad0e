"""`python -m pytest_llmperf report`: a real cpu report (simulated backend, run through pytester) and a
fabricated a100 one merge into one side-by-side report."""

import copy
import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from pytest_llmperf.report.stored import ReportError
from pytest_llmperf.report.cross_target import merge_reports
from tests.test_plugin import project, run  # noqa: F401  (fixture)


@pytest.fixture
def two_targets(project, run, tmp_path):  # noqa: F811
    run("--llmperf-update").assert_outcomes(passed=1)
    cpu = json.loads((project.path / "reports" / "cpu.json").read_text())
    a100 = copy.deepcopy(cpu)
    a100["device"] = "a100"
    for benchmark in a100["benchmarks"]:
        for batch in benchmark["batches"]:
            if batch["batch_size"] == 4:
                batch.update(status="oom", error="OutOfMemory: CUDA out of memory", runs=[], summary={})
            for summary in batch["summary"].values():
                for name in ("p50", "average", "lowest", "highest"):
                    if summary.get(name) is not None:
                        summary[name] = summary[name] / 10  # a faster target
    paths = [tmp_path / "cpu" / "cpu.json", tmp_path / "a100" / "a100.json"]
    for path, doc in zip(paths, (cpu, a100)):
        path.parent.mkdir()
        path.write_text(json.dumps(doc))
    return paths, cpu


def test_cli_merges_targets_side_by_side_and_keeps_oom(two_targets, tmp_path):
    paths, cpu = two_targets
    out = tmp_path / "merged"
    result = subprocess.run([sys.executable, "-m", "pytest_llmperf", "report", *map(str, paths), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "merged 2 report(s) (cpu, a100), 1 benchmark(s)" in result.stdout
    md = (out / "merged.md").read_text()
    cpu_batch = {b["batch_size"]: b for b in cpu["benchmarks"][0]["batches"]}
    prefill_1 = cpu_batch[1]["summary"]["prefill_ms"]["p50"]
    tput_4 = cpu_batch[4]["summary"]["throughput_tokens_per_s"]["p50"]
    assert "| Batch Size | cpu   | a100  |" in md
    assert f"| 1          | {prefill_1:.4g} | {prefill_1 / 10:.4g} |" in md
    assert f"| 4          | {tput_4:.4g} | oom   |" in md
    for heading in ("Prefill: prefill_ms (ms, lower is better)", "Decode (token): decode_token_ms",
                    "Throughput: throughput_tokens_per_s (tokens/secs, higher is better)", "### cpu", "### a100"):
        assert heading in md
    merged = json.loads((out / "merged.json").read_text())
    assert [t["label"] for t in merged["targets"]] == ["cpu", "a100"]
    rows = merged["benchmarks"][0]["tables"][0]["rows"]
    assert rows["4"]["a100"] == {"cell": "oom", "median": None}
    assert rows["1"]["cpu"]["median"] == pytest.approx(prefill_1)
    assert set(merged["reports"]) == {"cpu", "a100"}
    page = (out / "index.html").read_text()  # the targets' plots on one page (browser-tested in test_html_report)
    assert f"wrote {out / 'index.html'}" in result.stdout and page.count("<svg") >= 2
    assert "a100" in page and "cpu" in page


def test_merge_returns_the_documents_and_the_out_dir(two_targets, tmp_path):
    paths, _ = two_targets
    merged = merge_reports(paths, tmp_path / "out")
    assert [d["device"] for d in merged.documents] == ["cpu", "a100"]
    assert merged.out_dir == tmp_path / "out" and all(p.exists() for p in merged.written)


@pytest.mark.parametrize("content, message", [
    (None, "missing.json: no such file"),
    ("{ broken", "missing.json: not valid JSON (line 1"),
    ('{"benchmarks": []}', "missing.json: not a pytest-llmperf report"),
    ('{"schema_version": 1, "device": "x", "benchmarks": [{"key": "t"}]}', "missing.json: benchmarks[0] is damaged"),
])
def test_bad_input_is_a_clear_error_naming_the_file(two_targets, tmp_path, content, message):
    paths, _ = two_targets
    bad = tmp_path / "missing.json"
    if content is not None:
        bad.write_text(content)
    with pytest.raises(ReportError, match="missing.json"):
        merge_reports([paths[0], bad], tmp_path / "out")
    result = subprocess.run([sys.executable, "-m", "pytest_llmperf", "report", str(paths[0]), str(bad)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "reports" / "merged").exists()


def test_console_script_is_declared():
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts.get("pytest-llmperf") == "pytest_llmperf.cli:main"


def test_two_reports_of_one_device_from_different_folders_get_distinct_labels(two_targets, tmp_path):
    paths, cpu = two_targets
    other = tmp_path / "runner-b" / "cpu.json"
    other.parent.mkdir()
    other.write_text(paths[0].read_text())
    merged = merge_reports([paths[0], other], tmp_path / "out")
    labels = [t["label"] for t in merged.document["targets"]]
    assert labels == ["cpu (cpu/cpu.json)", "cpu (runner-b/cpu.json)"]
    assert set(merged.document["reports"]) == set(labels)  # both kept, neither overwrote the other
    md = (tmp_path / "out" / "merged.md").read_text()
    assert "| Batch Size | cpu (cpu/cpu.json) | cpu (runner-b/cpu.json) |" in md
    assert "### cpu (cpu/cpu.json)" in md and "### cpu (runner-b/cpu.json)" in md


def test_a_report_given_twice_is_a_clear_error(two_targets, tmp_path):
    paths, _ = two_targets
    with pytest.raises(ReportError, match="given twice"):
        merge_reports([paths[0], paths[0].parent / ".." / "cpu" / "cpu.json"], tmp_path / "out")
