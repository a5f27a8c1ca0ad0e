"""What reports/<device>.json keeps of a run (report/stored.py): its values, not its raw timings, so the file
does not grow with the tokens generated; a report written with raw runs shrinks when it is rewritten, and its
markdown shows the same tables."""

import json

import pytest

from pytest_llmperf.measure.backend import GenerationRequest
from pytest_llmperf.backends.simulated import SimulatedBackend
from pytest_llmperf.measure.metrics import run_values, summarize
from tests.test_plugin import project, run  # noqa: F401  (fixture)

LONG_TEST = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1, 4], runs=10, warmups=0, decode_length=64)
def test_long(llmperf):
    llmperf.measure(SimulatedBackend())
"""


def test_a_run_costs_the_same_bytes_however_many_tokens_it_generated(project, run):  # noqa: F811
    project.makepyfile(test_engine=LONG_TEST)
    run("--llmperf-update").assert_outcomes(passed=1)
    text = (project.path / "reports" / "cpu.json").read_text()
    data = json.loads(text)
    runs = [r for b in data["benchmarks"][0]["batches"] for r in b["runs"]]
    assert len(runs) == 20 and {r["tokens"] for r in runs} == {64, 256}
    per_run = [len(json.dumps(r, indent=1)) for r in runs]
    assert max(per_run) < 1000, per_run  # 256 token times and ids of a batch of 4 alone took ~6 KB
    assert len(text) < 60_000
    assert all(set(r) <= {"process", "values", "tokens", "gpu", "failed_requests"} for r in runs)
    outputs = data["benchmarks"][0]["batches"][1]["outputs"]
    assert len(outputs["digest"]) > 19 and outputs["sequence_0"].startswith("t100 t101")


def raw_run(sample):
    """A run as reports written before report/stored.py kept it."""
    return {**sample.to_json(), "values": run_values(sample)}


def test_a_report_with_raw_runs_is_reduced_when_rewritten_and_renders_alike(project, run):  # noqa: F811
    run("--llmperf-update").assert_outcomes(passed=1)
    path = project.path / "reports" / "cpu.json"
    data = json.loads(path.read_text())
    old = json.loads(json.dumps(data["benchmarks"][0]))
    old.update(key="test_old", nodeid="test_old.py::test_old", module="test_old.py")
    engine = SimulatedBackend(seed=7)
    samples = {bs: [engine.generate(GenerationRequest(bs, 128, 8, "hi")) for _ in range(10)] for bs in (1, 2, 4)}
    for batch in old["batches"]:
        batch["runs"] = [raw_run(s) for s in samples[batch["batch_size"]]]
        batch.pop("outputs", None)
    old.pop("run_quality", None)
    data["benchmarks"].append(old)
    data["outcomes"].append({**data["outcomes"][0], "key": "test_old", "nodeid": "test_old.py::test_old",
                             "reference": None})
    path.write_text(json.dumps(data))

    run("--llmperf-update").assert_outcomes(passed=1)  # measures test_engine; test_old is carried over
    data = json.loads(path.read_text())
    kept = next(b for b in data["benchmarks"] if b["key"] == "test_old")
    first = kept["batches"][0]["runs"][0]
    assert "token_times_ns" not in first and first["tokens"] == 8
    assert first["values"]["prefill_ms"] == pytest.approx(run_values(samples[1][0])["prefill_ms"], rel=1e-6)
    assert kept["batches"][0]["outputs"]["sequence_0"].startswith("t100")
    md = (project.path / "reports" / "cpu.md").read_text()
    section = md.split("## test_old.py::test_old", 1)[1].split("\n## ", 1)[0]
    prefill = summarize([run_values(s)["prefill_ms"] for s in samples[2]])
    assert f"| 2          | {prefill.average:.2f} ms | {prefill.lowest:.2f} ms | {prefill.highest:.2f} ms |" in section
    assert "outputs at batch size 1: sha256:" in section
