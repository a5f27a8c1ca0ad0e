"""Live progress with worker processes: workers append progress records, the manager reads them while they run,
and the controller shows them (a status line on a terminal, a line at least every LINE_EVERY_S in a CI log).
Timing logic runs on injected clocks; one test follows real workers end to end."""

import json
import subprocess

import pytest

import pytest_llmperf
from pytest_llmperf.orchestrate import pool, progress, protocol, worker
from pytest_llmperf.orchestrate.progress import LINE_EVERY_S, STATUS_EVERY_S, CampaignProgress
from pytest_llmperf.orchestrate.protocol import Progress, Start


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Recorded:
    """An Output that keeps what was written, with the clock's time."""

    def __init__(self, clock):
        self.clock = clock
        self.lines = []
        self.statuses = []

    def line(self, text):
        self.lines.append((self.clock(), text))

    def status(self, text):
        self.statuses.append((self.clock(), text))


def progress_record(batch_size, run, runs=10, position=(1, 2), retaken=0, key="test_a[x]"):
    return Progress(f"t.py::{key}", key, batch_size, position, run, runs, retaken)


def poll_for(progress, clock, seconds, records=()):
    """The pool's loop: a poll every POLL_S, records handed over on the first."""
    pending = list(records)
    end = clock.now + seconds
    while clock.now < end:
        clock.now += pool.POLL_S
        progress.records(pending)
        pending = []


def test_a_ci_log_gets_a_line_at_least_every_line_every_s_from_the_first_second():
    clock = Clock()
    out = Recorded(clock)
    progress = CampaignProgress(out, isatty=False, verbosity=0, clock=clock)
    progress.started("the working tree", 1, 5, 2)
    poll_for(progress, clock, 9)  # importing torch: no record yet
    poll_for(progress, clock, 30, [Start("t.py::test_a[x]")])
    poll_for(progress, clock, 10, [progress_record(2, 4, retaken=1)])
    times = [0.0] + [t for t, _ in out.lines]
    assert max(b - a for a, b in zip(times, times[1:])) <= LINE_EVERY_S
    assert out.lines[0][1] == "llmperf: process 1 of 5 on the working tree, starting, 8 s"
    assert "llmperf: process 1 of 5 on the working tree, test_a[x], loading, 16 s" in [t for _, t in out.lines]
    assert out.lines[-1][1] == ("llmperf: process 1 of 5 on the working tree, test_a[x], batch size 2 (1/2), run 4/10, "
                                "1 retaken (busy), 48 s")
    progress.done(45.04)
    assert out.lines[-1][1] == "llmperf: process 1 of 5 on the working tree: 2 test(s) in 45.0 s"
    assert out.statuses == []  # nothing written in place in a log


def test_quiet_in_a_log_shows_only_the_line_of_each_finished_process():
    clock = Clock()
    out = Recorded(clock)
    progress = CampaignProgress(out, isatty=False, verbosity=-1, clock=clock)
    progress.started("origin/main (abc1234)", 3, 8, 1)
    poll_for(progress, clock, 30, [progress_record(1, 1)])
    progress.done(30.0)
    assert [t for _, t in out.lines] == ["llmperf: process 3 of 8 on origin/main (abc1234): 1 test(s) in 30.0 s"]


def test_a_terminal_gets_one_status_line_rewritten_in_place_and_erased_before_a_line():
    clock = Clock()
    out = Recorded(clock)
    progress = CampaignProgress(out, isatty=True, verbosity=0, clock=clock)
    progress.started("the working tree", 2, 5, 1)
    for run in range(1, 11):
        clock.now += 0.0625  # runs faster than the status is rewritten
        progress.records([progress_record(1, run)])
    times = [t for t, _ in out.statuses]
    assert all(b - a >= STATUS_EVERY_S for a, b in zip(times, times[1:]))
    assert out.statuses[0][1] == "llmperf: process 2 of 5 on the working tree, starting, 0 s"
    assert out.statuses[-1][1].startswith("llmperf: process 2 of 5 on the working tree, test_a[x], batch size 1 (1/2)")
    assert out.lines == []
    progress.done(1.0)
    assert out.statuses[-1][1] == "" and out.lines == [(clock.now, "llmperf: process 2 of 5 on the working tree: "
                                                                   "1 test(s) in 1.0 s")]


