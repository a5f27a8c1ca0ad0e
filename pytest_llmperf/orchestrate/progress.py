"""Live progress: what a pytest process shows while benchmarks measure, in both modes.

In one process (the first half): a benchmark's sweep, through pytest's terminal reporter, `Progress`. With worker
processes (the second half): the controlling process's status of its workers, `CampaignProgress`. They write
differently because they stand in different places: the first appends its status to pytest's current test line and
erases it with backspaces; the second owns a line of its own before the test loop starts and rewrites it with `\r`.

# In one process
A sweep can take minutes with nothing printed; this shows the benchmark, the batch size, run i of n,
the runs retaken on a busy machine and the running median. What is shown, by where output goes:

| verbosity | terminal (tty)                                        | not a tty (CI logs, files)  |
|-----------|-------------------------------------------------------|-----------------------------|
| -q        | a status after pytest's line, erased when it is done  | nothing                     |
| default   | same                                                  | one line per batch size     |
| -v        | the status, and one line per batch size               | one line per batch size     |

The status is appended to pytest's current line and erased with backspaces, so pytest's own output
(dots, `PASSED`) reads as without it. Lines that stay are written on their own lines; afterwards the
test's line prefix is written again so its result lands where pytest would put it. Capture is suspended
around each write (as pytest's live logging does), so progress reaches the terminal and never enters
a test's captured output. Writes happen between runs, never inside a timed one.

# With worker processes
Each worker appends progress records to its records file (protocol.py: a test started, run i of n of a
batch size); the pool's wait loop reads them every fraction of a second (pool.py) and hands
them here, with the time. What is shown, by where output goes:

| where                  | while a worker runs                                              | when it is done        |
|------------------------|------------------------------------------------------------------|------------------------|
| terminal (tty)         | one status line, rewritten in place: side, process i of N, test, | a line per process:    |
|                        | batch size, run i of n, seconds since the process started        | its tests and seconds  |
| CI log (not a tty)     | the same as a line at least every LINE_EVERY_S seconds           | the same line          |
| CI log with -q         | nothing                                                           | the same line          |

So a log never goes more than LINE_EVERY_S (plus one poll) without a line while workers run, including the
seconds a worker spends importing torch or loading a model before its first run. Times come from an injected
clock; the output goes through an `Output` (the terminal reporter's, or a test's).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from ..measure.metrics import run_values
from ..measure.records import RunSample
from .protocol import Progress as ProgressRecord
from .protocol import Record, Start

if TYPE_CHECKING:
    from ..judge.procedure import Schedule


#: Nanoseconds between two rewrites of the status (a fast backend finishes many runs a second).
STATUS_INTERVAL_NS = 100_000_000


class Progress:
    """Progress of one benchmark. The runner calls `run_done` after every run (kept or retaken)."""

    def __init__(
        self,
        reporter: Any,
        capture: Any,
        *,
        nodeid: str,
        verbosity: int,
        isatty: bool,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.reporter = reporter
        self.capture = capture
        self.nodeid = nodeid
        self.verbosity = verbosity
        self.isatty = isatty
        self.clock = clock
        self.key = ""
        self.batch_sizes: list[int] = []
        self._status = ""  # what is on screen now, to erase
        self._last_status_at: int | None = None
        self._batch: int | None = None
        self._e2e: list[float] = []
        self._tps: list[float] = []
        self._persisted = False

    @property
    def _lines_per_batch(self) -> bool:
        return self.verbosity >= 1 or (not self.isatty and self.verbosity == 0)

    def started(self, key: str, batch_sizes: Sequence[int]) -> None:
        self.key = key
        self.batch_sizes = list(batch_sizes)

    def run_done(self, batch_size: int, kept: int, runs: int, retaken: int, sample: RunSample | None) -> None:
        """After each run: `kept` of `runs` taken so far at `batch_size`; `sample` is None for a run
        discarded because the machine was busy (it will be retaken)."""
        if batch_size != self._batch:
            self._batch, self._e2e, self._tps = batch_size, [], []
            self._last_status_at = None
        if sample is not None:
            values = run_values(sample)
            if "e2e_ms" in values:
                self._e2e.append(values["e2e_ms"])
            if "throughput_tokens_per_s" in values:
                self._tps.append(values["throughput_tokens_per_s"])
        if kept >= runs and sample is not None:
            if self._lines_per_batch:
                self._persist(f"llmperf {self.key}: {self._describe(batch_size, kept, runs, retaken)}")
            else:
                self._erase()
            return
        if self.isatty:
            now = self.clock()
            if self._last_status_at is None or now - self._last_status_at >= STATUS_INTERVAL_NS:
                self._last_status_at = now
                self._show(f"{self._describe(batch_size, kept, runs, retaken)}")

    def finished(self) -> None:
        """Erase the status; if lines were written, give pytest its line prefix back."""
        self._erase()
        if self._persisted and self.reporter is not None:
            with self._uncaptured():
                self.reporter.currentfspath = None  # pytest -v writes the test's line again before its result
                if self.verbosity == 0 and self.nodeid:
                    self.reporter.write_fspath_result(self.nodeid, "")
                self.reporter.flush()
        self._persisted = False

    def _describe(self, batch_size: int, kept: int, runs: int, retaken: int) -> str:
        position = ""
        if batch_size in self.batch_sizes:
            position = f" ({self.batch_sizes.index(batch_size) + 1}/{len(self.batch_sizes)})"
        parts = [f"batch size {batch_size}{position}", f"run {kept}/{runs}"]
        if retaken:
            parts.append(f"{retaken} retaken (busy)")
        if self._e2e:
            parts.append(f"median e2e {statistics.median(self._e2e):.2f} ms")
        if self._tps:
            parts.append(f"{statistics.median(self._tps):.1f} tokens/s")
        return ", ".join(parts)

    def _uncaptured(self) -> Any:
        return self.capture.global_and_fixture_disabled() if self.capture is not None else nullcontext()

    def _show(self, text: str) -> None:
        """Append the status to pytest's current line, replacing the previous one (tty only)."""
        if self.reporter is None:
            return
        tw = self.reporter._tw
        with self._uncaptured():
            # write_raw: pytest's own line (its width, where `PASSED` goes) does not include the status
            room = tw.fullwidth - max(tw.width_of_current_line, 0) - 2
            text = f" [{self.key}: {text}]"[: max(room, 0)]
            old = len(self._status)
            pad = max(old - len(text), 0)
            tw.write_raw("\b" * old + text + " " * pad + "\b" * pad, flush=True)
            self._status = text

    def _erase(self) -> None:
        if self.reporter is None or not self._status:
            return
        n = len(self._status)
        with self._uncaptured():
            self.reporter._tw.write_raw("\b" * n + " " * n + "\b" * n, flush=True)
        self._status = ""

    def _persist(self, line: str) -> None:
        """A line that stays: on a line of its own, the cursor left at its end (pytest ends it)."""
        if self.reporter is None:
            return
        self._erase()
        with self._uncaptured():
            self.reporter._tw.write("\n" + line, flush=True)
        self._persisted = True


