"""The measurement loop: a scenario on a backend, batch size by batch size.

Warmup runs are measured and discarded. A batch size that runs out of memory is recorded as `oom`
and, with `stop_after_oom`, the larger ones are recorded as not attempted (the seeds' sweep "until
oom"); any other error is recorded with its reason and the sweep goes on.

How busy the machine was while a run was measured (`LoadMeter`): the CPU time of every process but ours, in cores.
A timing taken while another process compiles can move 30x on a shared machine; no tolerance
separates that from a regression. So the runner records, per batch size, the average number of
cores other processes kept busy (system busy time from /proc/stat via psutil, minus the CPU time of
this process and its children, such as a server a fixture started), and the gate refuses to judge a
comparison where either side was measured on a busy machine.

`LoadMeter.reading()` also counts the other threads of this process (a neighbour thread is invisible to
`stop()`, which is about other processes): the offload engine's start-up microbenchmark runs on one thread
and is disturbed by a busy thread beside it as much as by another process.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import psutil

from .backend import Backend, GenerationRequest, OutOfMemory, check_sample
from .gpu import GpuMeter, open_nvml
from .instructions import InstructionClock, counted_runs
from .memory import MemoryMeter
from .records import BatchResult, BenchmarkResult, RunSample
from .scenario import Scenario, make_prompt


def request_for(scenario: Scenario, batch_size: int) -> GenerationRequest:
    return GenerationRequest(
        batch_size=batch_size,
        sequence_length=scenario.sequence_length,
        decode_length=scenario.decode_length,
        prompt=make_prompt(scenario.sequence_length),
    )


@dataclass
class Runs:
    samples: list[RunSample]
    foreign_load: float  # mean over the kept runs, in cores
    retaken: int  # runs discarded because other processes were busy during them


#: Called after every run: (batch size, runs kept, runs wanted, retaken, the sample or None when discarded).
#: Progress display only (orchestrate/progress.py); None shows nothing.
RunCallback = Callable[[int, int, int, int, "RunSample | None"], None]


def take_runs(
    backend: Backend,
    request: GenerationRequest,
    runs: int,
    warmups: int,
    max_load: float = math.inf,
    on_run: RunCallback | None = None,
    before_run: Callable[[], None] | None = None,
) -> Runs:
    """Warmups (discarded), then `runs` runs. A run during which other processes kept more than
    `max_load` cores busy is discarded and taken again, at most `runs` times in all, so measurement
    proceeds in the quiet gaps of a shared machine; past that the disturbed runs are kept and the
    load says so. `before_run` is called before the warmups and before each run (a worker of an A/B round
    taking turns run by run waits there: orchestrate/turns.py)."""
    if before_run is not None:
        before_run()
    for _ in range(warmups):
        check_sample(backend.generate(request), request, backend)
    samples: list[RunSample] = []
    loads: list[float] = []
    retaken = 0
    with open_nvml() as nvml:
        # a backend that does not derive from Backend starts no server of ours
        memory = MemoryMeter(getattr(backend, "server_pids", lambda: []), nvml=nvml)
        gpu = GpuMeter(nvml)
        while len(samples) < runs:
            if before_run is not None:
                before_run()
            meter = LoadMeter()
            memory.start()
            gpu.start()
            sample = check_sample(backend.generate(request), request, backend)
            sample.gpu = gpu.stop()
            sample.memory = memory.stop()
            load = meter.stop()
            if load > max_load and retaken < runs:
                retaken += 1
                if on_run is not None:
                    on_run(request.batch_size, len(samples), runs, retaken, None)
                continue
            samples.append(sample)
            loads.append(load)
            if on_run is not None:
                on_run(request.batch_size, len(samples), runs, retaken, sample)
    return Runs(samples, sum(loads) / len(loads), retaken)


def warm_up_uninstrumented(backend: Backend, scenario: Scenario, counter: InstructionClock) -> set[int]:
    """A counting process warms up every batch size of a test before it counts any, at valgrind's base cost:
    instrumented, a warmup costs as much as a counted run. The batch sizes warmed."""
    counter.stop()  # the process's previous test left it on
    warmed = set()
    for batch_size in scenario.batch_sizes:
        try:
            for _ in range(scenario.warmups):
                backend.generate(request_for(scenario, batch_size))
        except Exception as exc:  # recorded where this batch size is counted
            if isinstance(exc, OutOfMemory) and scenario.stop_after_oom:
                break
            continue
        warmed.add(batch_size)
    return warmed


def measure_batch(
    backend: Backend,
    scenario: Scenario,
    batch_size: int,
    on_run: RunCallback | None = None,
    counter: InstructionClock | None = None,
    before_run: Callable[[], None] | None = None,
    warmed: bool = False,
) -> BatchResult:
    request = request_for(scenario, batch_size)
    try:
        if counter is not None:  # a counting process: instructions, not time (measure/instructions.py)
            warmups = 0 if warmed else scenario.warmups
            return BatchResult(
                batch_size,
                warmups=scenario.warmups,
                counted=counted_runs(backend, request, scenario.runs, warmups, counter),
            )
        runs = take_runs(backend, request, scenario.runs, scenario.warmups, scenario.max_load, on_run, before_run)
    except OutOfMemory as exc:
        return BatchResult(batch_size, warmups=scenario.warmups, error=str(exc), oom=True)
    except Exception as exc:  # recorded with its reason; the sweep goes on
        return BatchResult(batch_size, warmups=scenario.warmups, error=f"{type(exc).__name__}: {exc}")
    return BatchResult(
        batch_size, samples=runs.samples, warmups=scenario.warmups, foreign_load=runs.foreign_load, retaken=runs.retaken
    )


def measure(
    backend: Backend,
    scenario: Scenario,
    *,
    key: str,
    nodeid: str,
    module: str,
    on_run: RunCallback | None = None,
    counter: InstructionClock | None = None,
    before_batch: Callable[[], None] | None = None,
    before_run: Callable[[], None] | None = None,
    runs: Mapping[int, int] | None = None,
) -> BenchmarkResult:
    """Every batch size of the scenario. `before_batch` is called before each one's warmups, `before_run` before
    its warmups and each of its runs (a worker of an A/B round waits there for its turn: orchestrate/turns.py).
    `runs`: the runs of some batch sizes, where not the scenario's (a later look chose them: judge/procedure.py)."""
    batches: list[BatchResult] = []
    with backend.apply_knobs(scenario.knobs):
        description = backend.describe()
        warmed = warm_up_uninstrumented(backend, scenario, counter) if counter is not None else set()
        oom_at: int | None = None
        for batch_size in scenario.batch_sizes:
            if oom_at is not None and scenario.stop_after_oom and batch_size > oom_at:
                batches.append(
                    BatchResult(
                        batch_size, error=f"not run: batch size {oom_at} ran out of memory", oom=True, skipped=True
                    )
                )
                continue
            if before_batch is not None:
                before_batch()
            taken = replace(scenario, runs=runs[batch_size]) if runs and batch_size in runs else scenario
            result = measure_batch(backend, taken, batch_size, on_run, counter, before_run, batch_size in warmed)
            if result.oom and oom_at is None:
                oom_at = batch_size
            batches.append(result)
    return BenchmarkResult(
        key=key,
        nodeid=nodeid,
        module=module,
        scenario=scenario.to_json(),
        backend=description,
        batches=batches,
        group=scenario.group,
        counters_better=dict(getattr(backend, "counters_better", None) or {}),
    )


