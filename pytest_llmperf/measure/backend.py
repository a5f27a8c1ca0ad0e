"""The interface every backend implements: in-process models, servers, the offload engine.

A backend is started by a fixture, which owns its lifetime (`close()` at teardown, also when the
test fails). The runner asks it for one run at a time with a `GenerationRequest` and gets back a
`RunSample`: per-token arrival times at least, and a prefill/decode split where it can give one.
Knobs (threads, tokenizer parallelism, engine settings) are applied around a measurement by
`apply_knobs`, which restores the previous state on exit.

The clock a backend times with (`Clock`): timing code takes a clock so that unit tests can inject one
(`FakeClock`) and never read real time.

A clock is a zero-argument callable returning integer nanoseconds. On CUDA, work is asynchronous:
`synchronized_clock` waits for the device before each reading so that a timestamp means the work
launched before it has finished.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .records import RunSample


@dataclass(frozen=True)
class GenerationRequest:
    """One run: `batch_size` prompts of exactly `sequence_length` tokens, `decode_length` new tokens each.

    Output length is fixed: backends must not stop early at an end-of-sequence token.
    `prompt` is the text every sequence starts from; backends that tokenize cut or repeat it to the
    exact length, servers send it as is (see their notes on token counting).
    """

    batch_size: int
    sequence_length: int
    decode_length: int
    prompt: str


class BackendError(RuntimeError):
    """A backend failed in a way the user must fix (won't start, died, bad URL)."""


class OutOfMemory(BackendError):
    """A run did not fit in memory; the sweep records it as `oom` and goes on."""


class InvalidSample(BackendError):
    """`generate` returned something that is not a measurement of the request: the batch fails with this."""


def _time(value: object, *, positive: bool = False) -> bool:
    """A duration or instant in ns: a finite real number >= 0 (> 0 where it divides)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    )


def sample_problem(sample: object, request: GenerationRequest) -> str | None:
    """What makes `sample` no measurement of `request`, or None."""
    if not isinstance(sample, RunSample):
        return f"{type(sample).__name__ if sample is not None else 'None'}, not a RunSample"
    if sample.batch_size != request.batch_size:
        return f"a RunSample of batch size {sample.batch_size!r} for a request of batch size {request.batch_size}"
    if not isinstance(sample.token_times_ns, Sequence) or len(sample.token_times_ns) > request.batch_size:
        return f"token_times_ns for more sequences than the batch size {request.batch_size}"
    for s, times in enumerate(sample.token_times_ns):
        if not isinstance(times, Sequence) or not all(_time(t) for t in times):
            return f"token_times_ns[{s}] holding {list(times)[:4]!r}...: expected finite times >= 0"
        if any(b < a for a, b in itertools.pairwise(times)):
            return f"token_times_ns[{s}] going backwards ({list(times)[:4]!r}...)"
    checks = [
        ("end_to_end_ns", sample.end_to_end_ns, True),
        ("prefill_ns", sample.prefill_ns, True),
        ("tokenize_ns", sample.tokenize_ns, False),
        ("detokenize_ns", sample.detokenize_ns, False),
    ]
    for name, value, positive in checks:
        if (value is not None or name == "end_to_end_ns") and not _time(value, positive=positive):
            return f"{name}={value!r}: expected a finite time {'> 0' if positive else '>= 0'} in ns"
    steps = sample.decode_steps_ns
    if not isinstance(steps, Sequence) or not all(_time(t) for t in steps) or (steps and not sum(steps) > 0):
        return f"decode_steps_ns={list(steps or [])[:4]!r}...: expected a list of finite times >= 0, total > 0"
    if not isinstance(sample.counters, Mapping):
        return f"counters={sample.counters!r}: expected a mapping of counter names to numbers"
    for name, count in sample.counters.items():
        if isinstance(count, bool) or not isinstance(count, (int, float)) or not math.isfinite(count):
            return f"counter {name}={count!r}: expected a finite number"
    generated = (
        sample.generated_tokens if sample.generated_tokens is not None else sum(len(t) for t in sample.token_times_ns)
    )
    if isinstance(generated, bool) or not isinstance(generated, int) or generated <= 0:
        return (
            f"a run that generated {generated!r} tokens (asked: {request.batch_size} x {request.decode_length}): "
            "no token, nothing to time"
        )
    return None


def check_sample(sample: object, request: GenerationRequest, backend: object) -> RunSample:
    """`sample` when it measures `request`; else InvalidSample naming the backend and what is wrong, so a NaN or
    zero time, a missing return or a batch of another size fails its batch size with a line, never a traceback
    or a value that reaches a baseline or a report."""
    problem = sample_problem(sample, request)
    if problem is not None:
        raise InvalidSample(
            f"{type(backend).__name__}.generate() returned {problem}; a run is a RunSample of the "
            "request's batch size with finite times and a generated token"
        )
    return sample  # type: ignore[return-value]


class Backend(ABC):
    """Base class of all backends. Subclasses set `kind` and implement `generate` and `describe`."""

    kind: ClassVar[str] = "backend"
    #: True when `generate` fills `prefill_ns` and `decode_steps_ns` (an in-process engine).
    splits_prefill: ClassVar[bool] = False
    #: True when `generate` times every phase with `self.clock` in this process (an in-process engine), so that a
    #: counting process can swap the clock for an instruction counter (measure/instructions.py).
    clocked_in_process: ClassVar[bool] = False
    #: Knob names `apply_knobs` accepts.
    knob_names: ClassVar[tuple[str, ...]] = ()
    #: For each counter `generate` reports in `RunSample.counters` (e.g. an offload hit rate): "lower" or
    #: "higher" is better. The gate compares counters like the timings; one not listed here is "lower".
    #: A class default: a backend whose counters depend on its model (offload's per-layer hit rates) sets its own.
    counters_better: Mapping[str, str] = {}
    #: Greedy decoding gives the same tokens every time, so changed outputs fail the test (--llmperf-outputs).
    #: In-process engines are; a server says so only when its user does (a fixture's deterministic=True), since
    #: batching with other requests can change its numerics. Servers put it in describe() for the judge.
    deterministic_outputs: bool = True

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or perf_counter_clock

    @abstractmethod
    def generate(self, request: GenerationRequest) -> RunSample:
        """Run one request and return its timings. Raise `OutOfMemory` when it does not fit."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What is measured, for the report and the baseline: model, dtype, device, server args..."""

    def server_pids(self) -> list[int]:
        """Processes this backend started and whose memory belongs to the measurement (a server); the
        process tree below each is counted too."""
        process = getattr(self, "process", None)
        pid = getattr(process, "pid", None)
        return [pid] if pid is not None else []

    def close(self) -> None:  # noqa: B027 - a backend that holds nothing needs no close
        """Release what the backend holds (processes, memory). Must be safe to call twice."""

    @contextlib.contextmanager
    def apply_knobs(self, knobs: Mapping[str, Any]) -> Iterator[None]:
        """Apply knobs for the duration of a measurement; reject the ones this backend lacks."""
        unknown = sorted(set(knobs) - set(self.knob_names))
        if unknown:
            raise BackendError(
                f"{self.kind} backend has no knob(s) {', '.join(unknown)}; "
                f"it knows: {', '.join(self.knob_names) or 'none'}"
            )
        yield

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Clock = Callable[[], int]

perf_counter_clock: Clock = time.perf_counter_ns


def synchronized_clock(synchronize: Callable[[], None], clock: Clock = perf_counter_clock) -> Clock:
    """A clock that calls `synchronize()` (e.g. `torch.cuda.synchronize`) before reading `clock`."""

    def read() -> int:
        synchronize()
        return clock()

    return read


class FakeClock:
    """A clock for tests: each reading returns the next scripted value, or advances by `step`."""

    def __init__(self, ticks: Iterable[int] | None = None, step: int = 1_000_000) -> None:
        self._ticks: Iterator[int] | None = iter(ticks) if ticks is not None else None
        self.now = 0
        self.step = step

    def __call__(self) -> int:
        if self._ticks is not None:
            self.now = next(self._ticks)
        else:
            self.now += self.step
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns
