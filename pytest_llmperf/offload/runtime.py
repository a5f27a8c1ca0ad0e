"""What the layers of one engine share while they run: host buffers, thread counts, phase timers, the
fast-tier staging slots, the CPU worker thread, and the `Runtime` that holds them; and what the engine counts
per run (`OffloadStats`, the phase timers' target): token-expert assignments per phase, layer and expert,
hits, bytes, time.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..measure.backend import Clock, perf_counter_clock
from .online import OnlineCosts
from .scheduler import LayerPlan, Scheduler
from .seam import OffloadError


def host_empty(shape: Sequence[int], dtype: torch.dtype, pin: bool) -> tuple[torch.Tensor, bool]:
    """Host memory, pinned when asked and possible; returns the tensor and whether it is pinned."""
    if pin:
        try:
            return torch.empty(tuple(shape), dtype=dtype, pin_memory=True), True
        except RuntimeError:  # no CUDA driver, or the OS refused to lock that much memory
            pass
    return torch.empty(tuple(shape), dtype=dtype), False


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Set this thread's torch thread count for the block, then restore it (None: leave it)."""
    old = torch.get_num_threads()
    if n is None or n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class Timer:
    """Phase timing: CUDA events on a CUDA stream (resolved at the end of the run), else `clock` (ns).
    `observe(ms)`, when given, also gets the time: the live cost model learns from it."""

    def __init__(
        self,
        stats: OffloadStats,
        kind: str,
        cuda_stream: Any = None,
        clock: Clock = perf_counter_clock,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.stats, self.kind, self.stream, self.clock, self.observe = stats, kind, cuda_stream, clock, observe

    def __enter__(self) -> Timer:
        if self.stream is not None:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record(self.stream)
        else:
            self.t0 = self.clock()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record(self.stream)
            self.stats.add_time(self.kind, self.start, end, self.observe)
        else:
            ms = (self.clock() - self.t0) / 1e6
            setattr(self.stats, self.kind, getattr(self.stats, self.kind) + ms)
            if self.observe is not None:
                self.observe(ms)


class Staging:
    """Double-buffered fast-tier slots for fetched experts, filled on a copy stream (CUDA) or by a plain
    copy (CPU). Slot `i` is refilled only after the compute that read it has finished (`free` event)."""

    def __init__(
        self,
        gate_up_shape: Sequence[int],
        down_shape: Sequence[int],
        dtype: torch.dtype,
        device: torch.device,
        slots: int = 2,
    ) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.gate_up = [torch.empty(tuple(gate_up_shape), dtype=dtype, device=device) for _ in range(slots)]
        self.down = [torch.empty(tuple(down_shape), dtype=dtype, device=device) for _ in range(slots)]
        self.slots = slots
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            self.ready = [torch.cuda.Event() for _ in range(slots)]
            self.free = [torch.cuda.Event() for _ in range(slots)]

    def load(
        self,
        slot: int,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        stats: OffloadStats,
        clock: Clock = perf_counter_clock,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        if self.cuda:
            with torch.cuda.stream(self.stream):
                self.stream.wait_event(self.free[slot])
                with Timer(stats, "fetch_ms", self.stream, observe=observe):
                    self.copy(slot, gate_up, down)
                self.ready[slot].record(self.stream)
        else:
            with Timer(stats, "fetch_ms", clock=clock, observe=observe):
                self.copy(slot, gate_up, down)

    def copy(self, slot: int, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        """The copy itself (asynchronous on the copy stream on CUDA; the caller records the events)."""
        self.gate_up[slot].copy_(gate_up, non_blocking=self.cuda)
        self.down[slot].copy_(down, non_blocking=self.cuda)

    def acquire(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.ready[slot])
        return self.gate_up[slot], self.down[slot]

    def release(self, slot: int) -> None:
        if self.cuda:
            self.free[slot].record(torch.cuda.current_stream(self.device))


class CpuWorker:
    """The one thread that runs CPU experts, started on first use. A daemon thread rather than a
    ThreadPoolExecutor's: a job stuck past `cpu_timeout_s` cannot be interrupted, and neither `close()`
    nor interpreter exit may wait for it."""

    def __init__(self, name: str = "llmperf-offload-cpu") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        if self._closed:
            raise OffloadError("the CPU worker is shut down (the engine is closed)")
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()
        future: Future[Any] = Future()
        self._jobs.put((future, fn))
        return future

    def _loop(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, fn = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self, timeout: float | None) -> None:
        """Stop after the job in hand; wait for it at most `timeout` seconds (0: do not wait)."""
        self._closed = True
        self._jobs.put(None)
        if self._thread is not None and timeout != 0:
            self._thread.join(timeout)


@dataclass
class Runtime:
    """What all layers of one engine share: devices, scheduler, stats, staging and the CPU worker."""

    fast: torch.device
    slow: torch.device
    scheduler: Scheduler
    stats: OffloadStats
    staging: Staging
    expert_bytes: int
    threads: int  # torch threads of a run (the engine's `threads`); how main and worker share them is below
    split_threads: bool = False  # share `threads` between main and worker while they overlap
    cpu_timeout_s: float | None = 300.0
    overlap: bool = True
    phase: str = "prefill"
    worker: CpuWorker = field(default_factory=CpuWorker)
    clock: Clock = perf_counter_clock  # for the phase timers off CUDA (injected in tests)
    broken: str | None = None  # set when a CPU job timed out: it still holds the worker, so nothing else can run

    @property
    def cuda(self) -> bool:
        return self.fast.type == "cuda"

    def observe_layer(self, mode: str, tokens: int, plan: LayerPlan, t0: int) -> None:
        """A layer with work on both sides finished: its wall time since `t0` against the plan (host clock,
        so only where both tiers are the host; the engine turns modes on only there)."""
        costs = self.scheduler.costs
        if isinstance(costs, OnlineCosts) and costs.modes:
            planned = plan.cpu_ms + plan.fast_ms if mode == "sequential" else max(plan.cpu_ms, plan.fast_ms)
            costs.observe_layer(mode, tokens, planned, (self.clock() - t0) / 1e6)

    def observer(self, tier: str, tokens: int) -> Callable[[float], None] | None:
        """Where one expert's timing goes: the live cost model, when the scheduler has one that learns."""
        costs = self.scheduler.costs
        return costs.observer(tier, tokens) if isinstance(costs, OnlineCosts) else None

    @property
    def worker_threads(self) -> int:
        return max(1, self.threads // 2) if self.split_threads else self.threads

    @property
    def overlap_main_threads(self) -> int | None:
        """The main thread's torch threads while a CPU job runs beside it (None: its usual count)."""
        return max(1, self.threads - self.worker_threads) if self.split_threads else None

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A device-to-host copy into pinned memory, synchronised by an event (never a pageable non_blocking copy)."""
        if t.device.type != "cuda":
            return t if t.device == self.slow else t.to(self.slow)
        host, _ = host_empty(t.shape, t.dtype, pin=True)
        host.copy_(t, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(t.device))
        done.synchronize()
        return host

    def check_usable(self) -> None:
        if self.broken is not None:
            raise OffloadError(
                f"{self.broken}; the stuck job still holds the CPU worker, so this engine cannot "
                "run again: close it and start a new one (or raise cpu_timeout_s)"
            )

    def wait_cpu(self, future: Future[torch.Tensor], layer: int) -> torch.Tensor:
        """The worker's result, waiting at most `cpu_timeout_s`; a timeout marks the runtime broken."""
        try:
            return future.result(timeout=self.cpu_timeout_s)
        except FutureTimeout:
            self.broken = (
                f"CPU experts of MoE layer {layer} did not finish within {self.cpu_timeout_s} s (cpu_timeout_s)"
            )
            raise OffloadError(self.broken) from None

    def close(self) -> None:
        # After a timeout the stuck job is abandoned (its thread is a daemon) instead of waited for forever.
        self.worker.shutdown(timeout=0 if self.broken is not None else self.cpu_timeout_s)


PHASES = ("prefill", "decode")


@dataclass
class OffloadStats:
    """Counts since the last `reset()`: token-expert assignments per phase/layer/expert, hits, calls, bytes, time."""

    num_layers: int
    num_experts: int
    assignments: np.ndarray = field(init=False)  # [phase, layer, expert]
    hits: np.ndarray = field(init=False)  # [phase, layer]: assignments served by a resident expert
    cpu_expert_calls: int = 0
    fetches: int = 0
    h2d_bytes: int = 0
    cpu_expert_ms: float = 0.0
    gpu_expert_ms: float = 0.0
    fetch_ms: float = 0.0
    _pending_events: list[tuple[str, Any, Any, Any]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.assignments = np.zeros((len(PHASES), self.num_layers, self.num_experts), dtype=np.int64)
        self.hits = np.zeros((len(PHASES), self.num_layers), dtype=np.int64)
        self.cpu_expert_calls = self.fetches = self.h2d_bytes = 0
        self.cpu_expert_ms = self.gpu_expert_ms = self.fetch_ms = 0.0
        self._pending_events = []

    def add_time(self, kind: str, start: Any, end: Any, observe: Any = None) -> None:
        """CUDA event pairs are resolved later (reading them now would synchronise every layer); `observe(ms)`
        then gets the time too, so on CUDA the live cost model learns the fast tier at the end of each run."""
        self._pending_events.append((kind, start, end, observe))

    def settle(self) -> None:
        for kind, start, end, observe in self._pending_events:
            end.synchronize()
            ms = start.elapsed_time(end)
            setattr(self, kind, getattr(self, kind) + ms)
            if observe is not None:
                observe(ms)
        self._pending_events = []

    def counters(self) -> dict[str, float]:
        """The flat counters a `RunSample` carries (the keys the reporter reads)."""
        self.settle()
        total = self.assignments.sum()
        decode = self.assignments[1].sum()
        out = {
            "hit_rate": float(self.hits.sum() / total) if total else 0.0,
            "decode_hit_rate": float(self.hits[1].sum() / decode) if decode else 0.0,
        }
        for layer in range(self.num_layers):
            n = self.assignments[:, layer].sum()
            out[f"hit_rate.layer{layer}"] = float(self.hits[:, layer].sum() / n) if n else 0.0
        out.update(
            cpu_expert_calls=float(self.cpu_expert_calls),
            fetches=float(self.fetches),
            h2d_bytes=float(self.h2d_bytes),
            cpu_expert_ms=self.cpu_expert_ms,
            gpu_expert_ms=self.gpu_expert_ms,
            fetch_ms=self.fetch_ms,
        )
        return out
