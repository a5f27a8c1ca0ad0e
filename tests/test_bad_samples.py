"""A backend whose run is no measurement (NaN or zero times, None, no token, another batch size) fails its batch
size with one line naming the backend and what it returned: never a traceback, a baseline or a report value.
A report that an older version wrote with such values (null) is read without them."""

import json

import pytest

from pytest_llmperf.measure.scenario import Scenario

BROKEN = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

class Broken(SimulatedBackend):
    def generate(self, request):
        s = super().generate(request)
        {change}
        return s

@pytest.mark.llmperf(batch_sizes=[1, 2], runs=5, warmups=0)
def test_broken(llmperf):
    llmperf.measure(Broken())

@pytest.mark.llmperf(batch_sizes=[1], runs=5, warmups=0)
def test_fine(llmperf):
    llmperf.measure(SimulatedBackend())
"""


@pytest.fixture
def run(run):
    # peak memory grows over pytester's in-process sessions: held to a tolerance that lets the timings speak
    return run.with_flags("-o", "llmperf_memory_rtol=10")


def assert_clean(result):
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text


@pytest.mark.parametrize(("change", "expected"), [
    ("s.decode_steps_ns = [float('nan')] * len(s.decode_steps_ns)",  # T3
     "Broken.generate() returned decode_steps_ns=[nan, nan, nan, nan]...: expected a list of finite times >= 0"),
    ("s.decode_steps_ns = None", "returned decode_steps_ns=[]...: expected a list of finite times >= 0"),
    ("s.counters = None", "returned counters=None: expected a mapping of counter names to numbers"),
    ("s.prefill_ns = float('inf')", "returned prefill_ns=inf: expected a finite time > 0 in ns"),
    ("s.prefill_ns = 0; s.decode_steps_ns = [0] * len(s.decode_steps_ns); s.end_to_end_ns = 0",  # T4
     "returned end_to_end_ns=0: expected a finite time > 0 in ns"),
    ("s.prefill_ns = 0", "returned prefill_ns=0: expected a finite time > 0 in ns"),
    ("s = None", "Broken.generate() returned None, not a RunSample"),  # T5
    ("s = {'batch_size': request.batch_size}", "returned dict, not a RunSample"),
    ("s.generated_tokens = 0", "returned a run that generated 0 tokens (asked: 1 x 8): no token"),  # S9
    ("s.generated_tokens = None; s.token_times_ns = [[] for _ in s.token_times_ns]",
     "returned a run that generated 0 tokens"),
    ("s.batch_size = 4", "returned a RunSample of batch size 4 for a request of batch size 1"),  # S10
    ("s.token_times_ns = s.token_times_ns * 2", "returned token_times_ns for more sequences than the batch size 1"),
    ("s.token_times_ns = [t[::-1] for t in s.token_times_ns]", "returned token_times_ns[0] going backwards"),
    ("s.counters = {'hit_rate': float('nan')}", "returned counter hit_rate=nan: expected a finite number"),
])
def test_a_run_that_measures_nothing_fails_its_batch_and_writes_no_baseline(project, run, change, expected):
    project.makepyfile(test_x=BROKEN.format(change=change))
    result = run("--llmperf-update")
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "batch size 1 failed: InvalidSample: " in text and expected in text, text
    assert "a run is a RunSample of the request's batch size with finite times and a generated token" in text
    assert_clean(result)
    baselines = [json.loads(p.read_text()) for p in (project.path / "baselines").rglob("*.json")]
    assert [sorted(b["benchmarks"]) for b in baselines] == [["test_fine"]]
    report = json.loads((project.path / "reports" / "cpu.json").read_text())
    broken = next(b for b in report["benchmarks"] if b["key"] == "test_broken")
    assert [b["status"] for b in broken["batches"]] == ["error", "error"]
    # the next session reads that report, its baselines and its index without a word
    again = run("-k", "test_fine")
    again.assert_outcomes(passed=1)
    assert_clean(again)


def test_a_report_an_older_version_wrote_with_null_values_is_read_without_them(project, run):
    """T3: NaN times written as null by a version that did not check runs; every later session died reading it."""
    project.makepyfile(test_x=BROKEN.format(change="pass"))
    run("--llmperf-update").assert_outcomes(passed=2)
    path = project.path / "reports" / "cpu.json"
    report = json.loads(path.read_text())
    broken = next(b for b in report["benchmarks"] if b["key"] == "test_broken")
    for batch in broken["batches"]:
        batch["runs"][0]["values"]["prefill_ms"] = None  # as an older version wrote NaN
        batch["runs"][1]["values"] = {k: None for k in batch["runs"][1]["values"]}
        batch["summary"]["prefill_ms"]["average"] = None
    path.write_text(json.dumps(report))
    result = run("-k", "test_fine")
    result.assert_outcomes(passed=1)
    assert_clean(result)
    kept = next(b for b in json.loads(path.read_text())["benchmarks"] if b["key"] == "test_broken")
    batch = kept["batches"][0]
    assert batch["summary"]["prefill_ms"]["n"] == 3  # 5 runs less the two that held null values
    assert len(batch["runs"]) == 3 and all(None not in run["values"].values() for run in batch["runs"])
    assert "test_broken" in (project.path / "reports" / "cpu.md").read_text()



def test_a_report_of_a_run_without_load_limit_leaves_later_sessions_whole(project, run, monkeypatch):
    """T2: --llmperf-max-load=inf wrote max_load: null; every later session that did not measure that benchmark
    again died in pytest_sessionfinish, and a regression lost its FAILURES text, summary and JUnit file."""
    slow = "SimulatedBackend(decode_slowdown=float(__import__('os').environ.get('SLOW', '1')))"
    project.makepyfile(test_x=BROKEN.format(change="pass").replace("Broken()", slow))
    run("--llmperf-update").assert_outcomes(passed=2)  # run() passes --llmperf-max-load=inf
    report = json.loads((project.path / "reports" / "cpu.json").read_text())
    assert [b["scenario"]["max_load"] for b in report["benchmarks"]] == [None, None]
    assert Scenario.from_json(report["benchmarks"][0]["scenario"]).max_load == float("inf")  # null: no limit
    monkeypatch.setenv("SLOW", "2")
    result = project.runpytest("--llmperf-device=cpu", "-p", "no:cacheprovider", "-o", "llmperf_memory_rtol=10",
                               "--llmperf-max-load=1000", "-k", "test_broken", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*decode_token_ms (decode) at batch size 1 regressed*", "*llmperf: cpu*",
                                 "*1 regressed*"])
    assert_clean(result)
    assert 'failures="1"' in (project.path / "junit.xml").read_text()
