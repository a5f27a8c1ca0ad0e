"""Turns: the two workers of an A/B round measure one at a time, ABBA over their batch sizes (orchestrate/turns.py).

The broker is driven with small worker scripts that log when they hold the turn; then end to end, through
pytester, an A/B comparison whose backend logs the span of every batch size it measured on either side.
"""

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from pytest_llmperf.orchestrate.turns import ENV_TURNS, TurnBroker, TurnClient
from pytest_llmperf.orchestrate.session import INTERLEAVED

# A worker: `blocks` batch sizes, each asked for, then held HOLD_S while it logs its span; `free` ignores turns.
WORKER = """
import json, os, sys, time
sys.path.insert(0, {root!r})
from pytest_llmperf.orchestrate.turns import TurnClient
name, blocks, free, log = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "free", sys.argv[4]
client = None if free else TurnClient.from_environ()
for block in range(blocks):
    if client is not None:
        client.wait()
    start = time.monotonic()
    time.sleep({hold})
    with open(log, "a") as handle:
        handle.write(json.dumps([name, block, start, time.monotonic()]) + "\\n")
"""
HOLD_S = 0.15


def run_workers(tmp_path, workers, order=("A", "B")):
    """Start each (name, blocks, free) worker with its pipes and step the broker until all exited: their spans."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=os.getcwd(), hold=HOLD_S))
    log = tmp_path / "spans.jsonl"
    broker = TurnBroker(list(order))
    procs = []
    for name, blocks, free in workers:
        fds = broker.pipes(name)
        env = {ENV_TURNS: ",".join(map(str, fds))}
        if free:
            broker.ignores_turns(name)
        procs.append(subprocess.Popen([sys.executable, str(script), name, str(blocks), "free" if free else "turns",
                                       str(log)], env={**os.environ, **env}, pass_fds=fds))
        broker.release_child_ends(fds)
    deadline = time.monotonic() + 60
    while not broker.finished and time.monotonic() < deadline:
        broker.step(0.05)
    for proc in procs:
        assert proc.wait(timeout=10) == 0
    broker.close()
    assert broker.finished
    return sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda span: span[2])


def overlapping(spans):
    return [(a, b) for a, b in zip(spans, spans[1:]) if b[2] < a[3]]


@pytest.mark.slow
def test_two_workers_take_turns_abba_and_never_measure_at_once(tmp_path):
    spans = run_workers(tmp_path, [("A", 4, False), ("B", 4, False)])
    assert [s[0] for s in spans] == list("ABBAABBA")
    assert overlapping(spans) == []


@pytest.mark.slow
def test_the_round_order_decides_who_goes_first(tmp_path):
    spans = run_workers(tmp_path, [("A", 2, False), ("B", 2, False)], order=("B", "A"))
    assert [s[0] for s in spans] == list("BAAB")


@pytest.mark.slow
def test_a_worker_with_fewer_batch_sizes_drops_out_and_the_other_goes_on(tmp_path):
    spans = run_workers(tmp_path, [("A", 1, False), ("B", 4, False)])
    assert [s[0] for s in spans] == list("ABBBB")
    assert overlapping(spans) == []


@pytest.mark.slow
def test_a_worker_that_ignores_turns_measures_alone_before_the_other_is_given_one(tmp_path):
    spans = run_workers(tmp_path, [("A", 3, True), ("B", 2, False)])
    assert [s[0] for s in spans] == list("AAABB")
    assert overlapping(spans) == []


def test_a_client_reads_its_descriptors_from_the_environment_and_nothing_else():
    assert TurnClient.from_environ({}) is None
    assert TurnClient.from_environ({ENV_TURNS: "not,numbers"}) is None
    assert TurnClient.from_environ({ENV_TURNS: "987654,987655"}) is None  # not open in this process
    read_fd, write_fd = os.pipe()
    try:
        client = TurnClient.from_environ({ENV_TURNS: f"{read_fd},{write_fd}"})
        assert client is not None and (client.read_fd, client.write_fd) == (read_fd, write_fd)
    finally:
        os.close(read_fd), os.close(write_fd)


def test_a_client_whose_controller_is_gone_stops_waiting():
    give_r, give_w = os.pipe()
    ask_r, ask_w = os.pipe()
    os.close(give_w)  # the controller's end: gone
    client = TurnClient(give_r, ask_w)
    client.wait()
    assert not client.open
    client.wait()  # returns at once from now on
    assert os.read(ask_r, 8) == b"?"
    for fd in (give_r, ask_r, ask_w):
        os.close(fd)


def test_taking_turns_run_by_run_asks_before_the_warmups_and_before_every_run_retakes_included(monkeypatch):
    from pytest_llmperf.backends.simulated import SimulatedBackend
    from pytest_llmperf.measure import runner
    from pytest_llmperf.measure.scenario import Scenario

    events = []

    class Logged(SimulatedBackend):
        def generate(self, request):
            events.append(f"run{request.batch_size}")
            return super().generate(request)

    loads = iter([0.0, 2.0, 0.0, 0.0] * 2)  # the second run of each batch size is retaken (a busy machine)

    class Meter:
        def stop(self):
            return next(loads)

    monkeypatch.setattr(runner, "LoadMeter", Meter)
    result = runner.measure(Logged(), Scenario(batch_sizes=(1, 2), runs=3, warmups=2, max_load=0.5), key="k",
                            nodeid="n", module="m", before_run=lambda: events.append("turn"))
    assert [len(b.samples) for b in result.batches] == [3, 3]
    # per batch size: one turn for both warmups, then one before each of the 4 runs (3 kept, 1 retaken)
    per_batch = ["turn", "run{0}", "run{0}"] + ["turn", "run{0}"] * 4
    assert events == [e.format(1) for e in per_batch] + [e.format(2) for e in per_batch]


# -- end to end: an A/B comparison's two sides through pytester ------------------------------------------------

ENGINE = """
import json, os, time
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

