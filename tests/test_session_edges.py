"""Sessions at the edges of what --llmperf-fail-on's `unjudged`, worker processes' DeferredBenchmark items and the
marker's `processes` were built for: deselected benchmarks, --collect-only, xfail, a usage error, a marker keyword
the session cannot honour. Found in a hostile pass over main since b97fdd0 (issue 26)."""

import pytest


TESTS = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend())

def test_plain():
    pass
"""

XFAIL = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.xfail(reason="known", strict=True)
@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def test_xfail(llmperf):
    assert False

@pytest.mark.xfail(reason="now passes", strict=True)
@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def test_xpass_strict(llmperf):
    llmperf.measure(SimulatedBackend())

@pytest.mark.xfail(reason="may pass")
@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def test_xpass(llmperf):
    llmperf.measure(SimulatedBackend())
"""


@pytest.mark.parametrize("processes", ["1", "5"])
@pytest.mark.parametrize("select", [("-m", "not llmperf"), ("-k", "plain")])
def test_deselecting_every_benchmark_is_not_a_session_that_judged_nothing(project, run, monkeypatch, processes, select):
    """`-m 'not llmperf'` (the README's way to run the other tests under xdist) exited 1: 'nothing judged'."""
    monkeypatch.setenv("PYTEST_ADDOPTS", f"--llmperf-processes={processes}")
    project.makepyfile(test_x=TESTS)
    result = run(*select)
    result.assert_outcomes(passed=1, deselected=1)
    assert result.ret == pytest.ExitCode.OK
    assert "nothing judged" not in result.stdout.str()


@pytest.mark.parametrize("processes", ["1", "5"])
def test_collect_only_judges_nothing_and_fails_nothing(project, run, monkeypatch, processes):
    monkeypatch.setenv("PYTEST_ADDOPTS", f"--llmperf-processes={processes}")
    project.makepyfile(test_x=TESTS)
    result = run("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK
    assert "llmperf: judged" not in result.stdout.str()
    assert not (project.path / "reports").exists()


@pytest.mark.parametrize(("args", "said"), [
    (("--llmperf-processes=2", "-o", "llmperf_max_processes=2"), "*cannot fail*"),  # refused at collection
    (("--llmperf-compare=HEAD",), "*is not inside a git repository*"),  # refused as the campaign starts
])
def test_a_usage_error_says_only_the_error(project, run, args, said):
    project.makepyfile(test_x=TESTS.replace("batch_sizes=[1]", "batch_sizes=[1, 2, 4, 8]"))
    result = run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([said])
    assert "llmperf: judged" not in result.stdout.str() and "the run fails" not in result.stdout.str()


@pytest.mark.parametrize("processes", ["1", "5"])
def test_xfail_means_the_same_in_worker_processes_as_in_this_one(project, run, monkeypatch, processes):
    """In worker processes an xfailed benchmark was reported skipped, with the repr of the llmperf fixture as its
    reason, and a strict XPASS as xfailed."""
    monkeypatch.setenv("PYTEST_ADDOPTS", f"--llmperf-processes={processes}")
    project.makepyfile(test_x=XFAIL)
    result = run("--llmperf-update", "-rxXf")
    result.assert_outcomes(failed=1, xfailed=1, xpassed=1)
    result.stdout.fnmatch_lines(["XFAIL test_x.py::test_xfail - known", "XPASS test_x.py::test_xpass - may pass",
                                 "FAILED test_x.py::test_xpass_strict - [[]XPASS(strict)] now passes"])


def test_a_marker_processes_the_session_does_not_use_is_said(project, run):
    project.makepyfile(test_x="""
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0, processes=3)
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend())
""")
    result = run("--llmperf-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*PytestLLMPerfWarning: llmperf: the marker's processes=3 is not used: "
                                 "--llmperf-processes=1 measures every benchmark in this pytest process*"])


def test_a_marker_rtol_auto_is_refused_saying_where_auto_belongs(project, run):
    project.makepyfile(test_x=TESTS.replace("warmups=0)", "warmups=0, rtol='auto')"))
    result = run()
    result.assert_outcomes(errors=1, passed=1)
    result.stdout.fnmatch_lines(["*rtol='auto' is not valid: expected a finite number >= 0 (or a {metric: number} "
                                 "mapping); auto is --llmperf-rtol's: leave rtol out to use the session's*"])