def test_past_the_first_look_a_worker_is_counted_against_the_cap():
    clock = Clock()
    out = Recorded(clock)
    progress = CampaignProgress(out, isatty=False, verbosity=0, clock=clock)
    progress.started("the working tree", 7, 25, 1, at_most=True)
    progress.done(6.5)
    assert out.lines == [(clock.now, "llmperf: process 7 of at most 25 on the working tree: 1 test(s) in 6.5 s")]


def test_two_workers_taking_turns_show_the_one_measuring_and_each_ends_with_its_line():
    clock = Clock()
    out = Recorded(clock)
    progress = CampaignProgress(out, isatty=True, verbosity=0, clock=clock)
    progress.started("HEAD (abc1234)", 1, 5, 1)
    progress.started("the working tree", 1, 5, 1)
    clock.now += 1.0
    progress.records([Progress("t.py::a", "a", 2, (1, 2), 1, 3)], side="the working tree")
    assert out.statuses[-1][1] == "llmperf: process 1 of 5 on the working tree, a, batch size 2 (1/2), run 1/3, 1 s"
    clock.now += 1.0
    progress.records([Progress("t.py::a", "a", 2, (1, 2), 3, 3)], side="HEAD (abc1234)")
    assert out.statuses[-1][1] == "llmperf: process 1 of 5 on HEAD (abc1234), a, batch size 2 (1/2), run 3/3, 2 s"
    progress.done(2.5, side="HEAD (abc1234)")
    progress.done(2.5, side="the working tree")
    assert [line for _, line in out.lines] == ["llmperf: process 1 of 5 on HEAD (abc1234): 1 test(s) in 2.5 s",
                                               "llmperf: process 1 of 5 on the working tree: 1 test(s) in 2.5 s"]
    assert progress.workers == {}


def test_a_worker_writes_a_progress_record_at_most_every_second_and_each_batch_sizes_last_run(tmp_path, monkeypatch):
    monkeypatch.setenv(protocol.ENV_PROCESS, "2")
    clock = Clock()
    recorder = worker.WorkerRecorder(tmp_path / "w.jsonl")
    on_run = recorder.on_run("t.py::test_a", "test_a", [1, 4], clock=clock)
    for batch_size in (1, 4):
        for run in range(1, 11):
            clock.now += 0.25
            on_run(batch_size, run, 10, 0, None)
    recorder.close()
    records = [json.loads(line) for line in (tmp_path / "w.jsonl").read_text().splitlines()]
    assert records[0] == {"type": "hello", "protocol": protocol.PROTOCOL, "pid": records[0]["pid"], "process": 2,
                          "counts": False, "turns": False, "plugin": pytest_llmperf.__version__}
    progress = records[1:]
    assert [(r["batch_size"], r["run"]) for r in progress] == [(1, 1), (1, 5), (1, 9), (1, 10), (4, 4), (4, 8),
                                                               (4, 10)]
    assert progress[-1] == {"type": "progress", "nodeid": "t.py::test_a", "key": "test_a", "batch_size": 4,
                            "position": [2, 2], "run": 10, "runs": 10, "retaken": 0}


def test_the_pool_reads_whole_records_only(tmp_path):
    path = tmp_path / "w.jsonl"
    tail = pool.RecordTail(path)
    assert tail.new() == []  # not written yet
    line = protocol.to_json(Progress("a", "a", 1, None, 1, 3))
    path.write_text('{"type": "start", "nodeid": "a"}\n' + line[:10])
    assert tail.new() == [Start("a")]
    with open(path, "a") as handle:
        handle.write(line[10:] + '\nnot json\n{"type": "start"}\n')  # a line that is no record is skipped
    assert tail.new() == [Progress("a", "a", 1, None, 1, 3)]
    assert tail.new() == []


