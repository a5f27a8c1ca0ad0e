"""Worker processes and A/B comparisons against a git ref, end to end through pytester.

Each project is a temporary git repository with a simulated engine whose speed comes from the
project's own module `speed.py`: a slowdown "injected in the working tree" is an uncommitted edit
of that module, which only the working tree's workers import. Every worker process is a real
`python -m pytest`, so these tests take a few seconds each.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from pytest_llmperf.judge import stats
from pytest_llmperf.judge.baselines import BaselineEntry
from pytest_llmperf.measure import runner
from pytest_llmperf.measure.records import BenchmarkResult
from pytest_llmperf.measure.backend import FakeClock
from pytest_llmperf.measure.metrics import unit_values, values_by_process
from pytest_llmperf.measure.scenario import Scenario
from pytest_llmperf.orchestrate import forkserver

ENGINE = """
import os
import numpy as np
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend
import speed

@pytest.fixture
def engine():
    index = int(os.environ.get("LLMPERF_WORKER_PROCESS", "0"))
    speed.before_measuring()
    # each process settles into a speed of its own, as real processes do (2% between processes)
    factor = float(np.exp(np.random.default_rng([index, speed.SEED]).normal(0, 0.02)))
    return SimulatedBackend(seed=index, noise=0.005, prefill_slowdown=factor * speed.PREFILL,
                            decode_slowdown=factor * speed.DECODE, changed_from=speed.CHANGED_FROM)

@pytest.mark.llmperf(batch_sizes=[1, 2], runs=3, warmups=0)
def test_engine(llmperf, engine):
    llmperf.measure(engine)
