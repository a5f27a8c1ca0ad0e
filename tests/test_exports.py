"""Exports checked by their real consumers: pytest-benchmark's own CLI and --benchmark-compare, and the
JUnit XML pytest writes, validated against the xunit2 schema pytest's own tests use."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from pytest_llmperf.judge.baselines import BaselineStore
from tests.test_plugin import machine_dir, project, run  # noqa: F401  (fixture)

pytest.importorskip("pytest_benchmark")

GITHUB_ACTION_BENCHMARK_FIELDS = ("ops", "stddev", "mean", "rounds")  # its `pytest` reader (src/extract.ts)


def benchmark_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pytest_benchmark", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_pytest_benchmark_compare_reads_our_json_throughput_included(project, run):  # noqa: F811
    out = project.path / "not-yet" / "bench.json"  # pytest-benchmark would not make the folder itself
    run("--llmperf-update", f"--benchmark-json={out}").assert_outcomes(passed=1)
    document = json.loads(out.read_text())
    entries = {b["name"]: b for b in document["benchmarks"]}
    assert {"test_engine[bs=1]:prefill_ms", "test_engine[bs=4]:decode_token_ms",
            "test_engine[bs=2]:decode_tokens_per_s", "test_engine[bs=2]:throughput_tokens_per_s"} <= set(entries)
    for entry in entries.values():
        stats = entry["stats"]
        for field in ("min", "max", "mean", "stddev", "rounds", "median", "iqr", "q1", "q3", "iqr_outliers",
                      "stddev_outliers", "outliers", "ld15iqr", "hd15iqr", "ops", "total", "iterations", "data"):
            assert field in stats, (entry["name"], field)
        assert stats["rounds"] == 10 and stats["min"] <= stats["median"] <= stats["max"]
        assert all(isinstance(stats[f], (int, float)) for f in GITHUB_ACTION_BENCHMARK_FIELDS)
        assert entry["fullname"].startswith("test_engine.py::test_engine[bs=")
    # latency in seconds; throughput as seconds per token, so ops (what github-action-benchmark charts) is tokens/s
    data = json.loads((project.path / "reports" / "cpu.json").read_text())
    batch = next(b for b in data["benchmarks"][0]["batches"] if b["batch_size"] == 2)
    tokens_per_s = batch["summary"]["decode_tokens_per_s"]["p50"]
    prefill_ms = batch["summary"]["prefill_ms"]["p50"]
    throughput = entries["test_engine[bs=2]:decode_tokens_per_s"]
    assert throughput["extra_info"]["unit"] == "s/token" and throughput["extra_info"]["metric_better"] == "higher"
    assert throughput["stats"]["ops"] == pytest.approx(tokens_per_s, rel=0.05)
    # the report keeps 6 significant digits of each run's value (report/stored.py)
    assert entries["test_engine[bs=2]:prefill_ms"]["stats"]["median"] == pytest.approx(prefill_ms / 1000, rel=1e-5)

    result = benchmark_cli("compare", str(out), "--group-by=name", cwd=project.path)
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout + result.stderr
    assert "Failed to load" not in text and "Traceback" not in text
    assert "test_engine[bs=4]:decode_token_ms" in text and "test_engine[bs=2]:throughput_tokens_per_s" in text


def test_benchmark_compare_on_a_second_run_reads_the_saved_first(project, run, monkeypatch):  # noqa: F811
    storage = project.path / "stored"
    run("--llmperf-update", f"--benchmark-storage=file://{storage}", "--benchmark-save=first"
        ).assert_outcomes(passed=1)
    saved = list(storage.rglob("0001_first.json"))
    assert len(saved) == 1
    monkeypatch.setenv("SIM_SEED", "1")
    result = run(f"--benchmark-storage=file://{storage}", "--benchmark-compare=0001",
                 "--benchmark-compare-fail=median:50%")
    result.assert_outcomes(passed=1)
    text = result.stdout.str() + result.stderr.str()
    assert "Comparing against benchmarks from" in text and "Performance has regressed" not in text
    assert "test_engine[bs=1]:prefill_ms (0001_first)" in text and "test_engine[bs=1]:prefill_ms (NOW)" in text
    assert "INTERNALERROR" not in text

    # a real slowdown trips pytest-benchmark's own --benchmark-compare-fail on our entries
    monkeypatch.setenv("SIM_PREFILL", "2")
    result = run("--llmperf-rtol=5", f"--benchmark-storage=file://{storage}", "--benchmark-compare=0001",
                 "--benchmark-compare-fail=median:50%")
    assert "Performance has regressed" in result.stdout.str() + result.stderr.str()
    assert "test_engine[bs=4]:prefill_ms" in result.stdout.str()


# pytest's own schema for junit_family=xunit2 (Jenkins' junit-10.xsd), as pytest's tests validate with it
JUNIT_SCHEMA = Path(__file__).parent / "data" / "junit-10.xsd"
PREFIX = "llmperf test_engine.py::test_engine"


def valid_xunit2(path):
    xmlschema.XMLSchema(str(JUNIT_SCHEMA)).validate(str(path))  # raises XMLSchemaValidationError, naming the element
    return ET.parse(path).getroot()


def suite_properties(root):
    suite = root.find("testsuite")
    return {p.get("name"): p.get("value") for p in suite.find("properties").iter("property")}


def test_junit_xml_is_valid_xunit2_with_the_results_as_testsuite_properties(project, run, monkeypatch):  # noqa: F811
    xml = project.path / "created.xml"
    run("--llmperf-update", f"--junitxml={xml}").assert_outcomes(passed=1)
    props = suite_properties(valid_xunit2(xml))
    assert props[f"{PREFIX} outcome"] == "created" and props[f"{PREFIX} not judged because"] == "baseline written"
    assert float(props[f"{PREFIX} bs=2 prefill_ms median (ms)"]) > 0

    monkeypatch.setenv("SIM_SEED", "1")
    xml = project.path / "gate.xml"
    result = run(f"--junitxml={xml}")
    result.assert_outcomes(passed=1)
    assert "record_property" not in result.stdout.str()  # pytest's own warning about testcase properties
    root = valid_xunit2(xml)
    case = next(root.iter("testcase"))
    assert case.get("name") == "test_engine" and case.find("properties") is None
    assert float(case.get("time")) > 0
    props = suite_properties(root)
    assert props[f"{PREFIX} outcome"] in ("passed", "improved") and f"{PREFIX} not judged because" not in props
    assert props[f"{PREFIX} bs=1 prefill_ms verdict"] == "pass"
    base = float(props[f"{PREFIX} bs=1 prefill_ms baseline median (ms)"])
    now = float(props[f"{PREFIX} bs=1 prefill_ms now median (ms)"])
    ratio = float(props[f"{PREFIX} bs=1 prefill_ms ratio now/baseline (medians, higher is worse)"])
    hl = float(props[f"{PREFIX} bs=1 prefill_ms estimated ratio now/baseline (higher is worse)"])
    low, high = map(float, props[f"{PREFIX} bs=1 prefill_ms estimated ratio 95% CI"].split(" to "))
    assert base > 0 and now > 0 and ratio == pytest.approx(now / base, rel=1e-5) and low <= hl <= high
    # the terminal's table shows one ratio, the estimate the verdict rests on; the JUnit properties name both
    row = next(line for line in result.stdout.lines if line.startswith("| test_engine | prefill_ms  ")
               and "| 1 " in line)
    cells = [c.strip() for c in row.split("|")]
    assert f"{hl:.3f} [{low:.3f}, {high:.3f}] (higher is worse)" in cells and f"{ratio:.3f} (higher is worse)" not in cells
    assert f"{PREFIX} bs=4 throughput_tokens_per_s ratio now/baseline (medians, lower is worse)" in props


def test_junit_xunit1_keeps_the_properties_on_the_testcase(project, run):  # noqa: F811
    run("--llmperf-update").assert_outcomes(passed=1)
    xml = project.path / "x1.xml"
    run("-o", "junit_family=xunit1", f"--junitxml={xml}").assert_outcomes(passed=1)
    root = ET.parse(xml).getroot()
    assert root.find("testsuite").find("properties") is None
    case = next(root.iter("testcase"))
    props = {p.get("name"): p.get("value") for p in case.find("properties").iter("property")}
    assert props[f"{PREFIX} outcome"] == "passed" and props[f"{PREFIX} bs=2 decode_token_ms verdict"] == "pass"


def test_junit_says_refused_when_every_row_was_refused(project, run):  # noqa: F811
    run("--llmperf-update").assert_outcomes(passed=1)
    store = BaselineStore.at(machine_dir(project))
    entry = store.get("test_engine.py", "test_engine")
    entry.foreign_load = {bs: 5.0 for bs in (1, 2, 4)}  # recorded while other work kept 5 cores busy
    store.write("test_engine.py", entry)
    xml = project.path / "busy.xml"
    result = run("--llmperf-max-load=1", f"--junitxml={xml}")
    result.assert_outcomes(passed=1)  # refused is not listed in --llmperf-fail-on by default
    props = suite_properties(valid_xunit2(xml))
    assert props[f"{PREFIX} outcome"] == "refused"
    assert props[f"{PREFIX} not judged because"] in ("baseline from a busy machine", "machine busy")
    verdicts = [v for k, v in props.items() if k.endswith(" verdict")]
    assert verdicts and all(v.startswith("refused: ") for v in verdicts)


def test_junit_time_of_a_test_measured_in_worker_processes_is_its_runs(project, run, monkeypatch):  # noqa: F811
    monkeypatch.setenv("PYTEST_ADDOPTS", "--llmperf-processes=2")
    xml = project.path / "workers.xml"
    # the call's duration alone: by default a testcase's time also holds its setup and teardown (a few ms here,
    # which a loaded machine pushed past the tolerance below)
    run("--llmperf-update", f"--junitxml={xml}", "-o", "junit_duration_report=call").assert_outcomes(passed=1)
    case = next(valid_xunit2(xml).iter("testcase"))
    report = json.loads((project.path / "reports" / "cpu.json").read_text())
    runs = [r for b in report["benchmarks"][0]["batches"] for r in b["runs"]]
    assert {r["process"] for r in runs} == {1, 2, 3, 4}  # an update records twice --llmperf-processes
    assert float(case.get("time")) == pytest.approx(sum(r["values"]["e2e_ms"] for r in runs) / 1000, abs=2e-3)


def test_junit_properties_of_benchmarks_measured_in_worker_processes_sit_beside_the_users_own(project, run,  # noqa: F811
                                                                                               monkeypatch):
    # the tests measured in workers have no fixtures in this process
    monkeypatch.setenv("PYTEST_ADDOPTS", "--llmperf-processes=2")
    project.makepyfile(test_own="def test_own(record_testsuite_property):\n"
                                "    record_testsuite_property('mine', 'kept')\n")
    xml = project.path / "workers.xml"
    run("--llmperf-update", f"--junitxml={xml}").assert_outcomes(passed=2)
    props = suite_properties(valid_xunit2(xml))
    assert props["mine"] == "kept" and props[f"{PREFIX} outcome"] == "created"
    assert float(props[f"{PREFIX} bs=2 prefill_ms median (ms)"]) > 0
    assert all(case.find("properties") is None for case in ET.parse(xml).getroot().iter("testcase"))

    from pytest_llmperf.report.exports import add_suite_properties

    add_suite_properties(xml, [("llmperf note", "a server's \x1b[31mred\x1b[0m")])  # XML 1.0 cannot hold ESC
    props = suite_properties(valid_xunit2(xml))
    assert props["llmperf note"] == "a server's #x1B[31mred#x1B[0m" and props["mine"] == "kept"
