"""The transformers seam and the per-layer execution: tiers, staging, the CPU worker thread.

transformers 5.x routes in the MoE block and then calls `experts(hidden, top_k_index, top_k_weights)`,
dispatched through `ExpertsInterface` by `config._experts_implementation`. We register one function,
`llmperf_offload`, once (the registry is global in transformers); it forwards to the `OffloadedLayer`
stored on each experts module, so all per-model state lives on the model and its engine. Routing,
shared experts (Qwen2-MoE) and every non-expert weight stay untouched on the fast device.

An adapter turns an experts module into per-expert `(gate_up [2I, H], down [H, I])` weights and runs
one expert. `FusedExpertsAdapter` covers every model whose experts class uses the fused v5 layout
(Mixtral, Qwen2/3-MoE, OLMoE, ...); another layout needs only another adapter in `ADAPTERS`.
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
import torch.nn.functional as F

from ..measure.clock import Clock, perf_counter_clock
from .scheduler import LayerPlan, Scheduler

IMPLEMENTATION = "llmperf_offload"
PHASES = ("prefill", "decode")
_register_lock = threading.Lock()


class OffloadError(RuntimeError):
    """The engine cannot run this model or this step (unsupported layout, a failed CPU expert...)."""


# -- the seam ------------------------------------------------------------------------------------


def _offload_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:
    layer: OffloadedLayer | None = getattr(self, "_llmperf_offload", None)
    if layer is None:
        raise OffloadError(f"{type(self).__name__} uses experts_implementation={IMPLEMENTATION!r} but was not "
                           "prepared by an OffloadEngine; load the model through OffloadEngine")
    return layer.forward(hidden_states, top_k_index, top_k_weights)


def register_implementation() -> str:
    """Register the experts function with transformers once per process; returns its name."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    with _register_lock:
        if ALL_EXPERTS_FUNCTIONS.get(IMPLEMENTATION) is not _offload_experts_forward:
            ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, _offload_experts_forward)
    return IMPLEMENTATION


