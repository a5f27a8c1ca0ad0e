"""`--llmperf-runs` auto: 3 runs in each worker process (the gate tests per-process medians, whose spread is the
processes'; docs/notes/noise.md, "Real jobs on this VM"), 10 when one process measures (its runs are the gate's
units); the header says which."""

import json
from collections import Counter

import pytest

from pytest_llmperf.orchestrate.session import RECORD_FACTOR

TEST = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], warmups=0)
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend())
"""


@pytest.fixture
def project(project):
    project.makepyfile(test_engine=TEST)
    return project


def runs_per_process(project, *args):
    # max-load inf: an update refuses a busy machine, and this counts runs, not load (it failed beside a real job)
    result = project.runpytest("--llmperf-device=cpu", "--llmperf-update", "-p", "no:cacheprovider",
                               "--llmperf-max-load=inf", "--llmperf-json=out.json", *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    report = json.loads((project.path / "out.json").read_text())
    (batch,) = report["benchmarks"][0]["batches"]
    return result, Counter(run["process"] for run in batch["runs"])


def test_auto_takes_three_runs_in_each_worker_process(project):
    result, runs = runs_per_process(project, "--llmperf-processes=2")
    assert sorted(runs.values()) == [3] * 2 * RECORD_FACTOR  # an update records RECORD_FACTOR x the processes
    result.stdout.fnmatch_lines(["llmperf: device=cpu (given), mode=update, runs=3 (auto), warmups=1*"])


def test_auto_takes_ten_runs_in_one_process(project):
    result, runs = runs_per_process(project, "--llmperf-processes=1")
    assert list(runs.values()) == [10]
    result.stdout.fnmatch_lines(["*runs=10 (auto), *"])


def test_a_given_number_of_runs_is_taken_in_every_worker_process(project):
    result, runs = runs_per_process(project, "--llmperf-processes=2", "--llmperf-runs=4")
    assert sorted(runs.values()) == [4] * 2 * RECORD_FACTOR
    result.stdout.fnmatch_lines(["*mode=update, runs=4, warmups*"])


def test_runs_auto_or_a_positive_integer(project):
    result = project.runpytest("--llmperf-device=cpu", "--llmperf-runs=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-runs*"])


def test_the_header_says_how_a_gate_adds_processes(pytester):
    """Against stored baselines a gate looks after every round (judge/procedure.py, Schedule.every_round); an A/B job
    plans its looks within a budget (Schedule.planned): the header says which."""
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = pytester.runpytest("--llmperf-device=cpu", "--llmperf-processes=4", "-o", "llmperf_max_processes=20",
                                "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["llmperf: processes=4 per side at the first look (worker processes, forked from a "
                                 "server that imported the libraries both sides share; the gate tests "
                                 "their medians), then one more a round while rows are undecided, judged after every "
                                 "round up to 20 (alpha spent at the doublings and the cap), against the stored "
                                 "baselines"])
    assert "doubling to" not in result.stdout.str()
    result = pytester.runpytest("--llmperf-device=cpu", "--llmperf-compare=HEAD", "--llmperf-budget=60",
                                "--llmperf-processes=auto", "-p", "no:cacheprovider", "--collect-only")
    result.stdout.fnmatch_lines(["llmperf: processes=8 (auto) per side at the first look (*the gate tests the means of "
                                 "their runs, pair by pair), then a look where this job's spreads say its undecided "
                                 "rows will be decided, runs per process chosen from them, and a last one, within 40 "
                                 "processes and a budget of 60 s, the working tree against HEAD*"])
    result = pytester.runpytest("--llmperf-device=cpu", "--llmperf-processes=5", "-o", "llmperf_worker_start=exec", "-p",
                                "no:cacheprovider")
    result.stdout.fnmatch_lines(["llmperf: processes=5 per side at the first look (worker processes, each a "
                                 "fresh interpreter; the gate tests their medians)*"])
