"""The interface every backend implements: in-process models, servers, the offload engine.

A backend is started by a fixture, which owns its lifetime (`close()` at teardown, also when the
test fails). The runner asks it for one run at a time with a `GenerationRequest` and gets back a
`RunSample`: per-token arrival times at least, and a prefill/decode split where it can give one.
Knobs (threads, tokenizer parallelism, engine settings) are applied around a measurement by
`apply_knobs`, which restores the previous state on exit.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .clock import Clock, perf_counter_clock
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
    counters_better: ClassVar[Mapping[str, str]] = {}
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

    def close(self) -> None:
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