@contextmanager
def benchmark(
    config: pytest.Config | None, nodeid: str, key: str, batch_sizes: Sequence[int]
) -> Iterator[Callable[..., None] | None]:
    """`with benchmark(config, nodeid, key, sizes) as on_run:` the runner's per-run callback
    (None without a terminal reporter, e.g. `-p no:terminal` or an xdist worker)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter") if config is not None else None
    if config is None or reporter is None:
        yield None
        return
    progress = Progress(
        reporter,
        config.pluginmanager.get_plugin("capturemanager"),
        nodeid=nodeid,
        verbosity=config.get_verbosity(),
        isatty=bool(reporter.isatty()),
    )
    progress.started(key, batch_sizes)
    try:
        yield progress.run_done
    finally:
        progress.finished()


# With worker processes: the controller's status of its workers.

#: Not a tty: a line at least this often while a worker runs (issue 22: no silence longer than 10 s).
LINE_EVERY_S = 8.0
#: A first look expected to take longer than this is announced with its estimate (campaign_estimate).
LONG_FIRST_LOOK_S = 5 * 60
#: A tty: the status line is rewritten at most this often.
STATUS_EVERY_S = 0.25


class Output(Protocol):
    def line(self, text: str) -> None:
        """A line that stays."""

    def status(self, text: str) -> None:
        """Replace the status line with `text` ("" erases it)."""


@dataclass
class WorkerState:
    """What one running worker process is doing, as far as its records tell."""

    side: str  # "the working tree", "origin/main (abc1234)"
    index: int
    total: int  # the processes of the first look, or past it the cap ("of at most")
    tests: int
    started: float
    at_most: bool = False
    test: str = ""
    batch_size: int | None = None
    position: tuple[int, int] | None = None  # the batch size's place among the test's batch sizes
    run: int = 0
    runs: int = 0
    retaken: int = 0

    def update(self, record: Record) -> None:
        if isinstance(record, Start):
            self.test = _name(record.nodeid)
            self.batch_size, self.position, self.run, self.runs, self.retaken = None, None, 0, 0, 0
        elif isinstance(record, ProgressRecord):
            self.test = record.key or _name(record.nodeid)
            self.batch_size, self.position = record.batch_size, record.position
            self.run, self.runs, self.retaken = record.run, record.runs, record.retaken

    @property
    def of_total(self) -> str:
        return f"{self.index} of {'at most ' if self.at_most else ''}{self.total}"

    def describe(self, now: float) -> str:
        parts = [f"process {self.of_total} on {self.side}"]
        if self.test:
            parts.append(self.test)
        if self.batch_size is None:
            parts.append("starting" if not self.test else "loading")
        else:
            where = f" ({self.position[0]}/{self.position[1]})" if self.position else ""
            parts.append(f"batch size {self.batch_size}{where}, run {self.run}/{self.runs}")
            if self.retaken:
                parts.append(f"{self.retaken} retaken (busy)")
        return ", ".join(parts) + f", {now - self.started:.0f} s"


def _name(nodeid: str) -> str:
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


@dataclass
class CampaignProgress:
    """Progress of a campaign of worker processes: one at a time, or the two of an A/B round taking turns (the line
    shows the one that reported last: the one measuring)."""

    out: Output
    isatty: bool
    verbosity: int
    clock: Callable[[], float] = time.monotonic
    workers: dict[str, WorkerState] = field(default_factory=dict)  # by side
    active: str | None = None  # the side whose records came last
    _last_line: float | None = None
    _last_status: float | None = None
    _shown: str = field(default="", repr=False)

    def say(self, text: str) -> None:
        """A line of the campaign's own (a worktree checked out, a ref's tests collected)."""
        self.clear()
        self.out.line(f"llmperf: {text}")
        self._last_line = self.clock()

    def note(self, text: str) -> None:
        """What the campaign is doing while no worker reports records (counting workers under valgrind): the status
        line on a tty, else a line when one is due."""
        now = self.clock()
        if self.isatty:
            if self._last_status is None or now - self._last_status >= STATUS_EVERY_S:
                self._last_status, self._shown = now, text
                self.out.status(f"llmperf: {text}")
        elif self.verbosity >= 0 and (self._last_line is None or now - self._last_line >= LINE_EVERY_S):
            self._last_line = now
            self.out.line(f"llmperf: {text}")

    def started(self, side: str, index: int, total: int, tests: int, *, at_most: bool = False) -> None:
        """A worker started: process `index` of `total` (at_most: of the cap, past the first look)."""
        now = self.clock()
        self.workers[side] = WorkerState(side, index, total, tests, now, at_most=at_most)
        self.active = self.active if self.active in self.workers else side
        if self._last_line is None:
            self._last_line = now  # the first periodic line comes LINE_EVERY_S after the campaign starts
        self.tick()

    def records(self, records: Iterable[Record], side: str | None = None) -> None:
        """A worker's new records (possibly none): update what it is doing, and show it when due. `side` names
        the worker when two run at once."""
        side = side if side is not None else self.active
        worker = self.workers.get(side) if side is not None else None
        if worker is None:
            return
        for record in records:
            worker.update(record)
            if isinstance(record, (Start, ProgressRecord)):
                self.active = side
        self.tick()

    def tick(self) -> None:
        worker = self.workers.get(self.active) if self.active is not None else None
        if worker is None:
            return
        now = self.clock()
        text = worker.describe(now)
        if self.isatty:
            if self._last_status is None or now - self._last_status >= STATUS_EVERY_S:
                self._last_status = now
                self._shown = text
                self.out.status(f"llmperf: {text}")
        elif self.verbosity >= 0 and (self._last_line is None or now - self._last_line >= LINE_EVERY_S):
            self._last_line = now
            self.out.line(f"llmperf: {text}")

    def done(self, seconds: float, side: str | None = None) -> None:
        """A worker finished: its line, which stays."""
        side = side if side is not None else self.active
        worker = self.workers.pop(side, None) if side is not None else None
        if worker is None:
            return
        if self.active == side:
            self.active = next(iter(self.workers), None)
        self.say(f"process {worker.of_total} on {worker.side}: {worker.tests} test(s) in {seconds:.1f} s")

    def clear(self) -> None:
        """Erase the status line (a tty), e.g. before a failed worker's error or at the campaign's end."""
        if self._shown:
            self.out.status("")
            self._shown = ""
            self._last_status = None


class TerminalOutput:
    """`Output` through pytest's terminal reporter; capture is suspended around each write."""

    def __init__(self, reporter: Any, capture: Any) -> None:
        self.reporter = reporter
        self.capture = capture
        self._width = 0

    def _uncaptured(self) -> Any:
        return self.capture.global_and_fixture_disabled() if self.capture is not None else contextlib.nullcontext()

    def line(self, text: str) -> None:
        with self._uncaptured():
            self.reporter.write_line(text)

    def status(self, text: str) -> None:
        tw = self.reporter._tw
        text = text[: max(tw.fullwidth - 1, 10)]
        with self._uncaptured():
            tw.write("\r" + text + " " * max(self._width - len(text), 0) + ("\r" if not text else ""), flush=True)
        self._width = len(text)