"""
SPEED = ("SEED = {seed}\nPREFILL = {prefill}\nDECODE = {decode}\nCHANGED_FROM = {changed}\n\n"
         "def before_measuring():\n    {hook}\n")
ARGS = ("--llmperf-device=cpu", "--llmperf-machine=runner", "-p", "no:cacheprovider", "--llmperf-alpha=0.05",
        "--llmperf-processes=5", "-o", "llmperf_max_processes=5", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def write_speed(pytester, *, prefill=1.0, decode=1.0, seed=0, hook="pass", changed=None):
    pytester.makepyfile(speed=SPEED.format(seed=seed, prefill=prefill, decode=decode, hook=hook, changed=changed))


def git(pytester, *args):
    subprocess.run(["git", *args], cwd=pytester.path, check=True, capture_output=True)


def worktrees(pytester):
    out = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=pytester.path, capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("worktree ")]


@pytest.fixture
def repo(pytester, monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # not the suite's --llmperf-processes=1
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=ENGINE)
    write_speed(pytester)
    git(pytester, "init", "-q")
    git(pytester, "add", "-A")
    git(pytester, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    return pytester


@pytest.fixture
def run(run):
    return dataclasses.replace(run, flags=ARGS)  # these, not the usual flags: the workers' runs read the load


def test_unchanged_working_tree_passes_against_head_and_the_worktree_is_removed(repo, run):
    result = run("--llmperf-compare", "HEAD")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*process 1 of 5 on HEAD (*", "*process 5 of 5 on the working tree*",
                                 "*decode_token_ms*pass*"])
    assert worktrees(repo) == [f"worktree {repo.path}"]
    report = json.loads((repo.path / "reports" / "cpu.json").read_text())
    runs = report["benchmarks"][0]["batches"][0]["runs"]
    assert sorted({r["process"] for r in runs}) == [1, 2, 3, 4, 5] and len(runs) == 15  # 5 processes x 3 runs


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_a_slowdown_in_the_working_tree_fails_naming_decode_not_prefill(repo, run, start):
    write_speed(repo, decode=1.10)  # uncommitted: only the working tree's workers import it
    result = run("--llmperf-compare", "HEAD", "-o", f"llmperf_worker_start={start}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*decode_token_ms (decode) at batch size 1 regressed*n=5/5 pairs*",
                                 "*compared with HEAD (*) in alternating worker processes*"])
    result.stdout.no_fnmatch_line("*prefill_ms (prefill) at batch size * regressed*")
    assert worktrees(repo) == [f"worktree {repo.path}"]


def test_a_fork_server_that_cannot_start_leaves_the_workers_started_from_scratch(repo, run, monkeypatch):
    monkeypatch.setattr(forkserver, "ZYGOTE", repo.path / "missing.py")
    result = run("--llmperf-compare", "HEAD")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*llmperf: workers start from scratch (as llmperf_worker_start=exec): the fork "
                                 "server (llmperf_worker_start=fork) exited with code 1*"])


def test_changed_outputs_in_the_working_tree_fail_against_the_refs_own_tokens(repo, run):
    write_speed(repo, changed=2)  # same speed, other tokens from the third on
    result = run("--llmperf-compare", "HEAD")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_engine: batch size 1: outputs changed from HEAD (*): sequence 0 differs first "
                                 "at generated token 2 (id 102 -> 103)*",
                                 "*compared with HEAD (*) in alternating worker processes (--llmperf-compare)*"])
    result.stdout.no_fnmatch_line("*regressed:*")


def test_a_test_only_in_the_working_tree_is_new_not_failed(repo, run):
    repo.makepyfile(test_added=ENGINE.replace("def test_engine(", "def test_added("))
    result = run("--llmperf-compare", "HEAD")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*1 new*"])


def test_a_bad_ref_is_a_usage_error_naming_it(repo, run):
    result = run("--llmperf-compare", "no-such-branch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-compare no-such-branch: no such commit, branch or tag*"])
    assert worktrees(repo) == [f"worktree {repo.path}"]


def test_compare_refuses_to_update_baselines(repo, run):
    result = run("--llmperf-compare", "HEAD", "--llmperf-update")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-compare measures against a git ref and writes no baselines*"])


def test_too_few_processes_to_fail_are_refused_with_the_number_needed(repo):
    result = repo.runpytest("--llmperf-device=cpu", "-p", "no:cacheprovider", "--llmperf-processes=2",
                            "-o", "llmperf_max_processes=2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-processes=2 (llmperf_max_processes=2) cannot fail*Allow at least "
                                 "* units per side at the last look*"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_stored_baselines_hold_per_process_values_and_gate_them(repo, run):
    # the simulated engine's timings do not depend on the machine: a busy one must not refuse them here
    quiet = "--llmperf-max-load=inf"
    run("--llmperf-update", quiet).assert_outcomes(passed=1)
    stored = json.loads((repo.path / "baselines" / "cpu" / "runner" / "test_engine.json").read_text())
    entry = stored["benchmarks"]["test_engine"]
    assert entry["unit"] == "process"
    assert entry["batches"]["1"]["runs_per_process"] == [3] * 10  # an update records twice the first look
    assert len(entry["values"]["1"]["prefill_ms"]) == 10  # and each process's median: what the gate tests
    run(quiet).assert_outcomes(passed=1)
    write_speed(repo, prefill=1.2)
    result = run(quiet)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*prefill_ms (prefill) at batch size * regressed*n=10/5 processes*"])


def test_a_test_the_workers_deselect_fails_rather_than_passing_unmeasured(repo, run):
    """The ini's addopts apply in a worker; the command line's -m does not reach it (a test it deselects would
    leave nothing to judge, and pass)."""
    repo.makeini('[pytest]\naddopts = -m "not heavy"\nmarkers = heavy\n')
    heavy = ENGINE.replace("def test_engine(", "@pytest.mark.heavy\ndef test_heavy(")
    repo.makepyfile(test_engine=heavy + ENGINE[ENGINE.index("@pytest.mark.llmperf"):])
    # both here; the worker deselects test_heavy (the load is not what this test is about: a busy machine refuses
    # to write the baseline, and test_engine would fail too)
    result = run("--llmperf-update", "-m", "", "--llmperf-max-load=inf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*not run in any worker process on the working tree: deselected there?*"])


def test_a_crashing_worker_fails_with_its_log_tail(repo, run):
    write_speed(repo, hook="print('about to crash'); import os; os._exit(3)")
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*worker process 1 on the working tree exited with code 3*", "*about to crash*"])


def test_a_workers_atexit_handlers_run_though_it_skips_the_interpreters_teardown(repo, run):
    # a worker leaves through os._exit (manager.WORKER_MAIN); a user's conftest may stop a server at exit
    log = repo.path / "atexit.log"
    write_speed(repo, hook=f"import atexit, os; atexit.register(lambda: open({str(log)!r}, 'a').write("
                           "os.environ['LLMPERF_WORKER_PROCESS'] + chr(10)))")  # uncommitted: the working tree's
    result = run("--llmperf-compare", "HEAD")
    result.assert_outcomes(passed=1)
    assert sorted(log.read_text().split()) == ["1", "2", "3", "4", "5"]


def test_a_hanging_worker_is_stopped_at_its_deadline_and_leaves_no_process(repo, run):
    write_speed(repo, hook="import os, time; open('worker.pid', 'w').write(str(os.getpid())); time.sleep(600)")
    result = run("-o", "llmperf_worker_timeout=8")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*worker process 1 on the working tree did not finish within 8 s*"])
    pid = int((repo.path / "worker.pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_comparison_removes_the_worktree_and_the_workers(repo, signum):
    write_speed(repo, hook="import os, time; open('worker.pid', 'w').write(str(os.getpid())); time.sleep(600)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMPERF_") and k != "PYTEST_ADDOPTS"}
    # Ctrl-C as at a terminal: a suite started in the background (`cmd &` in a script) inherits SIGINT ignored,
    # and a Python started so never turns it into KeyboardInterrupt (seen: this test hung in such a run)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *ARGS, "--llmperf-compare", "HEAD"], cwd=repo.path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pid_file = repo.path / "worker.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_file.exists(), "no worker started"
    assert len(worktrees(repo)) == 2  # the ref's worktree exists while A is measured
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=60)
    assert b"KeyboardInterrupt" in out
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert worktrees(repo) == [f"worktree {repo.path}"]


# -- the reduction to per-process values, with an injected clock ------------------------------------------------


class ClockedBackend:
    """A backend whose every run takes a scripted time on an injected clock (prefill only)."""

    splits_prefill = True

    def __init__(self, prefill_ms):
        self.times = iter(prefill_ms)
        self.clock = FakeClock(step=0)

    def generate(self, request):
        from pytest_llmperf.measure.records import RunSample

        start = self.clock()
        self.clock.advance(int(next(self.times) * 1e6))
        prefill = self.clock() - start
        return RunSample(request.batch_size, [[prefill]], prefill, prefill_ns=prefill, decode_steps_ns=[])

    def apply_knobs(self, knobs):
        import contextlib

        return contextlib.nullcontext()

    def describe(self):
        return {"backend": "clocked"}


def measured_by(process, prefill_ms):
    scenario = Scenario(batch_sizes=(1,), runs=len(prefill_ms), warmups=0)
    result = runner.measure(ClockedBackend(prefill_ms), scenario, key="k", nodeid="t.py::k", module="t.py")
    for sample in result.batches[0].samples:
        sample.process = process
    return result


def test_per_process_medians_are_what_reaches_the_gate():
    # Process 1 is fast with one outlier run, process 2 slow: the gate sees one median per process.
    merged = BenchmarkResult.merge([measured_by(1, [10.0, 10.2, 30.0]), measured_by(2, [12.0, 12.4, 12.2])])
    batch = merged.batches[0]
    assert batch.processes == [1, 2] and len(batch.samples) == 6
    unit, values = unit_values(batch.samples)
    assert unit == "process"
    assert values["prefill_ms"] == pytest.approx([10.2, 12.2], abs=1e-6)
    per_process = values_by_process(batch.samples)["prefill_ms"]
    assert [[round(v, 6) for v in runs] for runs in per_process] == [[10.0, 10.2, 30.0], [12.0, 12.4, 12.2]]
    assert merged.scenario["processes"] == 2
    entry = BaselineEntry.of_result(merged, created="HEAD")
    assert entry.unit == "process" and entry.process_values(1)["prefill_ms"] == pytest.approx([10.2, 12.2], abs=1e-6)


def test_runs_of_one_process_stay_runs():
    unit, values = unit_values(measured_by(0, [10.0, 11.0, 12.0]).batches[0].samples)
    assert unit == "run" and values["prefill_ms"] == pytest.approx([10.0, 11.0, 12.0], abs=1e-6)


def test_pairs_cancel_what_both_sides_of_a_round_shared():
    # Each round's machine state moves both processes alike (+-10%); B is 5% slower in every round.
    rng = np.random.default_rng(0)
    state = np.exp(rng.normal(0, 0.10, 10))
    a = 100 * state * np.exp(rng.normal(0, 0.005, 10))
    b = 105 * state * np.exp(rng.normal(0, 0.005, 10))
    paired = stats.paired(a, b, better="lower")
    unpaired = stats.unpaired(a, b, better="lower")
    assert paired.p_worse() < 1e-4 and unpaired.p_worse() > 0.05  # unpaired: not significant
    low, high = paired.interval()
    assert 1.04 < paired.ratio() < 1.06 and low > 1.03
    throughput = stats.paired(1 / a, 1 / b, better="higher")
    assert throughput.p_worse() == pytest.approx(paired.p_worse()) and throughput.ratio() == pytest.approx(
        1 / paired.ratio())


def test_identical_pairs_give_no_evidence_either_way():
    same = stats.paired([0.5] * 8, [0.5] * 8, better="higher")
    assert same.p_worse() == 1.0 and same.ratio() == 1.0


def test_a_test_failing_on_the_ref_cannot_be_compared_and_says_so(repo, run):
    write_speed(repo, hook="raise RuntimeError('broken at the base commit')")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "broken")
    write_speed(repo)  # fixed in the working tree
    result = run("--llmperf-compare", "HEAD")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot compare: the test fails on HEAD (*", "*broken at the base commit*"])


def test_under_xdist_worker_processes_are_not_started_and_the_tests_are_refused(repo, run):
    pytest.importorskip("xdist")
    result = run("-n", "2")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*timed benchmark tests must not run under pytest-xdist*"])
    result.stdout.no_fnmatch_line("*llmperf: process 1 of*")


@pytest.fixture
def steady_load():
    """Another process keeping one core busy for the whole test (a steady neighbour)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.serial  # reads the machine's load beside one steady neighbour: alone, after the parallel tests
