"""What a test's llmperf markers mean when there are several (S1), a tolerance for a metric that is not gated (S2),
a benchmark test that never measures (S8) and a marker `processes` that is not a count (T1): each is used as
documented or refused with a line naming it, never dropped in silence."""

import json

import pytest


@pytest.fixture
def run(run):
    # peak memory grows over pytester's in-process sessions: held to a tolerance that lets the timings speak
    return run.with_flags("-o", "llmperf_memory_rtol=10")


def assert_clean(result):
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text


def stored(pytester):
    """{key: {batch size: metrics}} of every baseline written."""
    found = {}
    for path in (pytester.path / "baselines").rglob("*.json"):
        for key, entry in json.loads(path.read_text())["benchmarks"].items():
            found[key] = {int(bs): sorted(values) for bs, values in entry["values"].items()}
    return found


MERGED = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

pytestmark = pytest.mark.llmperf(batch_sizes=[1, 2], runs=5, warmups=0)

def test_module(llmperf):
    llmperf.measure(SimulatedBackend())

@pytest.mark.llmperf(metrics=["prefill_ms"])
def test_own(llmperf):
    llmperf.measure(SimulatedBackend())

class TestClass:
    pytestmark = pytest.mark.llmperf(batch_sizes=[4])

    @pytest.mark.llmperf(metrics=["decode_token_ms"])
    def test_method(self, llmperf):
        llmperf.measure(SimulatedBackend())

@pytest.mark.llmperf(batch_sizes=[2])
@pytest.mark.parametrize("case", [1, pytest.param(3, marks=pytest.mark.llmperf(batch_sizes=[3]))])
def test_case(llmperf, case):
    llmperf.measure(SimulatedBackend())
"""


def test_markers_of_module_class_test_and_case_merge_the_nearest_winning(project, run):
    project.makepyfile(test_x=MERGED)
    result = run("--llmperf-update")
    result.assert_outcomes(passed=5)
    assert_clean(result)
    found = stored(project)
    assert {key: sorted(batches) for key, batches in found.items()} == {
        "test_module": [1, 2], "test_own": [1, 2], "TestClass::test_method": [4], "test_case[1]": [2],
        "test_case[3]": [3]}
    # the gated metrics of a nearer marker, the batch sizes of a farther one: each keyword from its nearest marker
    gate = run()
    gate.assert_outcomes(passed=5)
    rows = {line.split("|")[1].strip() + ":" + line.split("|")[2].strip() for line in gate.stdout.lines
            if line.startswith("| test") or line.startswith("| TestClass")}
    assert {"test_own:prefill_ms", "TestClass::test_method:decode_token_ms"} <= rows
    assert "test_own:decode_token_ms" not in rows


def test_two_markers_on_one_test_that_disagree_are_refused_naming_both(project, run):
    project.makepyfile(test_x="""
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(runs=5)
@pytest.mark.llmperf(runs=10, warmups=0)
def test_twice(llmperf):
    llmperf.measure(SimulatedBackend())
""")
    result = run("--llmperf-update")
    result.assert_outcomes(errors=1)  # refused at setup: nothing measured
    result.stdout.fnmatch_lines(["*two @pytest.mark.llmperf markers on the test give runs two values (* and *); "
                                 "keep one of them*"])
    assert stored(project) == {}
    assert_clean(result)


@pytest.mark.parametrize(("rtol", "expected"), [
    ('{"decod_token_ms": 0.5}', "rtol: unknown metric(s) decod_token_ms for the simulated backend (a typo would "
                                "leave the default tolerance in place); known: prefill_ms, decode_token_ms"),
    ('{"decode_total_ms": 0.5, "default": 0.1}', "rtol names decode_total_ms, which this test does not gate (it gates "
                                                 "prefill_ms, decode_token_ms, throughput_tokens_per_s;"),
    ('{"peak_rss_mib": 0.5}', "rtol names peak_rss_mib, which this test does not gate"),
])
def test_a_tolerance_for_a_metric_that_is_not_gated_is_refused(project, run, rtol, expected):
    project.makepyfile(test_x=f"""
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(runs=5, warmups=0, rtol={rtol})
def test_tolerant(llmperf):
    llmperf.measure(SimulatedBackend())
""")
    result = run("--llmperf-update")
    result.assert_outcomes(failed=1)
    assert expected in result.stdout.str(), result.stdout.str()
    assert stored(project) == {}
    assert_clean(result)


def test_a_tolerance_for_a_gated_metric_and_a_default_is_taken(project, run):
    project.makepyfile(test_x="""
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(runs=5, warmups=0, rtol={"decode_token_ms": 0.5, "default": 0.1})
def test_tolerant(llmperf):
    llmperf.measure(SimulatedBackend())