class FusedExpertsAdapter:
    """v5 experts with fused, untransposed, bias-free `gate_up_proj [E, 2I, H]` and `down_proj [E, H, I]`."""

    name = "fused"

    @staticmethod
    def matches(module: torch.nn.Module) -> bool:
        gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        return isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and gu.dim() == 3 and dn.dim() == 3

    @staticmethod
    def check(module: torch.nn.Module) -> None:
        unsupported = [flag for flag, ok in (("has_bias", not getattr(module, "has_bias", False)),
                                             ("is_transposed", not getattr(module, "is_transposed", False)),
                                             ("has_gate", getattr(module, "has_gate", True)),
                                             ("is_concatenated", getattr(module, "is_concatenated", True)),
                                             ("has_post_expert_norm",
                                              not getattr(module, "has_post_expert_norm", False))) if not ok]
        if unsupported:
            raise OffloadError(f"{type(module).__name__}: expert layout with {', '.join(unsupported)} is not "
                               "supported by the fused adapter; add an adapter to pytest_llmperf.offload.experts.ADAPTERS")

    @staticmethod
    def weights(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        return module.gate_up_proj.data, module.down_proj.data

    @staticmethod
    def run(module: torch.nn.Module, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        # Same ops as the eager implementation, so results match it.
        return F.linear(module._apply_gate(F.linear(x, gate_up)), down)

    @staticmethod
    def detach(module: torch.nn.Module, device: torch.device) -> None:
        """Drop the module's own expert weights (the tiers hold them now)."""
        empty = torch.empty(0, dtype=module.gate_up_proj.dtype, device=device)
        module.gate_up_proj = torch.nn.Parameter(empty, requires_grad=False)
        module.down_proj = torch.nn.Parameter(empty.clone(), requires_grad=False)


ADAPTERS: tuple[type[FusedExpertsAdapter], ...] = (FusedExpertsAdapter,)


@dataclass(frozen=True)
class ExpertsSite:
    """One MoE layer's experts module, found in a model."""

    layer: int
    name: str
    module: torch.nn.Module
    adapter: type[FusedExpertsAdapter]
    num_experts: int


def find_experts(model: torch.nn.Module) -> list[ExpertsSite]:
    """Every experts module dispatched through `ExpertsInterface`, in layer order."""
    sites = []
    for name, module in model.named_modules():
        if not hasattr(module, "_apply_gate") or not hasattr(module, "num_experts"):
            continue  # not a `@use_experts_implementation` class
        adapter = next((a for a in ADAPTERS if a.matches(module)), None)
        if adapter is None:
            raise OffloadError(f"{name} ({type(module).__name__}) has no adapter; add one to ADAPTERS")
        adapter.check(module)
        sites.append(ExpertsSite(len(sites), name, module, adapter, int(module.num_experts)))
    if not sites:
        raise OffloadError(f"{type(model).__name__} has no experts module dispatched through transformers' "
                           "ExpertsInterface (a transformers>=5 MoE model such as Mixtral, Qwen2-MoE or OLMoE)")
    return sites


# -- statistics ----------------------------------------------------------------------------------


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
    _pending_events: list[tuple[str, Any, Any]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.assignments = np.zeros((len(PHASES), self.num_layers, self.num_experts), dtype=np.int64)
        self.hits = np.zeros((len(PHASES), self.num_layers), dtype=np.int64)
        self.cpu_expert_calls = self.fetches = self.h2d_bytes = 0
        self.cpu_expert_ms = self.gpu_expert_ms = self.fetch_ms = 0.0
        self._pending_events = []

    def add_time(self, kind: str, start: Any, end: Any) -> None:
        """CUDA event pairs are resolved later (reading them now would synchronise every layer)."""
        self._pending_events.append((kind, start, end))

    def settle(self) -> None:
        for kind, start, end in self._pending_events:
            end.synchronize()
            setattr(self, kind, getattr(self, kind) + start.elapsed_time(end))
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
        out.update(cpu_expert_calls=float(self.cpu_expert_calls), fetches=float(self.fetches),
                   h2d_bytes=float(self.h2d_bytes), cpu_expert_ms=self.cpu_expert_ms,
                   gpu_expert_ms=self.gpu_expert_ms, fetch_ms=self.fetch_ms)
        return out


# -- tiers, staging, worker ----------------------------------------------------------------------


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
    """Phase timing: CUDA events on a CUDA stream (resolved at the end of the run), else `clock` (ns)."""

    def __init__(self, stats: OffloadStats, kind: str, cuda_stream: Any = None,
                 clock: Clock = perf_counter_clock) -> None:
        self.stats, self.kind, self.stream, self.clock = stats, kind, cuda_stream, clock

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
            self.stats.add_time(self.kind, self.start, end)
        else:
            setattr(self.stats, self.kind, getattr(self.stats, self.kind) + (self.clock() - self.t0) / 1e6)


class Staging:
    """Double-buffered fast-tier slots for fetched experts, filled on a copy stream (CUDA) or by a plain
    copy (CPU). Slot `i` is refilled only after the compute that read it has finished (`free` event)."""

    def __init__(self, gate_up_shape: Sequence[int], down_shape: Sequence[int], dtype: torch.dtype,
                 device: torch.device, slots: int = 2) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.gate_up = [torch.empty(tuple(gate_up_shape), dtype=dtype, device=device) for _ in range(slots)]
        self.down = [torch.empty(tuple(down_shape), dtype=dtype, device=device) for _ in range(slots)]
        self.slots = slots
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            self.ready = [torch.cuda.Event() for _ in range(slots)]
            self.free = [torch.cuda.Event() for _ in range(slots)]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.gate_up, *self.down))

    def load(self, slot: int, gate_up: torch.Tensor, down: torch.Tensor, stats: OffloadStats,
             clock: Clock = perf_counter_clock) -> None:
        if self.cuda:
            with torch.cuda.stream(self.stream):
                self.stream.wait_event(self.free[slot])
                with Timer(stats, "fetch_ms", self.stream):
                    self.copy(slot, gate_up, down)
                self.ready[slot].record(self.stream)
        else:
            with Timer(stats, "fetch_ms", clock=clock):
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
            except BaseException as exc:  # noqa: BLE001 -- handed to the waiting thread, which raises it
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
            raise OffloadError(f"{self.broken}; the stuck job still holds the CPU worker, so this engine cannot "
                               "run again: close it and start a new one (or raise cpu_timeout_s)")

    def wait_cpu(self, future: Future[torch.Tensor], layer: int) -> torch.Tensor:
        """The worker's result, waiting at most `cpu_timeout_s`; a timeout marks the runtime broken."""
        try:
            return future.result(timeout=self.cpu_timeout_s)
        except FutureTimeout:
            self.broken = (f"CPU experts of MoE layer {layer} did not finish within {self.cpu_timeout_s} s "
                           "(cpu_timeout_s)")
            raise OffloadError(self.broken) from None

    def close(self) -> None:
        # After a timeout the stuck job is abandoned (its thread is a daemon) instead of waited for forever.
        self.worker.shutdown(timeout=0 if self.broken is not None else self.cpu_timeout_s)


class OffloadedLayer:
    """One MoE layer's experts split into a fast tier (resident) and a slow tier (contiguous host memory)."""

    def __init__(self, site: ExpertsSite, resident: Sequence[bool], runtime: Runtime,
                 weights: Callable[[Sequence[int]], tuple[torch.Tensor, torch.Tensor]], pin: bool) -> None:
        self.site, self.index, self.module, self.adapter = site, site.layer, site.module, site.adapter
        self.runtime = runtime
        self.resident = list(resident)
        self.num_experts = site.num_experts
        fast_ids = [e for e in range(self.num_experts) if resident[e]]
        slow_ids = [e for e in range(self.num_experts) if not resident[e]]
        self.slot = {e: i for i, e in enumerate(fast_ids)} | {e: i for i, e in enumerate(slow_ids)}
        gu, dn = weights(fast_ids) if fast_ids else (None, None)
        self.fast_gate_up = gu.to(runtime.fast).contiguous() if gu is not None else None
        self.fast_down = dn.to(runtime.fast).contiguous() if dn is not None else None
        self.pinned = False
        self.slow_gate_up = self.slow_down = None
        if slow_ids:
            gu, dn = weights(slow_ids)
            self.slow_gate_up, p1 = host_empty(gu.shape, gu.dtype, pin)
            self.slow_down, p2 = host_empty(dn.shape, dn.dtype, pin)
            self.slow_gate_up.copy_(gu)
            self.slow_down.copy_(dn)
            self.pinned = p1 and p2
        del gu, dn
        site.module._llmperf_offload = self

    # -- execution --------------------------------------------------------------------------------

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        rt = self.runtime
        rt.check_usable()
        top_k = top_k_index.shape[-1]
        flat = top_k_index.reshape(-1)
        # One small device-to-host copy per layer: the token count of every expert.
        counts = rt.to_host(torch.bincount(flat, minlength=self.num_experts)).numpy()
        offsets = np.concatenate(([0], np.cumsum(counts)))
        order = torch.argsort(flat, stable=True)
        tokens = order // top_k  # the token of each assignment, grouped by expert
        weights = top_k_weights.reshape(-1)[order]
        plan = rt.scheduler.plan(counts.tolist(), self.resident)
        self._record(counts, plan)
        out = torch.zeros_like(hidden)

        cpu_job: Callable[[], torch.Tensor] | None = None
        future: Future[torch.Tensor] | None = None
        cpu_tokens = None
        if plan.cpu:
            pos = torch.from_numpy(np.concatenate([np.arange(offsets[e], offsets[e + 1]) for e in plan.cpu]))
            pos = pos.to(hidden.device)
            cpu_tokens = tokens[pos]
            x_host = rt.to_host(hidden[cpu_tokens])
            w_host = rt.to_host(weights[pos])
            sizes = [int(counts[e]) for e in plan.cpu]
            cpu_job = self._cpu_job(plan.cpu, sizes, x_host, w_host, out.dtype)
            if rt.overlap and not plan.sequential:
                future = rt.worker.submit(cpu_job)
        try:
            with torch_threads(rt.overlap_main_threads if future is not None else None):
                self._run_fast(plan, offsets, tokens, weights, hidden, out)
                if cpu_job is not None:
                    y = self._cpu_result(future, cpu_job)
                    out.index_add_(0, cpu_tokens, y.to(out.device, non_blocking=False))
        finally:
            if future is not None and not future.done() and rt.broken is None:
                # The fast side failed: let the worker finish, so the next job does not queue behind this one.
                # (After a timeout `broken` is set and the timeout is not waited out a second time.)
                with contextlib.suppress(Exception):
                    rt.wait_cpu(future, self.index)
        return out

    def _record(self, counts: np.ndarray, plan: LayerPlan) -> None:
        st = self.runtime.stats
        phase = PHASES.index(self.runtime.phase)
        st.assignments[phase, self.index] += counts
        st.hits[phase, self.index] += int(sum(counts[e] for e in plan.resident))
        st.cpu_expert_calls += len(plan.cpu)
        st.fetches += len(plan.fetch)
        st.h2d_bytes += len(plan.fetch) * self.runtime.expert_bytes

    def _run_fast(self, plan: LayerPlan, offsets: np.ndarray, tokens: torch.Tensor, weights: torch.Tensor,
                  hidden: torch.Tensor, out: torch.Tensor) -> None:
        rt = self.runtime
        staging = rt.staging
        fetch = list(plan.fetch)
        # Start the first copies before the resident experts run, so they overlap with compute.
        for i, e in enumerate(fetch[: staging.slots]):
            staging.load(i, self.slow_gate_up[self.slot[e]], self.slow_down[self.slot[e]], rt.stats, rt.clock)
        stream = torch.cuda.current_stream(rt.fast) if rt.cuda else None
        if plan.resident:
            with Timer(rt.stats, "gpu_expert_ms", stream, rt.clock):
                for e in plan.resident:
                    s = self.slot[e]
                    self._apply(e, offsets, tokens, weights, hidden, out, self.fast_gate_up[s], self.fast_down[s])
        for i, e in enumerate(fetch):
            slot = i % staging.slots
            gate_up, down = staging.acquire(slot)
            # Timed after the wait for its copy and apart from the next load: gpu_expert_ms and fetch_ms
            # are disjoint (the loads are fetch_ms only).
            with Timer(rt.stats, "gpu_expert_ms", stream, rt.clock):
                self._apply(e, offsets, tokens, weights, hidden, out, gate_up, down)
            staging.release(slot)
            nxt = i + staging.slots
            if nxt < len(fetch):
                f = fetch[nxt]
                staging.load(slot, self.slow_gate_up[self.slot[f]], self.slow_down[self.slot[f]], rt.stats, rt.clock)

    def _apply(self, expert: int, offsets: np.ndarray, tokens: torch.Tensor, weights: torch.Tensor,
               hidden: torch.Tensor, out: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        a, b = int(offsets[expert]), int(offsets[expert + 1])
        tok = tokens[a:b]
        y = self.adapter.run(self.module, hidden[tok], gate_up, down) * weights[a:b, None]
        out.index_add_(0, tok, y.to(out.dtype))

    def _cpu_job(self, experts: Sequence[int], sizes: Sequence[int], x: torch.Tensor, w: torch.Tensor,
                 out_dtype: torch.dtype) -> Callable[[], torch.Tensor]:
        rt = self.runtime

        def job() -> torch.Tensor:
            # Thread-local settings: a new thread starts with grad enabled and may hold another thread count.
            if torch.get_num_threads() != rt.worker_threads:
                torch.set_num_threads(rt.worker_threads)
            t0 = rt.clock()
            with torch.no_grad():
                y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
                start = 0
                for e, n in zip(experts, sizes):
                    s = self.slot[e]
                    part = self.adapter.run(self.module, x[start:start + n], self.slow_gate_up[s], self.slow_down[s])
                    y[start:start + n] = (part * w[start:start + n, None]).to(out_dtype)
                    start += n
            job.elapsed_ms = (rt.clock() - t0) / 1e6  # type: ignore[attr-defined]
            return y

        return job

    def _cpu_result(self, future: Future[torch.Tensor] | None, job: Callable[[], torch.Tensor]) -> torch.Tensor:
        rt = self.runtime
        try:
            y = job() if future is None else rt.wait_cpu(future, self.index)
        except OffloadError:
            raise
        except Exception as exc:
            raise OffloadError(f"a CPU expert of MoE layer {self.index} failed: {type(exc).__name__}: {exc}") from exc
        rt.stats.cpu_expert_ms += getattr(job, "elapsed_ms", 0.0)
        return y