def test_a_steady_load_does_not_refuse_an_ab_comparison(repo, run, steady_load):
    # Both sides run beside the same neighbour, so A/B still judges (a stored-baseline gate refuses a
    # comparison whose runs stayed busy: tests/test_load.py, with the load injected).
    result = run("--llmperf-compare", "HEAD", "--llmperf-max-load=0.25")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmperf: judged 1 of 1 benchmarks", "1 passed"])


def test_a_worktree_left_by_a_killed_run_is_removed_by_the_next_comparison(repo):
    from pytest_llmperf import files
    from pytest_llmperf.orchestrate import worktree

    with worktree.checkout("HEAD", repo.path) as ref:
        (ref.toplevel.parent / files.OWNER).write_text("999999999 1.0")  # a pid that no longer runs
        left = ref.toplevel
        # as after SIGKILL: nothing removes it on the way out
        assert worktree.remove_orphans(repo.path) == [(left, 999999999)]
    assert not left.exists() and worktrees(repo) == [f"worktree {repo.path}"]


LOOKS_ENGINE = """
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

ROOT = {root!r}
SWING = (1, -1, 1, -1, 1, -1)  # the working tree's process i at batch size 2: exp(0.3 * SWING[i - 1]) slower


class OneNoisyBatch(SimulatedBackend):
    \"\"\"Steady at batch size 1; at batch size 2 the working tree's processes swing +-30% by their index, so the pairs
    differ by +-0.3 on the log scale: no look of 3 or 6 pairs can show them within the tolerance (deterministic).\"\"\"

    def generate(self, request):
        sample = super().generate(request)
        if request.batch_size == 2 and os.path.realpath(os.getcwd()) == ROOT:
            index = int(os.environ.get("LLMPERF_WORKER_PROCESS", "1"))
            sample.prefill_ns = int(sample.prefill_ns * 2.718281828459045 ** (0.3 * SWING[(index - 1) % 6]))
        return sample


@pytest.mark.llmperf(batch_sizes=[1, 2], runs=3, warmups=0, metrics=["prefill_ms"])
def test_engine(llmperf):
    llmperf.measure(OneNoisyBatch(seed=0, noise=0.001))
"""


