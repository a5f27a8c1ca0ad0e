"""The `llmperf` fixture object: `llmperf.measure(backend)` is the whole way of one benchmark, in this process or in
a worker process.

Scenario from the marker and options, then measured (measure/runner.py). `LocalBenchmark` (measured in the pytest
process itself) records it (update modes) or judges it look by look against its stored baseline: the batch sizes
with undecided rows get more runs, doubling up to max_runs (judge/procedure.py); and fails the test with an
actionable message where --llmperf-fail-on says so. In a worker process the fixture is a `WorkerBenchmark`, which
measures what the controller still needs and hands it to the `WorkerRecorder` (worker.py), which reports it; the
controller judges.

A deadline for a measurement in the pytest process itself (--llmperf-processes=1), as a worker process has one. A
worker process that runs past llmperf_worker_timeout is stopped by its controller. In one process nothing could stop
a `generate()` that never returns: the whole session hung. `deadline` arms SIGALRM (POSIX, main thread) and raises
`Overtime` in the measuring code when it fires. Overtime is a BaseException, so a backend's `except Exception` does
not swallow it. Python runs the handler between bytecodes: a call that hangs inside native code without returning is
stopped only by worker processes' deadline (their default). Where another plugin owns SIGALRM (pytest-timeout's
signal method), its timer is left alone and this deadline is not armed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ..judge.verdicts import Outcome
from ..measure import runner
from ..measure.backend import Backend
from ..measure.instructions import COUNTED_RUNS, not_counted
from ..measure.keywords import OVERRIDES, build_scenario
from ..measure.metrics import MEMORY_METRICS, METRICS, gated_metrics
from ..measure.records import BatchResult, BenchmarkResult
from ..measure.scenario import Scenario, ScenarioError, check_metrics, check_rtol_metrics
from . import progress
from .options import marker_kwargs
from .session import MEASURED_KEY, LLMPerfSession
from .worker import WorkerRecorder


class Overtime(BaseException):
    """The measurement ran past its deadline."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[bool]:
    """Raise Overtime in this block after `seconds`; yields whether the deadline could be armed."""
    usable = (
        hasattr(signal, "SIGALRM")
        and threading.current_thread() is threading.main_thread()
        and seconds > 0
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )
    if not usable:
        yield False
        return

    def expire(signum: int, frame: Any) -> None:
        raise Overtime(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Benchmark:
    """The `llmperf` fixture: measures backends for one test and gates them against baselines."""

    def __init__(self, session: LLMPerfSession, item: pytest.Item) -> None:
        self.session = session
        self.item = item
        self.marker_kwargs: dict[str, Any] = marker_kwargs(item)
        self.results: list[BenchmarkResult] = []

    @property
    def device(self) -> str:
        return self.session.device

    @property
    def on_gpu(self) -> bool:
        return self.session.device != "cpu"

    def model(self, name: str) -> Path:
        """The local directory of a model name (embedded, mapped with --llmperf-model, or a path)."""
        return self.session.resolve_model(name)

    def measure(self, backend: Backend, *, name: str | None = None, **overrides: Any) -> BenchmarkResult:
        """Run this test's scenario on `backend` and gate it. Keyword overrides beat the marker."""
        __tracebackhide__ = True
        self.item.stash[MEASURED_KEY] = True
        scenario = self._scenario(backend, overrides)
        nodeid = self.item.nodeid
        key = nodeid.split("::", 1)[1] if "::" in nodeid else self.item.name
        key = f"{key}::{name}" if name else key
        if any(r.key == key for r in self.results):
            raise ScenarioError(f"{key} was measured twice in one test; pass name= to tell the measurements apart")
        return self._measure(backend, scenario, key)

    def _measure(self, backend: Backend, scenario: Scenario, key: str) -> BenchmarkResult:
        """Measure it (into `results`), and what follows in this mode."""
        raise NotImplementedError  # LocalBenchmark here, WorkerBenchmark in a worker process

    def _scenario(self, backend: Backend, overrides: dict[str, Any]) -> Scenario:
        unknown = set(overrides) - set(OVERRIDES)
        if unknown:
            raise ScenarioError(f"llmperf.measure() got unknown setting(s) {', '.join(sorted(unknown))}")
        settings = self.session.settings.for_test({**self.marker_kwargs, **overrides})
        settings.pop("devices", None)
        settings.pop("processes", None)
        threads = self.session.threads  # llmperf_threads, unless the marker's knobs set threads
        if threads is not None and "threads" in backend.knob_names and "threads" not in settings.get("knobs", {}):
            settings["knobs"] = {**settings.get("knobs", {}), "threads": threads}
        try:
            scenario = build_scenario(settings)
            known = [*METRICS, *getattr(backend, "counters_better", {})]
            check_metrics(scenario.metrics, known, backend.kind)
            gated = [
                m
                for m in gated_metrics(scenario.metrics, bool(getattr(backend, "splits_prefill", False)))
                if m not in MEMORY_METRICS
            ]
            check_rtol_metrics(scenario.rtol_per_metric, known, gated, backend.kind)
        except ScenarioError as exc:
            pytest.fail(f"{self.item.nodeid}: {exc}", pytrace=False)
        return scenario


class LocalBenchmark(Benchmark):
    """Measured in this pytest process: then recorded, or judged look by look against its stored baseline, and the
    test fails where --llmperf-fail-on says so."""

    def _measure(self, backend: Backend, scenario: Scenario, key: str) -> BenchmarkResult:
        __tracebackhide__ = True
        nodeid = self.item.nodeid
        # in this process nothing else stops a generate() that never returns (a worker's controller does)
        timeout = self.session.settings.worker_timeout
        try:
            with deadline(timeout):
                with progress.benchmark(self.item.config, nodeid, key, scenario.batch_sizes) as on_run:
                    result = runner.measure(
                        backend, scenario, key=key, nodeid=nodeid, module=nodeid.split("::", 1)[0], on_run=on_run
                    )
                self.results.append(result)
                outcome = self._judge(result, scenario, backend)
        except Overtime:
            pytest.fail(
                f"{key}: the measurement did not finish within {timeout:g} s (llmperf_worker_timeout, here "
                "for a benchmark measured in this pytest process), so it was stopped. A generate() that never "
                "returns? Raise the timeout if it is only slow",
                pytrace=False,
            )
        self.session.outcomes.append(outcome)
        from .looks import Decision

        Decision.of(self.session, [outcome]).report(self.item)
        return result

    def _judge(self, result: BenchmarkResult, scenario: Scenario, backend: Backend) -> Outcome:
        """Record it, or judge it look by look: the batch sizes with undecided rows get more runs."""
        # The judge (scipy.stats) loads only in a process that judges: a worker hands its result to the controller,
        # and importing scipy.stats changes a counting worker's memory layout from process to process (it draws
        # its docstrings' examples from unseeded generators: docs/notes/instructions.md, "Where the spread comes
        # from"), and costs seconds under valgrind.
        from ..judge.procedure import Schedule
        from ..judge.rows import undecided_batches
        from . import judging

        lookup = self.session.store.lookup(result.module, result.key)
        mode = self.session.mode
        if mode == "update" or (mode == "update-missing" and lookup.entry is None):
            return judging.record(self.session, result, scenario, lookup)
        reference = judging.stored_reference(self.session, result, lookup)
        if isinstance(reference, Outcome):
            return reference
        schedule = Schedule.doubling(scenario.runs, scenario.max_runs, scenario.alpha)
        runs, outcome = scenario.runs, None
        while True:
            outcome = judging.judge(
                self.session, result, reference, scenario, schedule, final=runs >= schedule.cap, previous=outcome
            )
            undecided, more = undecided_batches(outcome.rows), schedule.next_look(runs)
            if not undecided or more is None:
                return outcome
            with progress.benchmark(
                self.item.config, self.item.nodeid, f"{result.key} (look at {more} runs)", undecided
            ) as on_run:
                for batch_size in undecided:
                    fresh = runner.fresh_runs(backend, scenario, batch_size, more - runs, on_run=on_run)
                    result.batch(batch_size).samples.extend(fresh.samples)  # type: ignore[union-attr]
            runs = more


class WorkerBenchmark(Benchmark):
    """The `llmperf` fixture in a worker process: measures the batch sizes its controller still needs, taking turns
    with the other side's worker where it is one of an A/B round, and hands the result to the controller, which
    judges. A counting worker counts a few runs' instructions instead of timing them (measure/instructions.py)."""

    def __init__(self, session: LLMPerfSession, item: pytest.Item, recorder: WorkerRecorder) -> None:
        super().__init__(session, item)
        self.recorder = recorder

    def _measure(self, backend: Backend, scenario: Scenario, key: str) -> BenchmarkResult:
        nodeid, recorder = self.item.nodeid, self.recorder
        wanted = recorder.batch_sizes(nodeid)
        if wanted is not None:  # a later look
            scenario = replace(scenario, batch_sizes=tuple(b for b in scenario.batch_sizes if b in wanted))
        module = nodeid.split("::", 1)[0]
        if recorder.counter is not None:
            scenario = replace(scenario, runs=COUNTED_RUNS, warmups=max(scenario.warmups, 1))
            if not backend.clocked_in_process:  # a server's work is not this process's: nothing to count
                batches = [BatchResult(b, count_error=not_counted(backend)) for b in scenario.batch_sizes]
                result = BenchmarkResult(
                    key=key,
                    nodeid=nodeid,
                    module=module,
                    scenario=scenario.to_json(),
                    backend=backend.describe(),
                    batches=batches,
                    group=scenario.group,
                )
                return self._hand_over(result)
        wait = recorder.turns.wait if recorder.turns is not None else None
        by_run = self.session.settings.interleave == "run"  # else a turn per batch size
        result = runner.measure(
            backend,
            scenario,
            key=key,
            nodeid=nodeid,
            module=module,
            on_run=recorder.on_run(nodeid, key, scenario.batch_sizes),
            counter=recorder.counter,
            before_batch=None if by_run else wait,
            before_run=wait if by_run else None,
            runs={b: n for b, n in (wanted or {}).items() if n},
        )
        return self._hand_over(result)

    def _hand_over(self, result: BenchmarkResult) -> BenchmarkResult:
        self.results.append(result)
        self.recorder.record_result(result.nodeid, result)
        return result
