"""`OffloadedLayer`: one MoE layer's experts split into a fast tier and a slow tier, and how a step runs.

Per step the scheduler (scheduler.py) plans which non-resident experts run on the CPU worker and which
are fetched to the fast tier; the CPU job runs beside the fast tier's experts and its output is added
back. The seam that calls `OffloadedLayer.forward` is seam.py; what the layers share is runtime.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from .runtime import PHASES, OffloadStats, Runtime, Timer, host_empty, torch_threads
from .scheduler import LayerPlan, both_sides

# Re-exported: these names lived here before the seam, the stats and the runtime got modules of their own.
from .seam import (
    ADAPTERS,
    IMPLEMENTATION,
    ExpertsSite,
    FusedExpertsAdapter,
    OffloadError,
    find_experts,
    register_implementation,
)


class OffloadedLayer:
    """One MoE layer's experts split into a fast tier (resident) and a slow tier (contiguous host memory)."""

    def __init__(
        self,
        site: ExpertsSite,
        resident: Sequence[bool],
        runtime: Runtime,
        weights: Callable[[Sequence[int]], tuple[torch.Tensor, torch.Tensor]],
        pin: bool,
    ) -> None:
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
        t0 = rt.clock()
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
        if both_sides(plan):  # how long such a layer really takes, overlapped or not (online.py, modes)
            rt.observe_layer("overlap" if future is not None else "sequential", int(counts.sum()), plan, t0)
        return out

    def _record(self, counts: np.ndarray, plan: LayerPlan) -> None:
        st = self.runtime.stats
        phase = PHASES.index(self.runtime.phase)
        st.assignments[phase, self.index] += counts
        st.hits[phase, self.index] += int(sum(counts[e] for e in plan.resident))
        st.cpu_expert_calls += len(plan.cpu)
        st.fetches += len(plan.fetch)
        st.h2d_bytes += len(plan.fetch) * self.runtime.expert_bytes

    def _run_fast(
        self,
        plan: LayerPlan,
        offsets: np.ndarray,
        tokens: torch.Tensor,
        weights: torch.Tensor,
        hidden: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        rt = self.runtime
        staging = rt.staging
        fetch = list(plan.fetch)
        # Start the first copies before the resident experts run, so they overlap with compute.
        for i, e in enumerate(fetch[: staging.slots]):
            self._load(i, e)
        stream = torch.cuda.current_stream(rt.fast) if rt.cuda else None
        # Each expert timed on its own: the live cost model learns per token count (online.py).
        for e in plan.resident:
            s = self.slot[e]
            assert self.fast_gate_up is not None and self.fast_down is not None  # a resident expert: the fast tier
            with Timer(rt.stats, "gpu_expert_ms", stream, rt.clock, rt.observer("gpu", self._tokens(offsets, e))):
                self._apply(e, offsets, tokens, weights, hidden, out, self.fast_gate_up[s], self.fast_down[s])
        for i, e in enumerate(fetch):
            slot = i % staging.slots
            gate_up, down = staging.acquire(slot)
            # Timed after the wait for its copy and apart from the next load: gpu_expert_ms and fetch_ms
            # are disjoint (the loads are fetch_ms only).
            with Timer(rt.stats, "gpu_expert_ms", stream, rt.clock, rt.observer("gpu", self._tokens(offsets, e))):
                self._apply(e, offsets, tokens, weights, hidden, out, gate_up, down)
            staging.release(slot)
            nxt = i + staging.slots
            if nxt < len(fetch):
                self._load(slot, fetch[nxt])

    @staticmethod
    def _tokens(offsets: np.ndarray, expert: int) -> int:
        return int(offsets[expert + 1] - offsets[expert])

    def _load(self, slot: int, expert: int) -> None:
        rt = self.runtime
        assert self.slow_gate_up is not None and self.slow_down is not None  # a fetched expert: the slow tier
        rt.staging.load(
            slot,
            self.slow_gate_up[self.slot[expert]],
            self.slow_down[self.slot[expert]],
            rt.stats,
            rt.clock,
            rt.observer("copy", 0),
        )

    def _apply(
        self,
        expert: int,
        offsets: np.ndarray,
        tokens: torch.Tensor,
        weights: torch.Tensor,
        hidden: torch.Tensor,
        out: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
    ) -> None:
        a, b = int(offsets[expert]), int(offsets[expert + 1])
        tok = tokens[a:b]
        y = self.adapter.run(self.module, hidden[tok], gate_up, down) * weights[a:b, None]
        out.index_add_(0, tok, y.to(out.dtype))

    def _cpu_job(
        self, experts: Sequence[int], sizes: Sequence[int], x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype
    ) -> Callable[[], torch.Tensor]:
        rt = self.runtime
        observers = [rt.observer("cpu", n) for n in sizes]  # taken now: the scheduler may change between runs

        def job() -> torch.Tensor:
            # Thread-local settings: a new thread starts with grad enabled and may hold another thread count.
            if torch.get_num_threads() != rt.worker_threads:
                torch.set_num_threads(rt.worker_threads)
            t0 = t = rt.clock()
            with torch.no_grad():
                y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
                start = 0
                for e, n, observe in zip(experts, sizes, observers):
                    s = self.slot[e]
                    assert self.slow_gate_up is not None and self.slow_down is not None  # a cpu expert: the slow tier
                    part = self.adapter.run(self.module, x[start : start + n], self.slow_gate_up[s], self.slow_down[s])
                    y[start : start + n] = (part * w[start : start + n, None]).to(out_dtype)
                    start += n
                    if observe is not None:  # each expert on its own: the live model learns per token count
                        now = rt.clock()
                        observe((now - t) / 1e6)
                        t = now
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


def detach_experts(sites: Sequence[ExpertsSite]) -> tuple[Callable[[ExpertsSite], Any], Any, Any]:
    """Take the experts out of the model's MoE layers (onto the host): a source that hands over each site's
    weights once (by expert ids, with their shapes, as random_model's does), and the two weights' shapes."""
    held = {id(s.module): s.adapter.weights(s.module) for s in sites}
    gu_shape, dn_shape = held[id(sites[0].module)][0].shape, held[id(sites[0].module)][1].shape
    for s in sites:
        s.adapter.detach(s.module, torch.device("cpu"))

    def source(site: ExpertsSite) -> Any:
        gu, dn = held.pop(id(site.module))  # the layer copies them into its tiers: these go
        return (lambda ids: (gu[list(ids)], dn[list(ids)])), gu.shape, dn.shape

    return source, gu_shape, dn_shape