def test_a_later_look_measures_only_the_batch_sizes_still_undecided(repo):
    repo.makepyfile(test_engine=LOOKS_ENGINE.format(root=os.path.realpath(repo.path)))
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "looks")
    result = repo.runpytest("--llmperf-device=cpu", "-p", "no:cacheprovider", "--llmperf-compare", "HEAD",
                            "--llmperf-processes=3", "-o", "llmperf_max_processes=6", "--llmperf-max-load=inf",
                            "-W", "ignore::pytest.PytestAssertRewriteWarning")
    report = json.loads((repo.path / "reports" / "cpu.json").read_text())
    batches = {b["batch_size"]: b for b in report["benchmarks"][0]["batches"]}
    processes = {bs: sorted({run["process"] for run in b["runs"]}) for bs, b in batches.items()}
    assert processes[1] == [1, 2, 3]  # decided (pass) at the first look
    assert processes[2] == [1, 2, 3, 4, 5, 6]  # undecided: three more rounds, of this batch size alone
    verdicts = {r["batch_size"]: r["verdict"] for r in report["verdicts"]}
    assert verdicts[1] == "pass" and verdicts[2] == "inconclusive"  # (alpha is not spent on noise)
    result.stdout.fnmatch_lines(["*process 6 of at most 6 on the working tree*"])
