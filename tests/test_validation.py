"""Inputs that would silently switch the gate off are refused, each with a message naming the option,
ini key or marker keyword and the fix; never an INTERNALERROR or a raw traceback."""

import math
from pathlib import Path

import pytest

from pytest_llmperf.orchestrate.options import rerun_command
from pytest_llmperf.measure.keywords import build_scenario
from pytest_llmperf.measure.scenario import ScenarioError
from pytest_llmperf.orchestrate.options import Settings

MARKED_TEST = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf({marker})
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend(){overrides})
"""


@pytest.fixture
def project(pytester, monkeypatch):
    pytester.makeini("[pytest]\n")
    return pytester


def assert_clean(result):
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text and "Traceback" not in text


# -- options: CLI, environment and ini, by type and range ------------------------------------------------

@pytest.mark.parametrize(("arg", "expected"), [
    ("--llmperf-runs=0", "--llmperf-runs: expected an integer >= 1, got '0'"),
    ("--llmperf-runs=abc", "--llmperf-runs: expected an integer >= 1, got 'abc'"),
    ("--llmperf-runs=2.5", "--llmperf-runs: expected an integer >= 1, got '2.5'"),
    (("-o", "llmperf_warmups=-1"), "-o llmperf_warmups: expected an integer >= 0"),
    ("--llmperf-rtol=nan", "--llmperf-rtol: expected a number >= 0, got 'nan'"),
    ("--llmperf-rtol=inf", "--llmperf-rtol: expected a number >= 0, got 'inf'"),
    ("--llmperf-rtol=-0.1", "--llmperf-rtol: expected a number >= 0"),
    ("--llmperf-alpha=1", "--llmperf-alpha: expected a number in (0, 1)"),
    ("--llmperf-alpha=nan", "--llmperf-alpha: expected a number in (0, 1)"),
    ("--llmperf-max-load=-1", "--llmperf-max-load: expected a number of cores >= 0, or inf"),
    ("--llmperf-max-load=nan", "--llmperf-max-load: expected a number of cores >= 0, or inf"),
    (("-o", "llmperf_threads=0"), "-o llmperf_threads: expected auto or an integer >= 1"),
    (("-o", "llmperf_threads=many"), "-o llmperf_threads: expected auto or an integer >= 1"),
    (("-o", "llmperf_server_timeout=nan"), "-o llmperf_server_timeout: expected a number > 0"),
    ("--llmperf-fail-on=nothing", "--llmperf-fail-on: expected a comma list out of"),
    (("-o", "llmperf_memory_rtol=nan"), "-o llmperf_memory_rtol: expected a number >= 0, got 'nan'"),
    (("-o", "llmperf_memory_rtol=-0.1"), "-o llmperf_memory_rtol: expected a number >= 0"),
])
def test_bad_option_is_a_usage_error_naming_it(project, run, arg, expected):
    result = run(*([arg] if isinstance(arg, str) else arg))  # an expert knob: -o
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*llmperf: bad value for {expected}*"])
    assert_clean(result)


@pytest.mark.parametrize(("line", "expected"), [
    ("llmperf_runs = abc", "ini option llmperf_runs in * expected an integer >= 1, got 'abc'"),
    ("llmperf_rtol = nan", "ini option llmperf_rtol in * expected a number >= 0, got 'nan'"),
    ("llmperf_alpha = 2", "ini option llmperf_alpha in * expected a number in (0, 1), got '2'"),
    ("llmperf_update = maybe", "ini option llmperf_update in *"),
])
def test_bad_ini_value_names_the_ini_option(project, run, line, expected):
    project.makeini(f"[pytest]\n{line}\n")
    result = run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{expected}*"])
    assert "invalid literal" not in result.stderr.str()
    assert_clean(result)


def test_bad_environment_value_names_the_variable(project, run, monkeypatch, addopts):
    addopts("--llmperf-rtol=NaN")  # PYTEST_ADDOPTS reaches every option
    result = run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value for --llmperf-rtol: expected a number >= 0*"])
    monkeypatch.setenv("PYTEST_ADDOPTS", "--llmperf-processes=1")
    monkeypatch.setenv("LLMPERF_HISTORY", "ftp://perf.example/db")  # the plugin's one environment variable
    result = run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value for environment variable LLMPERF_HISTORY: *"])


EMPTY_REF = "expected a git ref (e.g. origin/main, HEAD), got an empty value: an unset variable?"


@pytest.mark.parametrize(("given", "expected"), [
    ("cli", f"--llmperf-compare: {EMPTY_REF}"),
    ("cli blank", f"--llmperf-compare: {EMPTY_REF}"),
    ("addopts", f"--llmperf-compare: {EMPTY_REF}"),
    ("ini", f"ini option llmperf_compare in *tox.ini: {EMPTY_REF}"),
    ("cli slash", "--llmperf-compare: expected a git ref (e.g. origin/main), got 'origin/': an unset variable after"),
])
def test_an_empty_compare_ref_is_refused_not_read_as_stored_baselines(project, run, addopts, given, expected):
    """Issue 39, case 8: `--llmperf-compare=$BASE_REF` with the variable unset in CI gated against the stored
    baselines in silence (and against none, where there are none: a green job that compared nothing)."""
    args = {"cli": ["--llmperf-compare="], "cli blank": ["--llmperf-compare", " "],
            "cli slash": ["--llmperf-compare=origin/"]}.get(given, [])
    if given == "addopts":
        addopts("--llmperf-compare=")
    if given == "ini":
        project.makeini("[pytest]\nllmperf_compare =\n")
    result = run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*llmperf: bad value for {expected}*"])
    assert "leave it out to gate against the stored baselines" in result.stderr.str() or given == "cli slash"
    assert_clean(result)


@pytest.mark.parametrize(("args", "expected"), [
    (["--llmperf-processes=6", "-o", "llmperf_max_processes=3"],
     "llmperf: llmperf_max_processes=3 is below --llmperf-processes=6, the processes of the first look: raise "
     "the ini key llmperf_max_processes to at least 6, or lower --llmperf-processes"),
    (["--llmperf-processes=auto", "-o", "llmperf_max_processes=3"],
     "llmperf: llmperf_max_processes=3 is below --llmperf-processes=5 (auto), *"),
    (["--llmperf-processes=6", "-o", "llmperf_max_processes=3", "--llmperf-update"],
     "llmperf: llmperf_max_processes=3 is below --llmperf-processes=6, *"),
    (["--llmperf-processes=5", "-o", "llmperf_max_processes=8", "-p", "marker8"],
     "llmperf: test_engine.py::test_engine: its marker's processes=9 is above llmperf_max_processes=8: raise "
     "the ini key llmperf_max_processes to at least 9, or lower the marker's processes"),
])
def test_a_cap_of_processes_below_the_first_look_is_refused(project, run, args, expected):
    """Issue 39, case 9: llmperf_max_processes below --llmperf-processes was accepted; the header said processes=6
    at the first look, then up to 3."""
    project.makepyfile(test_engine=MARKED_TEST.format(marker="", overrides=""))
    project.makepyfile(marker8="import pytest\n\ndef pytest_collection_modifyitems(items):\n"
                               "    for item in items:\n        item.add_marker(pytest.mark.llmperf(processes=9))\n")
    project.syspathinsert()
    result = run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {expected}"])
    assert_clean(result)


def test_max_load_inf_switches_the_check_off(project, run):
    project.makepyfile(test_engine=MARKED_TEST.format(marker="runs=5", overrides=""))
    result = run("--llmperf-update", "--co")
    assert result.ret == 0


# -- settings that can never fail ------------------------------------------------------------------------

def test_a_session_whose_runs_cannot_fail_is_refused_naming_the_runs_needed(project, run):
    project.makepyfile(test_engine=MARKED_TEST.format(marker="", overrides=""))
    result = run("--llmperf-runs=1", "-o", "llmperf_max_runs=1")
    result.assert_outcomes(errors=1)  # refused at setup, before any run
    result.stdout.fnmatch_lines(["*runs=1, max_runs=1 cannot fail: judging 3 gated row(s) over looks at [[]1] units "
                                 "per side*slowdown to * (twice the tolerance) would not be called regressed*"
                                 "Allow at least 6 units per side at the last look, and a baseline recorded with as "
                                 "many*"])
    assert "measured" not in result.stdout.str()
    assert_clean(result)


def test_a_marker_whose_runs_cannot_fail_fails_at_setup_and_more_runs_can(project, run):
    project.makepyfile(test_engine=MARKED_TEST.format(marker="runs=1, max_runs=1, batch_sizes=[1, 2, 4, 8]",
                                                      overrides=""))
    result = run()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*runs=1, max_runs=1 cannot fail: judging 12 gated row(s)*"])
    project.makepyfile(test_engine=MARKED_TEST.format(marker="runs=3, max_runs=12", overrides=""))
    assert "cannot fail" not in run("--llmperf-update").stdout.str()


@pytest.mark.parametrize("processes", ['"2"', "0", "True", "2.0", "'auto'"])
def test_a_marker_processes_that_is_not_a_count_is_refused_at_setup(project, run, processes):
    project.makepyfile(test_engine=MARKED_TEST.format(marker=f"processes={processes}", overrides=""))
    result = run()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*processes={eval(processes)!r} is not valid: expected an integer >= 1*"])
    assert_clean(result)


# -- marker keywords: by type and range, never coerced ----------------------------------------------------

@pytest.mark.parametrize(("marker", "expected"), [
    ('batch_sizes="12"', "batch_sizes='12' is not valid: expected a list of distinct integers >= 1"),
    ("batch_sizes=[1.7]", "batch_sizes=[1.7] is not valid"),
    ("batch_sizes=[True]", "batch_sizes=[True] is not valid"),
    ("batch_sizes=[]", "batch_sizes=[] is not valid"),
    ("batch_sizes=[2, 2]", "batch_sizes=[2, 2] is not valid"),
    ("sequence_length=16.9", "sequence_length=16.9 is not valid: expected an integer >= 1"),
    ("decode_length=0", "decode_length=0 is not valid: expected an integer >= 1"),
    ('runs="10"', "runs='10' is not valid: expected an integer >= 1"),
    ("warmups=-1", "warmups=-1 is not valid: expected an integer >= 0"),
    ('rtol=float("nan")', "rtol=nan is not valid: expected a finite number >= 0"),
    ('rtol={"prefill_ms": float("nan")}', "rtol={'prefill_ms': nan} is not valid"),
    ("rtol=-0.5", "rtol=-0.5 is not valid"),
    ("alpha=0", "alpha=0 is not valid: expected a number in (0, 1)"),
    ("max_load=-1", "max_load=-1 is not valid: expected a number of cores >= 0"),
    ('max_load=float("nan")', "max_load=nan is not valid"),
    ('metrics="prefill_ms"', "metrics='prefill_ms' is not valid: expected a non-empty list of metric names"),
    ('stop_after_oom="yes"', "stop_after_oom='yes' is not valid: expected True or False"),
    ('knobs={"threads": 0}', "knobs['threads']=0 is not valid: expected an integer >= 1"),
    ("devices=[]", "devices=[] is not valid"),
    ('memory_rtol=float("nan")', "memory_rtol=nan is not valid: expected a finite number >= 0"),
    ('memory_rtol=float("inf")', "memory_rtol=inf is not valid"),
])
def test_bad_marker_value_fails_the_test_naming_the_keyword(project, run, marker, expected):
    project.makepyfile(test_engine=MARKED_TEST.format(marker=marker, overrides=""))
    result = run("--llmperf-update")
    result.assert_outcomes(errors=1)  # refused at setup, before any run
    assert f"@pytest.mark.llmperf: {expected}" in result.stdout.str()
    assert not list((project.path / "baselines").rglob("*.json"))  # nothing measured, nothing written
    assert_clean(result)


def test_bad_override_in_measure_names_the_setting(project, run):
    project.makepyfile(test_engine=MARKED_TEST.format(marker="", overrides=", batch_sizes=[1.5]"))
    result = run("--llmperf-update")
    result.assert_outcomes(failed=1)
    assert "batch_sizes=[1.5] is not valid: expected a list of distinct integers" in result.stdout.str()
    assert_clean(result)


def test_a_typo_in_metrics_is_refused_with_the_known_names(project, run):
    project.makepyfile(test_engine=MARKED_TEST.format(marker='metrics=["prefil_ms"]', overrides=""))
    result = run("--llmperf-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*metrics: unknown metric(s) prefil_ms for the simulated backend (a typo would "
                                 "gate nothing); known: prefill_ms, decode_token_ms*"])
    assert_clean(result)


def test_the_scenario_never_coerces():
    with pytest.raises(ScenarioError, match="sequence_length=16.9"):
        build_scenario({"sequence_length": 16.9})
    with pytest.raises(ScenarioError, match="rtol=nan"):
        build_scenario({"rtol": float("nan")})
    assert build_scenario({"max_load": float("inf"), "batch_sizes": [1, 2]}).batch_sizes == (1, 2)


# -- hints: what to run instead, repeating the options given --------------------------------------------

def test_rerun_command_repeats_only_the_options_given(tmp_path):
    settings = Settings(baseline_dir=str(tmp_path / "my baselines"), max_load=2.0, rtol=0.3, update=True,
                        model={"tiny": "/m/tiny"}, fail_on=("refused",), rootdir=Path(tmp_path),
                        given=("baseline_dir", "max_load", "rtol", "update", "model"))
    command = rerun_command(settings, "cpu", "t.py::test_x", update=True, replace={"max_load": 3.5})
    assert command == (f"pytest t.py::test_x --llmperf-device=cpu --llmperf-baseline-dir='{tmp_path}/my baselines' "
                       "--llmperf-rtol=0.3 --llmperf-model=tiny=/m/tiny --llmperf-max-load=3.5 --llmperf-update")


def test_busy_hints_say_what_to_run_instead_once_with_one_max_load():
    from types import SimpleNamespace

    from pytest_llmperf.judge.baselines import BaselineEntry
    from pytest_llmperf.measure.records import BatchResult, BenchmarkResult
    from pytest_llmperf.orchestrate.judging import busy_hint

    result = BenchmarkResult("k", "t.py::k", "t.py", {}, {}, [BatchResult(1, foreign_load=1.2),
                                                             BatchResult(2, foreign_load=0.7)])
    quiet = BaselineEntry("k", {}, foreign_load={1: 0.0})
    session = SimpleNamespace(threads=2)
    now = busy_hint(session, result, quiet, 0.25)
    assert now.count("--llmperf-max-load=") == 1 and "--llmperf-max-load=1.5" in now  # 1.2 + 0.25, rounded up
    assert "-o llmperf_threads=1" in now and "--llmperf-compare REF" in now
    assert "llmperf_threads" not in busy_hint(SimpleNamespace(threads=1), result, quiet, 0.25)
    calm = BenchmarkResult("k", "t.py::k", "t.py", {}, {}, [BatchResult(1, foreign_load=0.0)])
    base = busy_hint(session, calm, BaselineEntry("k", {}, foreign_load={1: 0.9}), 0.25)
    assert "--llmperf-update on a quiet machine" in base and "--llmperf-max-load=1.2" in base


def test_hints_repeat_the_baseline_dir_and_max_load(project, run, tmp_path):
    project.makepyfile(test_engine=MARKED_TEST.format(marker="", overrides=""))
    elsewhere = tmp_path / "elsewhere"
    result = run(f"--llmperf-baseline-dir={elsewhere}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"  pytest test_engine.py::test_engine --llmperf-device=cpu "
                                 f"--llmperf-baseline-dir={elsewhere} --llmperf-max-load=inf --llmperf-update"])
    # Following the hint records where the gate then looks: no second refusal.
    run(f"--llmperf-baseline-dir={elsewhere}", "--llmperf-update").assert_outcomes(passed=1)
    run(f"--llmperf-baseline-dir={elsewhere}").assert_outcomes(passed=1)


def test_a_bad_worker_start_is_a_usage_error_naming_the_choices(project, run):
    result = run("-o", "llmperf_worker_start=spawn")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*llmperf_worker_start*expected one of fork, exec*"])
    assert_clean(result)
