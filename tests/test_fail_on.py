"""A run that judged nothing says so in its first summary line, and --llmperf-fail-on can fail it."""

import json

import pytest

from pytest_llmperf.judge.environment import CPU_KEYS
from pytest_llmperf.orchestrate.options import OPTIONS

NOISY_TEST = """
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], runs=int(os.environ.get("SIM_RUNS", "10")), warmups=0,
                     metrics=["prefill_ms"])
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend(seed=int(os.environ.get("SIM_SEED", "0")), noise=float(os.environ.get("SIM_NOISE", "0.02")),
                                     prefill_slowdown=float(os.environ.get("SIM_PREFILL", "1"))))

def test_other():
    pass
"""


@pytest.fixture
def project(pytester, monkeypatch):
    for name in ("SIM_SEED", "SIM_PREFILL", "SIM_NOISE", "SIM_RUNS", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(name, raising=False)
    for option in OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    monkeypatch.setenv("LLMPERF_PROCESSES", "1")  # in-process (tests/test_workers.py: workers)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=NOISY_TEST)
    return pytester


def run(pytester, *args):
    # The simulated engine's timings do not depend on the machine: no quiet machine needed.
    return pytester.runpytest("--llmperf-device=cpu", "-p", "no:cacheprovider", "--llmperf-max-load=inf", *args)


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


def test_judged_line_comes_first_and_counts_what_was_compared(project):
    run(project, "--llmperf-update").assert_outcomes(passed=2)
    result = run(project)
    result.assert_outcomes(passed=2)
    lines = result.stdout.lines
    first = lines.index(next(line for line in lines if "llmperf: cpu" in line and line.startswith("=")))
    assert lines[first + 1] == "llmperf: judged 1 of 1 benchmarks"


def test_update_run_says_it_judged_nothing(project):
    result = run(project, "--llmperf-update")
    result.stdout.fnmatch_lines(["llmperf: judged 0 of 1 benchmarks (1 recorded: baseline written)"])


def test_refused_not_listed_passes_but_says_nothing_was_judged(project):
    run(project, "--llmperf-update").assert_outcomes(passed=2)
    from_another_cpu(project)
    result = run(project)
    assert result.ret == 0
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["llmperf: judged 0 of 1 benchmarks (1 refused: baseline from another CPU)"])
    assert "the run fails" not in result.stdout.str()


def test_refused_listed_fails_with_the_reason(project):
    run(project, "--llmperf-update").assert_outcomes(passed=2)
    from_another_cpu(project)
    result = run(project, "--llmperf-fail-on=regressed,missing,refused,inconclusive")
    assert result.ret == 1
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_engine: refused (baseline from another CPU), and --llmperf-fail-on lists refused: nothing was judged*",
        "llmperf: judged 0 of 1 benchmarks (1 refused: baseline from another CPU)",
        "llmperf: the run fails: 1 refused (--llmperf-fail-on=regressed,missing,refused,inconclusive)",
    ])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_fail_on_from_the_environment_and_ini(project, monkeypatch):
    run(project, "--llmperf-update").assert_outcomes(passed=2)
    from_another_cpu(project)
    project.makeini("[pytest]\nllmperf_fail_on = refused\n")
    assert run(project).ret == 1
    monkeypatch.setenv("LLMPERF_FAIL_ON", "none")  # the environment beats the ini
    assert run(project).ret == 0


def test_missing_not_listed_warns_instead_of_failing(project):
    result = run(project, "--llmperf-fail-on=regressed")
    assert result.ret == 0
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["*missing, not failing (missing is not in --llmperf-fail-on)*",
                                 "llmperf: judged 0 of 1 benchmarks (1 missing: no baseline)"])


def test_regressed_fails_by_default_and_not_when_left_out(project, monkeypatch):
    run(project, "--llmperf-update").assert_outcomes(passed=2)
    monkeypatch.setenv("SIM_PREFILL", "3")
    run(project).assert_outcomes(passed=1, failed=1)
    result = run(project, "--llmperf-fail-on=missing")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmperf: judged 1 of 1 benchmarks"])


@pytest.mark.parametrize("value", ["regresed", "refused,maybe", ",", "all"])
def test_bad_fail_on_is_a_usage_error_naming_the_option(project, value):
    result = run(project, f"--llmperf-fail-on={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value for --llmperf-fail-on: expected a comma list out of regressed, "
                                 "missing, refused, inconclusive (or none)*"])
    assert "INTERNALERROR" not in result.stderr.str()


def test_fail_on_and_threads_are_in_the_header(project):
    result = run(project, "--co")
    result.stdout.fnmatch_lines(["llmperf: device=cpu (given), *threads=1 (auto: cpu target), "
                                 "fail_on=regressed,missing"])
    result = run(project, "--co", "--llmperf-threads=2", "--llmperf-fail-on=refused,regressed")
    result.stdout.fnmatch_lines(["*threads=2, fail_on=regressed,refused"])



@pytest.fixture
def inconclusive(project, monkeypatch):
    """A noisy 1.3x slowdown whose two looks stay between alpha and 0.2 (seed 3 of the simulated engine)."""
    run(project, "--llmperf-update").assert_outcomes(passed=2)
    for name, value in (("SIM_NOISE", "0.3"), ("SIM_PREFILL", "1.3"), ("SIM_SEED", "3")):
        monkeypatch.setenv(name, value)
    return project


def test_inconclusive_not_listed_passes_and_is_counted(inconclusive):
    result = run(inconclusive)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmperf: judged 1 of 1 benchmarks (1 of the judged inconclusive)",
                                 "*| prefill_ms | 1 *| inconclusive |"])


def test_inconclusive_listed_fails_with_the_reason(inconclusive):
    result = run(inconclusive, "--llmperf-fail-on=regressed,missing,inconclusive")
    assert result.ret == 1
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_engine: inconclusive (inconclusive after two looks), and --llmperf-fail-on "
                                 "lists inconclusive*batch size 1 prefill_ms*",
                                 "llmperf: the run fails: 1 inconclusive (--llmperf-fail-on=*"])


UNMEASURED_TEST = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

# energy is measured on NVIDIA GPUs only (and only for runs of 1 s or more): here it never is
@pytest.mark.llmperf(batch_sizes=[1], runs=10, warmups=0, metrics=["energy_j_per_token"])
def test_energy(llmperf):
    llmperf.measure(SimulatedBackend(seed=0, noise=0.02))
"""


def test_a_gated_metric_that_was_never_measured_is_said_and_judges_nothing(project):
    project.makepyfile(test_engine=UNMEASURED_TEST)
    run(project, "--llmperf-update").assert_outcomes(passed=1)
    result = run(project)
    result.assert_outcomes(passed=1)  # refused warns by default
    result.stdout.fnmatch_lines(["llmperf: judged 0 of 1 benchmarks (1 refused: nothing gated was measured)",
                                 "*| energy_j_per_token | 1 *| ungated: not measured in these runs: not gated*",
                                 "0 passed, 0 regressed, 0 improved, * 1 refused*"])
    strict = run(project, "--llmperf-fail-on=regressed,missing,refused")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*test_energy: refused (nothing gated was measured), and --llmperf-fail-on lists "
                                 "refused: nothing was judged*"])
