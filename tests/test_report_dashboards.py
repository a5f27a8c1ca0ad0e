"""--llmperf-export: github-action-benchmark's custom files and Bencher's BMF, checked against the rules of
each consumer's own parser (read in their sources, cited below) and against the report's own numbers."""

import json
import math
import re
import uuid

import numpy as np
import pytest

from pytest_llmperf.measure.metrics import METRICS
from tests.test_plugin import project, run  # noqa: F401  (fixture)

EXPORT = "--llmperf-export=github-action-benchmark,bencher"


def check_github_action_benchmark(entries, tool):
    """benchmark-action/github-action-benchmark (commit c38cce9), src/extract.ts: a custom tool's file is
    `BenchmarkResults.parse(JSON.parse(output))`, an array of z.object({name: z.coerce.string(), value:
    z.coerce.number(), range: z.coerce.string().optional(), unit: z.coerce.string(), extra:
    z.coerce.string().optional()}); an empty array fails the step ("No benchmark result was found");
    src/write.ts pairs an entry with the previous commit's by `name`, and compares `value`s bigger- or
    smaller-is-better by the tool; src/normalizeValueByUnit.ts rescales only between s/ms/us/ns (and /iter,
    ops/ units), so a unit must stay the metric's own from commit to commit."""
    assert isinstance(entries, list) and entries, "the action fails on an empty file"
    names = [e["name"] for e in entries]
    assert len(set(names)) == len(names), "entries are paired across commits by name"
    for entry in entries:
        assert set(entry) <= {"name", "value", "range", "unit", "extra"}, entry
        assert isinstance(entry["name"], str) and entry["name"]
        # z.coerce.number() turns null into 0 and a string into a number: only a finite JSON number is honest
        assert isinstance(entry["value"], (int, float)) and math.isfinite(entry["value"]), entry
        assert isinstance(entry["unit"], str) and entry["unit"] not in ("", "iter/sec")
        assert all(isinstance(entry.get(k, ""), str) for k in ("range", "extra"))
        metric = entry["name"].rsplit(" ", 1)[1]
        better = METRICS[metric].better
        assert (better == "higher") == (tool == "customBiggerIsBetter"), (tool, metric)


