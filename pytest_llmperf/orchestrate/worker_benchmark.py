"""The `llmperf` fixture in a worker process: it measures what the controller still needs and hands it to the
`WorkerRecorder` (worker.py), which reports it; the controller judges."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ..measure import runner
from ..measure.backend import Backend
from ..measure.instructions import COUNTED_RUNS, not_counted
from ..measure.records import BatchResult, BenchmarkResult
from ..measure.scenario import Scenario
from .benchmark import Benchmark
from .session import LLMPerfSession
from .worker import WorkerRecorder


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
