"""The worker's half of worker processes: measure, and report to the controlling pytest process.

In a worker (protocol.py says how the pool starts one and what it answers) `llmperf.measure()` measures as usual
but, instead of judging, hands the result to the `WorkerRecorder`, which appends it to the records file; every test
report (passed, failed, skipped, with its text) goes there too, and progress while it measures (a test started,
run i of n of a batch size: at most one record every PROGRESS_EVERY_S, and each batch size's last run), which the
pool reads while the worker runs (progress.py shows it). pyperf splits its manager and workers the same
way.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from ..measure.instructions import ClientRequests, CountingError, InstructionClock
from ..measure.records import BenchmarkResult, RunSample
from ..measure.runner import RunCallback
from .protocol import (
    ENV_BATCHES,
    ENV_COLLECT,
    ENV_COUNT,
    ENV_IMPORTS,
    ENV_KEEP_DUMPS,
    ENV_OUT,
    ENV_ROOTS,
    Collected,
    CollectError,
    Hello,
    Imports,
    Progress,
    Record,
    Report,
    Result,
    Start,
    process_index,
    to_json,
)
from .turns import TurnClient

#: Seconds between two progress records of a worker (a fast backend finishes many runs a second).
PROGRESS_EVERY_S = 1.0


def collect_out() -> Path | None:
    """The file to report to when this pytest process collects a side's tests for its controller, else None."""
    path = os.environ.get(ENV_COLLECT)
    return Path(path) if path else None


def worker_out() -> Path | None:
    """The file to report to when this pytest process is a worker, else None."""
    path = os.environ.get(ENV_OUT)
    return Path(path) if path else None


def counting_clock() -> InstructionClock | None:
    """In a counting worker, the instruction clock its benchmarks are measured with; else None."""
    out = os.environ.get(ENV_COUNT)
    if not out:
        return None
    try:
        requests = ClientRequests()
    except CountingError as exc:
        raise pytest.UsageError(f"llmperf: {exc}") from None
    if not requests.running_on_valgrind():
        raise pytest.UsageError(f"llmperf: {ENV_COUNT} is set, but this process does not run under valgrind")
    return InstructionClock(requests, Path(out), keep=os.environ.get(ENV_KEEP_DUMPS) == "1")


class WorkerRecorder:
    """A plugin registered only in workers: writes results and test reports to the controller's file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.counter = counting_clock()  # a counting worker: instructions instead of time
        self.turns = TurnClient.from_environ()  # an A/B round's worker: waits for its turn at each run or batch size
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed at unconfigure
        self._write(Hello.of_this_process(counts=self.counter is not None, turns=self.turns is not None))

    def _write(self, record: Record) -> None:
        self._handle.write(to_json(record) + "\n")
        self._handle.flush()

    def record_result(self, nodeid: str, result: BenchmarkResult) -> None:
        index = process_index()
        for batch in result.batches:
            for sample in [*batch.samples, *batch.counted]:
                sample.process = index
        self._write(Result(nodeid, result))

    def on_run(
        self, nodeid: str, key: str, batch_sizes: Sequence[int], clock: Callable[[], float] = time.monotonic
    ) -> RunCallback | None:
        """The runner's per-run callback (measure/runner.py RunCallback) in a worker: progress records for the
        controller, between runs, never inside a timed one. None in a counting worker: a record written or not
        by the wall clock shifts the allocations, so the collector would run inside a counted run on one side
        and not on the other (a prefill counted 1.2% apart between two sides of unchanged code)."""
        if self.counter is not None:
            return None
        sizes = list(batch_sizes)
        last: list[float] = []

        def progress(batch_size: int, kept: int, runs: int, retaken: int, sample: RunSample | None) -> None:
            now = clock()
            if kept < runs and last and now - last[0] < PROGRESS_EVERY_S:
                return
            last[:] = [now]
            position = (sizes.index(batch_size) + 1, len(sizes)) if batch_size in sizes else None
            self._write(Progress(nodeid, key, batch_size, position, kept, runs, retaken))

        return progress

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        if nextitem is None and self.counter is not None:  # the last test's runs are counted: the rest is not
            self.counter.stop()

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self._write(Start(nodeid))

    def batch_sizes(self, nodeid: str) -> dict[int, int | None] | None:
        """The batch sizes of a test this worker measures and the runs of each (None: the scenario's), when the
        controller named them (None: all)."""
        raw = os.environ.get(ENV_BATCHES)
        wanted = json.loads(raw).get(nodeid) if raw else None
        return {int(size): runs for size, runs in wanted.items()} if wanted is not None else None

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.passed and report.when != "call":
            return
        outcome, text = report.outcome, ""
        if report.skipped and isinstance(report.longrepr, tuple):
            text = str(report.longrepr[2])
        elif report.longrepr is not None:
            text = report.longreprtext
        # An xfail marker is evaluated again on the controller's DeferredBenchmark, which carries it: the controller
        # must see what the test body did. Expected to fail and failed: failed; a strict XPASS: it passed.
        if hasattr(report, "wasxfail") and report.skipped:
            outcome, text = "failed", f"xfail: {report.wasxfail}"
        elif report.failed and isinstance(report.longrepr, str) and report.longrepr.startswith("[XPASS(strict)]"):
            outcome, text = "passed", ""
        self._write(Report(report.nodeid, report.when, outcome, text))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self) -> None:
        if os.environ.get(ENV_IMPORTS) != "1":
            return
        from ..environments.installed import imported_distributions

        roots = [Path(p) for p in os.environ.get(ENV_ROOTS, "").split(os.pathsep) if p]
        self._write(Imports(imported_distributions(own=roots), foreign_modules(roots)))

    def close(self) -> None:
        self._handle.close()


def foreign_modules(roots: Sequence[Path]) -> dict[str, str]:
    """The modules of the project in `roots` (a side's directories) that this process imported from elsewhere, by
    name, with the file they came from: an installed copy that shadowed the side's own code."""
    found = {}
    resolved = [root.resolve() for root in roots]
    for root in resolved:
        names = {p.stem for p in root.glob("*.py")} | {p.parent.name for p in root.glob("*/__init__.py")}
        for name in sorted(names):
            module = sys.modules.get(name)
            origin = getattr(module, "__file__", None)
            if origin and not any(r == Path(origin).resolve() or r in Path(origin).resolve().parents for r in resolved):
                found[name] = origin
    return found


class CollectRecorder:
    """A plugin registered only in a side's collection (LLMPERF_COLLECT_OUT): what it collected, and every
    collector that failed, for the controller (protocol.py), which tells a test that is not on that side from one
    that could not be collected there."""

    def __init__(self, path: Path) -> None:
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed at unconfigure
        self._deselected: list[str] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._write(CollectError(report.nodeid, report.longreprtext))

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self._deselected += [item.nodeid for item in items]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._write(Collected([item.nodeid for item in session.items], self._deselected))

    def _write(self, record: Record) -> None:
        self._handle.write(to_json(record) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()
