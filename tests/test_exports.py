"""Exports checked by their real consumers: pytest-benchmark's own CLI and --benchmark-compare, and the
JUnit XML pytest writes."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.test_plugin import project, run  # noqa: F401  (fixture)

pytest.importorskip("pytest_benchmark")

GITHUB_ACTION_BENCHMARK_FIELDS = ("ops", "stddev", "mean", "rounds")  # its `pytest` reader (src/extract.ts)


def benchmark_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pytest_benchmark", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_pytest_benchmark_compare_reads_our_json_throughput_included(project):  # noqa: F811
    out = project.path / "not-yet" / "bench.json"  # pytest-benchmark would not make the folder itself
    run(project, "--llmperf-update", f"--benchmark-json={out}").assert_outcomes(passed=1)
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
    assert entries["test_engine[bs=2]:prefill_ms"]["stats"]["median"] == pytest.approx(prefill_ms / 1000, rel=1e-6)

    result = benchmark_cli("compare", str(out), "--group-by=name", cwd=project.path)
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout + result.stderr
    assert "Failed to load" not in text and "Traceback" not in text
    assert "test_engine[bs=4]:decode_token_ms" in text and "test_engine[bs=2]:throughput_tokens_per_s" in text


def test_benchmark_compare_on_a_second_run_reads_the_saved_first(project, monkeypatch):  # noqa: F811
    storage = project.path / "stored"
    run(project, "--llmperf-update", f"--benchmark-storage=file://{storage}", "--benchmark-save=first"
        ).assert_outcomes(passed=1)
    saved = list(storage.rglob("0001_first.json"))
    assert len(saved) == 1
    monkeypatch.setenv("SIM_SEED", "1")
    result = run(project, f"--benchmark-storage=file://{storage}", "--benchmark-compare=0001",
                 "--benchmark-compare-fail=median:50%")
    result.assert_outcomes(passed=1)
    text = result.stdout.str() + result.stderr.str()
    assert "Comparing against benchmarks from" in text and "Performance has regressed" not in text
    assert "test_engine[bs=1]:prefill_ms (0001_first)" in text and "test_engine[bs=1]:prefill_ms (NOW)" in text
    assert "INTERNALERROR" not in text

    # a real slowdown trips pytest-benchmark's own --benchmark-compare-fail on our entries
    monkeypatch.setenv("SIM_PREFILL", "2")
    result = run(project, "--llmperf-rtol=5", f"--benchmark-storage=file://{storage}", "--benchmark-compare=0001",
                 "--benchmark-compare-fail=median:50%")
    assert "Performance has regressed" in result.stdout.str() + result.stderr.str()
    assert "test_engine[bs=4]:prefill_ms" in result.stdout.str()


def test_junit_xml_carries_medians_ratio_and_verdict(project, monkeypatch):  # noqa: F811
    run(project, "--llmperf-update").assert_outcomes(passed=1)
    first = project.path / "created.xml"
    run(project, "--llmperf-update", f"--junitxml={first}").assert_outcomes(passed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(first).getroot().iter("property")}
    assert props["llmperf test_engine status"] == "updated"
    assert float(props["llmperf test_engine bs=2 prefill_ms median (ms)"]) > 0

    monkeypatch.setenv("SIM_SEED", "1")
    xml = project.path / "gate.xml"
    run(project, f"--junitxml={xml}").assert_outcomes(passed=1)
    case = next(ET.parse(xml).getroot().iter("testcase"))
    assert case.get("name") == "test_engine"
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["llmperf test_engine status"] == "compared"
    assert props["llmperf test_engine bs=1 prefill_ms verdict"] == "pass"
    base = float(props["llmperf test_engine bs=1 prefill_ms baseline median (ms)"])
    now = float(props["llmperf test_engine bs=1 prefill_ms now median (ms)"])
    ratio = float(props["llmperf test_engine bs=1 prefill_ms ratio now/baseline (higher is worse)"])
    assert base > 0 and now > 0 and ratio == pytest.approx(now / base, rel=0.1)
    assert "llmperf test_engine bs=4 throughput_tokens_per_s ratio now/baseline (lower is worse)" in props
