"""Live progress of worker processes: what the controlling pytest process shows while its workers measure.

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
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from .protocol import Progress, Record, Start

if TYPE_CHECKING:
    from ..judge.procedure import Schedule

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
        elif isinstance(record, Progress):
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
            if isinstance(record, (Start, Progress)):
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