""")
    run("--llmperf-update").assert_outcomes(passed=1)


NEVER_MEASURES = """
import pytest

@pytest.mark.llmperf(runs=5)
def test_marked_only():
    pass

def test_fixture_only(llmperf):
    assert llmperf.device == "cpu"

@pytest.mark.llmperf(runs=5)
def test_skips(llmperf):
    pytest.skip("not on this machine")

def test_plain():
    pass
"""


SKIP_MARKS = """
import sys
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

HERE = sys.platform  # a module global, which a string condition reads as pytest evaluates it

@pytest.mark.llmperf(batch_sizes=[1], runs=2, warmups=0)
@pytest.mark.skipif("HERE == sys.platform and config.getoption('llmperf_device') == 'cpu'", reason="by a string")
def test_skipped_by_a_string(llmperf):
    raise AssertionError("measured though skipped")

@pytest.mark.llmperf(batch_sizes=[1], runs=2, warmups=0)
@pytest.mark.skipif(False, reason="not met")
@pytest.mark.skipif(condition=True, reason="by a boolean")
def test_skipped_by_a_boolean(llmperf):
    raise AssertionError("measured though skipped")

@pytest.mark.llmperf(batch_sizes=[1], runs=2, warmups=0)
@pytest.mark.skip(reason="unconditional")
def test_skipped(llmperf):
    raise AssertionError("measured though skipped")

@pytest.mark.llmperf(batch_sizes=[1], runs=2, warmups=0)
@pytest.mark.skipif("HERE != sys.platform", reason="not met")
def test_measured(llmperf):
    llmperf.measure(SimulatedBackend())

@pytest.mark.llmperf(batch_sizes=[1], runs=2, warmups=0)
@pytest.mark.skipif("no_such_name", reason="a condition that cannot be evaluated")
def test_broken_condition(llmperf):
    raise AssertionError("measured though its condition failed")
"""


@pytest.mark.parametrize("processes", ["1", "2"])
def test_skip_marks_skip_a_benchmark_as_pytest_does_measured_in_this_process_or_in_workers(project, run,
                                                                                         monkeypatch, processes):
    monkeypatch.setenv("PYTEST_ADDOPTS", f"--llmperf-processes={processes}")
    project.makepyfile(test_x=SKIP_MARKS)
    result = run("--llmperf-update", "-rs")
    result.assert_outcomes(skipped=3, passed=1, errors=1)
    result.stdout.fnmatch_lines_random(["*by a string*", "*by a boolean*", "*unconditional*",
                                        "*ERROR at setup of test_broken_condition*",
                                        "*Error evaluating 'skipif' condition*"])
    assert "measured though" not in result.stdout.str()
    assert list(stored(project)) == ["test_measured"]
    assert_clean(result)


@pytest.mark.parametrize("processes", ["1", "5"])
def test_a_benchmark_test_that_never_measures_fails_saying_so(project, run, monkeypatch, processes):
    monkeypatch.setenv("PYTEST_ADDOPTS", f"--llmperf-processes={processes}")  # in this process, and in worker processes
    project.makepyfile(test_x=NEVER_MEASURES)
    result = run("-o", "llmperf_max_processes=20")
    result.assert_outcomes(failed=2, skipped=1, passed=1)
    result.stdout.fnmatch_lines(["*test_x.py::test_marked_only: an llmperf benchmark test (its llmperf marker or "
                                 "fixture) that never called llmperf.measure(backend): "
                                 "nothing was measured or judged*"])
    assert "test_x.py::test_fixture_only: an llmperf benchmark test" in result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert_clean(result)


@pytest.mark.parametrize("processes", ['"2"', "'auto'"])
def test_a_marker_processes_that_is_not_a_count_is_refused_with_worker_processes_too(project, run, monkeypatch,
                                                                                   processes):
    """T1: an INTERNALERROR (a str compared with an int) once; now the marker's test is refused at setup."""
    monkeypatch.setenv("PYTEST_ADDOPTS", "--llmperf-processes=3")
    project.makepyfile(test_x=f"""
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(runs=5, processes={processes})
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend())
""")
    result = run()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*processes={eval(processes)!r} is not valid: expected an integer >= 1*leave it out "
                                 "for --llmperf-processes*"])
    assert_clean(result)