def check_bencher_metric_format(bmf):
    """bencherdev/bencher (commit 8d75325): lib/bencher_adapter/src/adapters/json.rs parses the file with
    serde into AdapterResults = HashMap<BenchmarkNameId, HashMap<MeasureNameId, JsonNewMetric>>.
    A NameId is tried as a UUID, then a slug (lib/bencher_valid/src/slug.rs: at most 64 characters and equal
    to its slugify, i.e. lowercase letters, digits and hyphens), then a name: a BenchmarkName is non-empty and
    at most 1024 bytes (benchmark_name.rs), a measure's ResourceName non-empty, trimmed and at most 64 bytes
    (lib.rs is_valid_len). A measure name Bencher does not know is created with a generic unit; the names of
    its built-in measures (Latency: nanoseconds, Throughput: operations / second, ...; lib/bencher_json/src/
    project/measure/built_in.rs) must be avoided, since ms would be read as ns. JsonNewMetric (lib/
    bencher_json/src/project/metric/mod.rs): value f64, lower_value and upper_value optional f64."""
    assert isinstance(bmf, dict) and bmf
    builtin = {"latency", "throughput", "build-time", "file-size", "allocated", "instructions"}

    def not_uuid_nor_slug(text):
        try:
            uuid.UUID(text)
            return False
        except ValueError:
            return not (len(text) <= 64 and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", text))

    for benchmark, measures in bmf.items():
        assert not_uuid_nor_slug(benchmark) and 0 < len(benchmark.encode()) <= 1024, benchmark
        assert isinstance(measures, dict) and measures
        for measure, metric in measures.items():
            assert not_uuid_nor_slug(measure) and measure == measure.strip() and 0 < len(measure.encode()) <= 64
            assert measure.split(" ")[0].lower() not in builtin and re.fullmatch(r"\S+ \([^)]+\)", measure), measure
            assert set(metric) <= {"value", "lower_value", "upper_value"} and "value" in metric
            for key, value in metric.items():
                assert isinstance(value, (int, float)) and math.isfinite(value), (benchmark, measure, key)
            assert metric["lower_value"] <= metric["value"] <= metric["upper_value"]


def test_exports_pass_their_consumers_rules_with_the_reports_numbers(project, run):  # noqa: F811
    result = run("--llmperf-update", EXPORT)
    result.assert_outcomes(passed=1)
    reports = project.path / "reports"
    smaller = json.loads((reports / "cpu.customSmallerIsBetter.json").read_text())
    bigger = json.loads((reports / "cpu.customBiggerIsBetter.json").read_text())
    bmf = json.loads((reports / "cpu.bmf.json").read_text())
    for path in ("cpu.customSmallerIsBetter.json", "cpu.customBiggerIsBetter.json", "cpu.bmf.json"):
        result.stdout.fnmatch_lines([f"report: {reports / path}"])
    check_github_action_benchmark(smaller, "customSmallerIsBetter")
    check_github_action_benchmark(bigger, "customBiggerIsBetter")
    check_bencher_metric_format(bmf)

    report = json.loads((reports / "cpu.json").read_text())
    batches = {b["batch_size"]: b for b in report["benchmarks"][0]["batches"]}
    by_name = {e["name"]: e for e in smaller + bigger}
    for bs in (1, 2, 4):
        values = {m: [r["values"][m] for r in batches[bs]["runs"]] for m in ("prefill_ms", "throughput_tokens_per_s")}
        prefill = by_name[f"cpu test_engine.py::test_engine bs={bs} prefill_ms"]
        assert prefill["unit"] == "ms" and prefill["value"] == pytest.approx(np.median(values["prefill_ms"]), rel=1e-5)
        tput = by_name[f"cpu test_engine.py::test_engine bs={bs} throughput_tokens_per_s"]
        assert tput["unit"] == "tokens/s"
        assert tput["value"] == pytest.approx(np.median(values["throughput_tokens_per_s"]), rel=1e-5)
        measures = bmf[f"test_engine.py::test_engine bs={bs}"]
        low, high = np.percentile(values["prefill_ms"], [25, 75])
        assert measures["prefill_ms (ms)"] == pytest.approx({"value": np.median(values["prefill_ms"]),
                                                              "lower_value": low, "upper_value": high}, rel=1e-5)
        assert "throughput_tokens_per_s (tokens/s)" in measures and "peak_rss_mib (MiB)" in measures
    # the gated metrics, end-to-end throughput and peak memory: nothing else
    assert {e["name"].rsplit(" ", 1)[1] for e in smaller} == {"prefill_ms", "decode_token_ms", "peak_rss_mib"}
    assert {e["name"].rsplit(" ", 1)[1] for e in bigger} == {"throughput_tokens_per_s"}


def test_export_is_off_by_default_and_set_by_the_ini_key(project, run):  # noqa: F811
    def exports():  # history.json is the history's analysis (docs/history.md), written by every job
        return sorted(p.name for p in (project.path / "reports").glob("*.json") if p.name != "history.json")

    run("--llmperf-update").assert_outcomes(passed=1)
    assert exports() == ["cpu.json"]
    project.makeini("[pytest]\nllmperf_export = bencher\n")
    run("--llmperf-update").assert_outcomes(passed=1)
    assert exports() == ["cpu.bmf.json", "cpu.json"]


def test_a_bad_export_value_is_a_usage_error_naming_the_option(project, run):  # noqa: F811
    result = run("--llmperf-export=github")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*bad value for --llmperf-export: expected a comma list out of "
                                 "github-action-benchmark, bencher (or none), got 'github'*"])