class Running:
    """A worker process that runs until the clock passes `exits_at`."""

    args = ["pytest"]

    def __init__(self, clock, exits_at):
        self.clock, self.exits_at = clock, exits_at

    def wait(self, timeout):
        if self.clock.now + timeout >= self.exits_at:
            self.clock.now = self.exits_at
            return 0
        self.clock.now += timeout
        raise subprocess.TimeoutExpired(self.args, timeout)


def running_worker(tmp_path, proc):
    spec = protocol.WorkerSpec(protocol.Side("", tmp_path, "the working tree"), 1, ("t.py::a",))
    with open(tmp_path / "w.log", "wb") as log:
        return pool.RunningWorker(spec, proc, tmp_path / "none.jsonl", tmp_path / "w.log", log, tmp_path, 0.0)


def test_the_wait_loop_hands_over_records_every_poll_and_stops_at_the_deadline(tmp_path):
    clock = Clock()
    polls = []
    assert running_worker(tmp_path, Running(clock, 3.2)).wait(10, lambda r: polls.append(clock.now), clock=clock) == 0
    assert polls == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
    with pytest.raises(subprocess.TimeoutExpired):
        running_worker(tmp_path, Running(clock, 100)).wait(2, lambda r: None, clock=clock)
    assert clock.now == pytest.approx(3.2 + 2)


# -- end to end: real workers, their records, the controller's lines ---------------------------------------

SLOW = """
import time
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

class Slow(SimulatedBackend):
    def generate(self, request):
        time.sleep(0.1)
        return super().generate(request)

@pytest.mark.llmperf(batch_sizes=[1, 2], runs=8, warmups=0)
def test_slow(llmperf):
    llmperf.measure(Slow())
"""


def test_workers_progress_reaches_the_controllers_log(pytester, monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # not the suite's --llmperf-processes=1
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.5)  # the controller runs in this process
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_slow=SLOW)
    result = pytester.runpytest("--llmperf-device=cpu", "--llmperf-machine=m", "-p", "no:cacheprovider",
                                "--llmperf-max-load=inf", "--llmperf-processes=2", "--llmperf-update",
                                "-W", "ignore::pytest.PytestAssertRewriteWarning")
    result.assert_outcomes(passed=1)
    lines = [line for line in result.stdout.lines if line.startswith("llmperf: process ")]
    # an update records twice --llmperf-processes
    assert any(re_match(line, r"llmperf: process 1 of 4 on the working tree, test_slow, batch size \d \(\d/2\), "
                              r"run \d/8, \d+ s") for line in lines), lines
    assert "llmperf: process 4 of 4 on the working tree: 1 test(s) in" in "\n".join(lines)


def re_match(text, pattern):
    import re

    return re.fullmatch(pattern, text) is not None


@pytest.mark.parametrize("isatty", [False, True])
def test_counting_workers_are_never_silent_for_long(isatty):
    """Counting workers write no progress records (a record written or not by the wall clock would shift what a
    counted run allocates): the controller notes that they run, every second, and a line or status is shown when
    due."""
    clock = Clock()
    out = Recorded(clock)
    progress = CampaignProgress(out, isatty=isatty, verbosity=0, clock=clock)
    for second in range(1, 31):
        clock.now = float(second)
        progress.note(f"counting instructions under callgrind: 0 of 2 process(es) done, {second} s")
    if isatty:
        assert len(out.statuses) == 30 and out.lines == []
    else:
        times = [t for t, _ in out.lines]
        assert times[0] == 1.0 and all(b - a == LINE_EVERY_S for a, b in zip(times, times[1:]))
        assert out.lines[-1][1] == f"llmperf: counting instructions under callgrind: 0 of 2 process(es) done, " \
                                   f"{int(times[-1])} s"
    progress.say("counted instructions under callgrind")
    assert out.lines[-1][1] == "llmperf: counted instructions under callgrind"
    assert [text for _, text in out.statuses[-1:]] == ([""] if isatty else [])  # erased before the line that stays
