"""A run that judged nothing says so in its first summary line, and --llmperf-fail-on can fail it."""

import json

import pytest

from pytest_llmperf.judge.fingerprint import CPU_KEYS

NOISY_TEST = """
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], runs=int(os.environ.get("SIM_RUNS", "10")), warmups=0,
                     metrics=["prefill_ms"])
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend(seed=int(os.environ.get("SIM_SEED", "0")),
                                     noise=float(os.environ.get("SIM_NOISE", "0.02")),
                                     prefill_slowdown=float(os.environ.get("SIM_PREFILL", "1"))))

def test_other():
    pass
"""


@pytest.fixture
def project(pytester, monkeypatch):
    for name in ("SIM_SEED", "SIM_PREFILL", "SIM_NOISE", "SIM_RUNS", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=NOISY_TEST)
    return pytester


def from_another_cpu(pytester):
    """Make every stored baseline look measured on another CPU (whatever the file layout)."""
    def walk(node):
        if isinstance(node, dict):
            if "fingerprint" in node and isinstance(node["fingerprint"], dict):
                node["fingerprint"].update({key: "Other CPU 9000" for key in CPU_KEYS})
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    files = list((pytester.path / "baselines").rglob("*.json"))
    assert files
    for path in files:
        data = json.loads(path.read_text())
        walk(data)
        path.write_text(json.dumps(data))


def test_judged_line_comes_first_and_counts_what_was_compared(project, run):
    run("--llmperf-update").assert_outcomes(passed=2)
    result = run()
    result.assert_outcomes(passed=2)
    lines = result.stdout.lines
    first = lines.index(next(line for line in lines if "llmperf: cpu" in line and line.startswith("=")))
    assert lines[first + 1] == "llmperf: judged 1 of 1 benchmarks"


def test_update_run_says_it_judged_nothing_and_passes(project, run):
    result = run("--llmperf-update")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmperf: judged 0 of 1 benchmarks (1 created: baseline written)", "1 created"])


def test_refused_not_listed_passes_the_test_but_a_run_that_judged_nothing_fails(project, run):
    run("--llmperf-update").assert_outcomes(passed=2)
    from_another_cpu(project)
    result = run()
    assert result.ret == 1  # every benchmark refused: nothing judged, and `unjudged` is in the default fail_on
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["llmperf: judged 0 of 1 benchmarks (1 refused: baseline from another CPU): nothing "
                                 "was compared",
                                 "llmperf: the run fails: nothing judged (--llmperf-fail-on=*unjudged)"])
    result = run("--llmperf-fail-on=regressed,missing")  # without unjudged: green, and says why
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmperf: judged 0 of 1 benchmarks (1 refused: baseline from another CPU): nothing "
                                 "was compared"])
    assert "the run fails" not in result.stdout.str()


def test_refused_listed_fails_with_the_reason(project, run):
    run("--llmperf-update").assert_outcomes(passed=2)
    from_another_cpu(project)
    result = run("--llmperf-fail-on=regressed,missing,refused,inconclusive")
    assert result.ret == 1
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_engine: baseline * was measured on CPU 'Other CPU 9000*not compared*",
        "llmperf: judged 0 of 1 benchmarks (1 refused: baseline from another CPU): nothing was compared",
        "llmperf: the run fails: 1 refused (--llmperf-fail-on=regressed,missing,inconclusive,refused)",
    ])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_fail_on_from_the_environment_and_ini(project, run, addopts):
    run("--llmperf-update").assert_outcomes(passed=2)
    from_another_cpu(project)
    project.makeini("[pytest]\nllmperf_fail_on = refused\n")
    run().assert_outcomes(passed=1, failed=1)
    addopts("--llmperf-fail-on=none")  # PYTEST_ADDOPTS beats the ini
    assert run().ret == 0


def test_missing_not_listed_warns_instead_of_failing(project, run):
    result = run("--llmperf-fail-on=regressed")
    assert result.ret == 0
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["*missing, not failing (missing is not in --llmperf-fail-on)*",
                                 "llmperf: judged 0 of 1 benchmarks (1 missing: no baseline): nothing was compared"])


def test_regressed_fails_by_default_and_not_when_left_out(project, run, monkeypatch):
    run("--llmperf-update").assert_outcomes(passed=2)
    monkeypatch.setenv("SIM_PREFILL", "3")
    run().assert_outcomes(passed=1, failed=1)
    result = run("--llmperf-fail-on=missing")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmperf: judged 1 of 1 benchmarks"])


@pytest.mark.parametrize("value", ["regresed", "refused,maybe", ",", "all"])
def test_bad_fail_on_is_a_usage_error_naming_the_option(project, run, value):
    result = run(f"--llmperf-fail-on={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value for --llmperf-fail-on: expected a comma list out of regressed, "
                                 "missing, inconclusive, refused, unjudged (or none)*"])
    assert "INTERNALERROR" not in result.stderr.str()


def test_fail_on_and_threads_are_in_the_header(project, run):
    result = run("--co")
    result.stdout.fnmatch_lines(["llmperf: device=cpu (given), *threads=1 (auto: cpu target), "
                                 "fail_on=regressed,missing,inconclusive,unjudged"])
    result = run("--co", "-o", "llmperf_threads=2", "--llmperf-fail-on=refused,regressed")
    result.stdout.fnmatch_lines(["*threads=2, fail_on=regressed,refused"])



@pytest.fixture
def inconclusive(project, run, monkeypatch):
    """A slowdown near the tolerance in noisy runs that max_runs cannot settle: 10 runs, one look."""
    run("--llmperf-update").assert_outcomes(passed=2)
    for name, value in (("SIM_NOISE", "0.2"), ("SIM_PREFILL", "1.25"), ("SIM_SEED", "4")):
        monkeypatch.setenv(name, value)
    return project


