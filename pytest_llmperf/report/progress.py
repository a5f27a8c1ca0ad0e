"""Live progress of a benchmark's sweep through pytest's terminal reporter.

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
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest

from ..measure.metrics import run_values
from ..measure.records import RunSample

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