class SilentOutput:
    """`Output` where there is no terminal reporter (`-p no:terminal`): nothing is shown."""

    def line(self, text: str) -> None:
        pass

    def status(self, text: str) -> None:
        pass


def for_terminal(config: pytest.Config) -> CampaignProgress:
    """The campaign's progress on pytest's terminal (silent without a terminal reporter, `-p no:terminal`)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return CampaignProgress(SilentOutput(), isatty=False, verbosity=-1)
    return CampaignProgress(
        TerminalOutput(reporter, config.pluginmanager.get_plugin("capturemanager")),
        isatty=bool(reporter.isatty()),
        verbosity=config.get_verbosity(),
    )


def campaign_estimate(round_s: float, schedules: Sequence[Schedule], budget_s: float | None = None) -> str | None:
    """How long the campaign will take at the first round's pace, when its first look takes more than
    LONG_FIRST_LOOK_S (--llmperf-processes=1000 ran 1000 rounds, about 50 minutes, without a word); `budget_s`: the
    most seconds an A/B job's rounds may take."""
    if not schedules:
        return None
    first = max(schedule.looks[0] for schedule in schedules)
    cap = max(schedule.cap for schedule in schedules)
    if round_s * first <= LONG_FIRST_LOOK_S:
        return None
    most = round_s * cap if budget_s is None else min(round_s * cap, max(budget_s, round_s * first))
    bounds = "the cap, llmperf_max_processes" if budget_s is None else "the cap or the budget, --llmperf-budget"
    up_to = f", up to {most / 60:.0f} min if rows stay undecided ({bounds})" if most > round_s * first else ""
    return (
        f"at {round_s:.1f} s per round, the first look's {first} rounds take about {round_s * first / 60:.0f} "
        f"min{up_to}; fewer processes (--llmperf-processes) take less. Ctrl-C stops cleanly"
    )
