"""Baselines a reviewer reads (schema 3): what the gate tests, one line per metric and batch size; the raw runs go
to the report. A schema-2 file is never rewritten in passing: the error names `pytest-llmperf migrate-baselines`,
which converts it without measuring, and the gate reads what it wrote (the committed baselines/ sets too)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_llmperf.backends.simulated import SimulatedBackend
from pytest_llmperf.judge.baseline_layout import render
from pytest_llmperf.judge.baselines import SCHEMA_VERSION, BaselineEntry, BaselineStore
from pytest_llmperf.judge.fingerprint import fingerprint
from pytest_llmperf.measure import runner
from pytest_llmperf.measure.records import BenchmarkResult
from pytest_llmperf.measure.scenario import Scenario
from pytest_llmperf.report.html import baseline_points
from tests.test_html_report import git
from tests.test_plugin import baseline_file, project, run  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]
#: Batch sizes 1 and 2 of the seed-000 bloom entry of baselines/cpu/intel-xeon-f6-m207-s2-avx512fp16 as main stored
#: it in schema 2 (commit 390bf1f): 8 worker processes, 5 runs each, every run of every metric.
SCHEMA_2 = ROOT / "tests" / "data" / "baseline_schema2_seed000.json"
NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


def measured(key, seed, *, processes=8, runs=10, batch_sizes=(1, 2)):
    """One benchmark as `processes` worker processes measure it: the runner on the simulated engine, each part
    carrying its process index, merged as the controller merges them."""
    parts = []
    for index in range(1, processes + 1):
        result = runner.measure(SimulatedBackend(seed=seed * 100 + index), Scenario(batch_sizes=batch_sizes, runs=runs,
                                warmups=0), key=key, nodeid=f"test_x.py::{key}", module="test_x.py")
        for batch in result.batches:
            for sample in batch.samples:
                sample.process = index
        parts.append(result)
    return BenchmarkResult.merge(parts)


def record(directory, seed, commit, created, keys=("test_a", "test_b")):
    store = BaselineStore(directory, "cpu", "m1")
    stamp = {**fingerprint(ROOT), "git": {"commit": commit, "dirty": False}}
    for key in keys:
        path = store.write("test_x.py", BaselineEntry.of_result(measured(key, seed), fingerprint=stamp,
                                                                created=created))
    return path


@pytest.mark.slow
def test_two_tests_at_two_batch_sizes_take_at_most_150_lines_one_per_metric(tmp_path):
    path = record(tmp_path, 1, "a" * 40, "2026-01-01T00:00:00+00:00")
    lines = path.read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    entries = BaselineStore(tmp_path, "cpu", "m1").entries("test_x.py")
    metrics = set(entries["test_a"].values[1])
    assert len(metrics) >= 15  # every metric the runs measured, not just the gated ones
    for metric in metrics:
        assert sum(line.strip().startswith(f'"{metric}": [') for line in lines) == 4  # 2 tests x 2 batch sizes
    for entry in entries.values():
        for bs in (1, 2):
            assert set(entry.values[bs]) == metrics and entry.counts[bs] == [10] * 8  # the runs each process took
            assert all(len(v) == 8 for v in entry.values[bs].values())  # one median per process
    entry = entries["test_a"]
    report_runs = measured("test_a", 1).batch(1).samples
    medians = [np.median([s.prefill_ns * 1e-6 for s in report_runs if s.process == p]) for p in range(1, 9)]
    assert entry.values[1]["prefill_ms"] == pytest.approx(medians, rel=1e-5)


@pytest.mark.slow
def test_a_re_record_of_unchanged_code_changes_only_numbers_line_by_line(tmp_path):
    before = record(tmp_path / "a", 1, "a" * 40, "2026-01-01T00:00:00+00:00").read_text().splitlines()
    after = record(tmp_path / "b", 2, "b" * 40, "2026-02-01T00:00:00+00:00").read_text().splitlines()
    assert len(before) == len(after)
    changed = [(was, now) for was, now in zip(before, after) if was != now]
    assert len(changed) > 30  # other seeds: other timings
    for was, now in changed:
        if '"git"' in was or '"created"' in was:  # the recording's stamps
            continue
        assert NUMBER.sub("#", was) == NUMBER.sub("#", now), (was, now)


def test_the_committed_sets_are_schema_3_and_read_by_the_store():
    files = sorted((ROOT / "baselines").rglob("*.json"))
    assert files
    for path in files:
        data = json.loads(path.read_text())
        assert data["schema_version"] == SCHEMA_VERSION, path
        store = BaselineStore.at(path.parents[1])
        entries = store.entries(data["module"])
        assert entries and set(entries) == set(data["benchmarks"])
        for entry in entries.values():
            for bs, values in entry.values.items():
                assert all(len(v) == len(entry.counts[bs]) for v in values.values())  # one median per process
        if "seed000" in path.name:
            assert len(path.read_text().splitlines()) <= 400


def test_the_committed_seed_000_sets_at_two_batch_sizes_take_at_most_150_lines():
    """Real data: two tests of the HF backend (14-16 metrics, 8 processes), cut to two batch sizes."""
    for path in (ROOT / "baselines" / "cpu").glob("*/benchmarks/test_seed000_prefill_decode.json"):
        data = json.loads(path.read_text())
        assert len(data["benchmarks"]) == 2
        for entry in data["benchmarks"].values():
            for part in ("batches", "values"):
                entry[part] = {bs: v for bs, v in entry[part].items() if bs in ("1", "2")}
        assert len(render(data).splitlines()) <= 150, path


def test_schema_2_is_reduced_to_what_the_gate_tests_by_the_one_parser():
    data = json.loads(SCHEMA_2.read_text())
    raw = data["benchmarks"]["test_prefill_decode[bloom]"]
    entry = BaselineEntry.from_json("test_prefill_decode[bloom]", raw)
    for bs in (1, 2):
        runs = raw["batches"][str(bs)]["runs"]
        assert entry.values[bs]["prefill_ms"] == [float(np.median(r)) for r in runs["prefill_ms"]]
        assert entry.counts[bs] == [len(r) for r in runs["prefill_ms"]] == [5] * 8
        assert entry.outputs[bs] == raw["batches"][str(bs)]["outputs"]["digest"]
    assert entry.git_commit == raw["git_commit"] and entry.unit == "process"


def migrate(*paths):
    return subprocess.run([sys.executable, "-m", "pytest_llmperf", "migrate-baselines", *map(str, paths)],
                          capture_output=True, text=True)


@pytest.mark.slow
def test_migrate_converts_a_set_once_and_leaves_what_it_cannot_convert(tmp_path):
    target = tmp_path / "cpu" / "m207" / "benchmarks" / "test_seed000_prefill_decode.json"
    target.parent.mkdir(parents=True)
    target.write_text(SCHEMA_2.read_text())
    old = tmp_path / "cpu" / "m207" / "old.json"
    old.write_text(json.dumps({"schema_version": 1, "device": "cpu", "module": "benchmarks/old.py", "benchmarks": {}}))
    done = migrate(tmp_path / "cpu")
    assert done.returncode == 2, done.stderr
    assert f"{target}: converted: 1 entries, 2287 -> " in done.stdout
    assert (f"{old} holds per-run values of one process (schema 1)" in done.stderr and "Re-record it on its machine: "
            "pytest benchmarks/old.py --llmperf-device=cpu --llmperf-update" in done.stderr)
    assert json.loads(old.read_text())["schema_version"] == 1  # left as it was
    converted = json.loads(target.read_text())
    assert converted["schema_version"] == 3 and converted["machine"] == "intel-xeon-f6-m207-s2-avx512fp16"
    assert len(target.read_text().splitlines()) < 80
    entry = BaselineStore.at(target.parents[1]).get("benchmarks/test_seed000_prefill_decode.py",
                                                    "test_prefill_decode[bloom]")
    expected = BaselineEntry.from_json("test_prefill_decode[bloom]",
                                       json.loads(SCHEMA_2.read_text())["benchmarks"]["test_prefill_decode[bloom]"])
    for bs in (1, 2):
        for metric, values in expected.values[bs].items():
            assert entry.values[bs][metric] == pytest.approx(values, rel=1e-5)
    assert entry.outputs == expected.outputs and entry.fingerprint == expected.fingerprint
    again = migrate(target)
    assert again.returncode == 0 and "already in the current schema, left as it is" in again.stdout
    missing = migrate(tmp_path / "nowhere")
    assert missing.returncode == 2 and "no such file or directory" in missing.stderr


def as_schema_2(path):
    """The file as the schema-2 writer stored the same runs (a baseline measured in one process keeps them all)."""
    data = json.loads(path.read_text())
    for entry in data["benchmarks"].values():
        values = entry.pop("values")
        entry["git_commit"] = entry["fingerprint"]["git"]["commit"]
        for bs, batch in entry["batches"].items():
            batch.pop("runs_per_process")
            batch["runs"] = {m: [v] for m, v in values[bs].items()}
            batch["processes"] = {m: [float(np.median(v))] for m, v in values[bs].items()}
            batch.pop("outputs", None)
    data["schema_version"] = 2
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


@pytest.mark.parametrize("update", [False, True], ids=["gate", "update"])
def test_a_schema_2_file_names_the_migration_and_is_never_rewritten_in_passing(project, run, update):  # noqa: F811
    run("--llmperf-update").assert_outcomes(passed=1)
    path = baseline_file(project)
    as_schema_2(path)
    before = path.read_bytes()
    result = run(*(["--llmperf-update"] if update else []))
    result.assert_outcomes(failed=1)
    text = " ".join(result.stdout.str().split())
    assert (f"baseline file {path} is in the format of schema 2" in text and "Convert the set once, without "
            f"measuring, and commit the result: pytest-llmperf migrate-baselines {path.parent}" in text), text
    assert path.read_bytes() == before
    done = migrate(path.parent)
    assert done.returncode == 0 and "1 file(s) converted" in done.stdout, done.stderr
    gated = run()
    gated.assert_outcomes(passed=1)
    gated.stdout.fnmatch_lines(["llmperf: judged 1 of 1 benchmarks", "1 passed*"])


@pytest.mark.slow
def test_the_history_reads_a_schema_2_version_and_its_conversion_as_one_point(tmp_path):
    target = tmp_path / "baselines" / "cpu" / "m207" / "benchmarks" / "test_seed000_prefill_decode.json"
    target.parent.mkdir(parents=True)
    target.write_text(SCHEMA_2.read_text())
    git(tmp_path, "init", "-q", ".")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "schema 2")
    assert migrate(target).returncode == 0
    git(tmp_path, "commit", "-qam", "converted")
    points = baseline_points(target, "test_prefill_decode[bloom]", [1, 2], ["prefill_ms"], {})
    assert len(points) == 1  # the conversion measured nothing: same commit and date, no new point
    runs = json.loads(SCHEMA_2.read_text())["benchmarks"]["test_prefill_decode[bloom]"]["batches"]["1"]["runs"]
    assert points[0].medians[1]["prefill_ms"] == pytest.approx(np.median([np.median(r) for r in runs["prefill_ms"]]))
    assert points[0].label.startswith("ffa764c ")