if os.environ.get("PIDS_LOG") and os.environ.get("LLMPERF_WORKER_PROCESS"):  # a worker process
    with open(os.environ["PIDS_LOG"], "a") as handle:
        handle.write(f"{os.getpid()}\\n")


class Logged(SimulatedBackend):
    # each run sleeps 20 ms and logs its span with its side (the worker's directory)
    def generate(self, request):
        start = time.monotonic()
        time.sleep(0.02)
        with open(os.environ["SPANS_LOG"], "a") as handle:
            handle.write(json.dumps([os.getcwd(), request.batch_size, start, time.monotonic()]) + "\\n")
        return super().generate(request)

@pytest.mark.llmperf(batch_sizes=[1, 2, 4], runs=2, warmups=1)
def test_engine(llmperf):
    llmperf.measure(Logged(seed=int(os.environ.get("LLMPERF_WORKER_PROCESS", "0")), noise=0.005))
"""


@pytest.fixture
def ab_repo(pytester, monkeypatch, tmp_path):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # not the suite's --llmperf-processes=1
    monkeypatch.setenv("SPANS_LOG", str(tmp_path / "spans.jsonl"))
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=ENGINE)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=pytester.path, check=True, capture_output=True)
    return pytester


def spans_of(log):
    """Every generate() call (warmups too) in time order: [side, batch size, start, end]."""
    return sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda span: span[2])


def batch_blocks(log):
    """The spans of the runs, merged per side and batch size into blocks, in time order."""
    blocks = []
    for side, batch_size, start, end in spans_of(log):
        if blocks and blocks[-1][:2] == [side, batch_size]:
            blocks[-1][3] = end
        else:
            blocks.append([side, batch_size, start, end])
    return blocks


def run_ab(pytester, *args):
    return pytester.runpytest("--llmperf-device=cpu", "-p", "no:cacheprovider", "--llmperf-compare=HEAD",
                              "--llmperf-processes=5", "-o", "llmperf_max_processes=5", "--llmperf-max-load=inf",
                              "--llmperf-alpha=0.05", *args)


@pytest.mark.parametrize("interleave", ["run", "batch", "process"])
def test_an_ab_round_alternates_its_sides_per_run_per_batch_size_or_per_process(ab_repo, tmp_path, interleave):
    result = run_ab(ab_repo, "-o", f"llmperf_interleave={interleave}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*the working tree against HEAD (A/B, {INTERLEAVED[interleave]})*"])
    blocks = batch_blocks(tmp_path / "spans.jsonl")
    sides = sorted({b[0] for b in blocks})
    assert len(sides) == 2 and str(ab_repo.path) in sides  # the working tree and the ref's worktree
    assert overlapping(blocks) == []  # never both sides at once
    letters = "".join("B" if b[0] == str(ab_repo.path) else "A" for b in blocks)
    if interleave == "run":  # a turn for the warmup, then one per run: A B, B A, ... within each batch size
        spans = spans_of(tmp_path / "spans.jsonl")
        assert overlapping(spans) == []
        calls = "".join("B" if s[0] == str(ab_repo.path) else "A" for s in spans)
        assert calls[:18] == "AB" + "BAAB" * 4  # round 1: 3 batch sizes x (warmup + 2 runs) x 2 sides
        assert [s[1] for s in spans[:18]] == [1] * 6 + [2] * 6 + [4] * 6  # a pair's runs are of one batch size
        assert calls[18:24] == "BAABBA"  # round 2 starts with B
    elif interleave == "batch":  # round 1: A B, B A, A B over batch sizes 1, 2, 4; round 2 starts with B
        assert letters[:12] == "ABBAABBAABBA"
    else:  # round 1: all of A's batch sizes, then B's; round 2: B's, then A's
        assert letters[:12] == "AAABBBBBBAAA"


def alive(pids_log):
    pids = [int(line) for line in pids_log.read_text().split()] if pids_log.exists() else []
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_worker_crashing_in_an_ab_round_fails_with_its_log_and_the_other_worker_is_stopped(ab_repo, tmp_path,
                                                                                              monkeypatch):
    monkeypatch.setenv("PIDS_LOG", str(tmp_path / "pids"))
    test_file = ab_repo.path / "test_engine.py"  # uncommitted: only the working tree's worker crashes
    test_file.write_text(test_file.read_text().replace("    llmperf.measure(Logged(", "    os._exit(3)\n"
                                                                                     "    llmperf.measure(Logged("))
    result = run_ab(ab_repo)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*worker process 1 on the working tree exited with code 3*"])
    # the A worker may be stopped before it logs its pid (it failed so twice in fresh clones): every logged worker
    # is gone, and tox's leak check (tests/doubles/leaks.py) finds any that was not logged
    assert 1 <= len((tmp_path / "pids").read_text().split()) <= 2 and alive(tmp_path / "pids") == []


def test_a_worker_hanging_in_an_ab_round_is_named_and_both_are_stopped(ab_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("PIDS_LOG", str(tmp_path / "pids"))
    test_file = ab_repo.path / "test_engine.py"  # the working tree's worker never asks for its turn
    test_file.write_text(test_file.read_text().replace("    llmperf.measure(Logged(", "    time.sleep(600)\n"
                                                                                     "    llmperf.measure(Logged("))
    started = time.monotonic()
    result = run_ab(ab_repo, "-o", "llmperf_worker_timeout=15")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*worker process 1 on the working tree did not finish within its A/B round's 30 s "
                                 "(2 x llmperf_worker_timeout); it was stopped*"])
    assert time.monotonic() - started < 120
    assert alive(tmp_path / "pids") == []


def test_collecting_the_refs_tests_past_the_deadline_fails_the_tests_saying_so(ab_repo, monkeypatch):
    conftest = ab_repo.path / "conftest.py"  # committed: the ref's collection sleeps; the working tree's does not
    conftest.write_text("import os, time\nif os.environ.get('SLOW_COLLECT'):\n    time.sleep(30)\n")
    for args in (["add", "conftest.py"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "slow"]):
        subprocess.run(["git", *args], cwd=ab_repo.path, check=True, capture_output=True)
    conftest.write_text("")
    monkeypatch.setenv("SLOW_COLLECT", "1")
    result = run_ab(ab_repo, "-o", "llmperf_worker_timeout=3")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*llmperf: collecting the tests on HEAD (*) did not finish within 3 s "
                                 "(llmperf_worker_timeout)*"])
    assert "INTERNALERROR" not in result.stdout.str()