def fresh_runs(
    backend: Backend, scenario: Scenario, batch_size: int, runs: int, on_run: RunCallback | None = None
) -> BatchResult:
    """A new set of runs of one batch size (after fresh warmups), to confirm or settle a verdict."""
    with backend.apply_knobs(scenario.knobs):
        taken = take_runs(backend, request_for(scenario, batch_size), runs, scenario.warmups, scenario.max_load, on_run)
    return BatchResult(
        batch_size,
        samples=taken.samples,
        warmups=scenario.warmups,
        foreign_load=taken.foreign_load,
        retaken=taken.retaken,
    )


def _own_cpu_seconds(process: psutil.Process) -> float:
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            total += sum(child.cpu_times()[:2])
    return total


def _system_busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


@dataclass(frozen=True)
class LoadReading:
    """Average busy cores during a measurement: other processes, and other threads of this process."""

    foreign_cores: float
    sibling_cores: float  # this process and its children, minus the thread that took the reading
    wall_s: float

    @property
    def busy_cores(self) -> float:
        return self.foreign_cores + self.sibling_cores


@dataclass
class LoadMeter:
    """Start before a measurement, `stop()` after: returns the foreign load in cores."""

    _wall: float = 0.0
    _system: float = 0.0
    _own: float = 0.0

    def __post_init__(self) -> None:
        self._process = psutil.Process()
        self._wall = time.monotonic()
        self._system = _system_busy_seconds()
        self._own = _own_cpu_seconds(self._process)
        self._thread = time.thread_time()

    def stop(self) -> float:
        return self.reading().foreign_cores

    def reading(self) -> LoadReading:
        """Foreign load and the load of this process's other threads, in cores (call on the starting thread)."""
        wall = time.monotonic() - self._wall
        if wall <= 0:
            return LoadReading(0.0, 0.0, 0.0)
        own = _own_cpu_seconds(self._process) - self._own
        foreign = (_system_busy_seconds() - self._system) - own
        siblings = own - (time.thread_time() - self._thread)
        return LoadReading(max(foreign, 0.0) / wall, max(siblings, 0.0) / wall, wall)