def test_inconclusive_not_listed_passes_and_is_counted(inconclusive, run):
    result = run("--llmperf-fail-on=regressed,missing", "-o", "llmperf_max_runs=10")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmperf: judged 1 of 1 benchmarks (1 of the judged inconclusive: undecided at their "
                                 "last look)", "*| prefill_ms | 1 *| inconclusive: *undecided at 10 runs per side*",
                                 "1 inconclusive"])


def test_inconclusive_fails_by_default_with_the_runs_that_would_decide_it(inconclusive, run):
    result = run("-o", "llmperf_max_runs=10")
    assert result.ret == 1
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*prefill_ms (prefill) at batch size 1 inconclusive: baseline median*undecided at "
                                 "10 runs per side; about * would decide it*",
                                 "*Measure more units where a row stays undecided*",
                                 "llmperf: the run fails: 1 inconclusive (--llmperf-fail-on=*"])


def test_more_runs_decide_what_one_look_could_not(inconclusive, run):
    result = run("-o", "llmperf_max_runs=80")
    result.stdout.fnmatch_lines(["*| prefill_ms | 1 *| regressed *"])


UNMEASURED_TEST = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

# energy is measured on NVIDIA GPUs only (and only for runs of 1 s or more): here it never is
@pytest.mark.llmperf(batch_sizes=[1], runs=10, warmups=0, metrics=["energy_j_per_token"])
def test_energy(llmperf):
    llmperf.measure(SimulatedBackend(seed=0, noise=0.02))
"""


def test_a_gated_metric_that_was_never_measured_is_said_and_judges_nothing(project, run):
    project.makepyfile(test_engine=UNMEASURED_TEST)
    run("--llmperf-update").assert_outcomes(passed=1)
    result = run()
    result.assert_outcomes(passed=1)  # refused warns by default
    result.stdout.fnmatch_lines(["llmperf: judged 0 of 1 benchmarks (1 refused: nothing gated was measured): "
                                 "nothing was compared",
                                 "*| energy_j_per_token | 1 *| ungated: not measured in these runs: not gated*",
                                 "1 refused"])
    assert result.ret == 1  # nothing judged
    strict = run("--llmperf-fail-on=regressed,missing,refused")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*test_energy: refused (nothing gated was measured), and --llmperf-fail-on lists "
                                 "refused*"])


NEW_ONLY_TEST = """
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[{sizes}], runs=10, warmups=0)
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend(seed=0, noise=0.02, decode_slowdown=float(os.environ.get("SIM_DECODE", "1"))))
"""


def test_a_benchmark_with_only_new_batch_sizes_is_missing_not_passed(project, run):
    project.makepyfile(test_engine=NEW_ONLY_TEST.format(sizes="1"))
    run("--llmperf-update").assert_outcomes(passed=1)
    project.makepyfile(test_engine=NEW_ONLY_TEST.format(sizes="2"))
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["llmperf: judged 0 of 1 benchmarks (1 missing: the baseline lacks batch sizes): "
                                 "nothing was compared", "1 missing"])
    assert result.ret == 1


def test_a_batch_size_added_to_the_marker_is_missing_and_fails_not_new(project, run, monkeypatch):
    """Issue 39, case 3: recorded at [1, 2], the marker now [1, 2, 8]: batch 8 passed as `new`, never gated (a 2x
    slowdown there passed). It is missing, as a gated metric the baseline lacks."""
    project.makepyfile(test_engine=NEW_ONLY_TEST.format(sizes="1, 2"))
    run("--llmperf-update").assert_outcomes(passed=1)
    project.makepyfile(test_engine=NEW_ONLY_TEST.format(sizes="1, 2, 8"))
    result = run("-k", "test_engine")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "batch size 8: missing: the baseline has no entry for this batch size (it holds batch sizes 1, 2): not compared",
        "Record the baseline again, with every batch size and metric the test gates: pytest test_engine.py::test_engine "
        "*--llmperf-update",
        "llmperf: judged 0 of 1 benchmarks (1 missing: the baseline lacks batch sizes)*",
        "*| test_engine | * | 8 * | missing: the baseline has no entry for this batch size *|"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    lenient = run("--llmperf-fail-on=regressed")  # said, not failing, where missing is not in the list
    lenient.assert_outcomes(passed=1)
    assert "missing, not failing (missing is not in --llmperf-fail-on)" in lenient.stdout.str()
    run("--llmperf-update").assert_outcomes(passed=1)  # re-recorded: batch 8 is gated
    run().assert_outcomes(passed=1)
    monkeypatch.setenv("SIM_DECODE", "2")
    slower = run()
    slower.assert_outcomes(failed=1)
    slower.stdout.fnmatch_lines(["*decode_token_ms (decode) at batch size 8 regressed*"])


def test_every_benchmark_skipped_on_this_device_is_a_run_that_judged_nothing(project, run):
    project.makepyfile(test_engine=NEW_ONLY_TEST.format(sizes="1").replace(
        "@pytest.mark.llmperf(", "@pytest.mark.llmperf(devices=['a100'], "))
    result = run()
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["llmperf: judged 0 of 1 benchmarks (1 skipped: they run on other devices than cpu): "
                                 "nothing was compared", "llmperf: the run fails: nothing judged*"])
    assert result.ret == 1
    assert run("--llmperf-fail-on=regressed,missing").ret == 0


def test_a_run_without_benchmarks_is_not_an_llmperf_run(project, run):
    project.makepyfile(test_engine="def test_plain():\n    pass\n")
    result = run()
    assert result.ret == 0 and "llmperf: judged" not in result.stdout.str()
