"""The scheduler's cost model: what an expert costs on each tier, measured on this machine at start-up.

Fiddler hard-codes `latency_cpu = 7` and `latency_gpu = 70` (per token on CPU, per expert on GPU,
"TODO: find this value based on device config"). We measure instead:

- CPU (slow tier) expert latency as `a + b * tokens` (least-squares fit over a few token counts);
- host-to-device copy bandwidth, through the same staging copy the fetch path uses;
- fast-tier expert latency as `a + b * tokens`.

A non-resident expert with `n` tokens costs `cpu_ms(n)` on the slow tier, or `fetch_ms() + gpu_ms(n)` if
copied to the fast tier; a resident expert costs `gpu_ms(n)`. The seed's knobs are kept as overrides:
`latency_cpu=L` makes `cpu_ms(n) = L * n`, `latency_gpu=G` makes a fetched expert cost `G` and a resident
one 0 -- exactly Fiddler's rule, so its 7/70 sweep can be re-run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class LinearFit:
    """`a + b * tokens` milliseconds, with the points it was fitted to."""

    a_ms: float
    b_ms: float
    tokens: tuple[int, ...] = ()
    measured_ms: tuple[float, ...] = ()

    def __call__(self, tokens: int) -> float:
        return self.a_ms + self.b_ms * tokens

    @classmethod
    def fit(cls, tokens: Sequence[int], ms: Sequence[float]) -> LinearFit:
        """Least squares, clamped to non-negative coefficients (noise can make a tiny intercept negative)."""
        x = np.asarray(tokens, dtype=float)
        y = np.asarray(ms, dtype=float)
        if len(x) < 2 or np.ptp(x) == 0:
            raise ValueError("a linear fit needs at least two distinct token counts")
        b, a = np.polyfit(x, y, 1)
        if b < 0:  # flat or noisy: fall back to the mean as a constant cost
            a, b = float(np.mean(y)), 0.0
        if a < 0:  # refit through the origin
            a, b = 0.0, float(np.dot(x, y) / np.dot(x, x))
        return cls(float(a), float(b), tuple(int(t) for t in tokens), tuple(float(v) for v in ms))


@dataclass(frozen=True)
class CostModel:
    """Per-expert costs in milliseconds. `latency_cpu` / `latency_gpu` override the measured values."""

    cpu: LinearFit
    gpu: LinearFit
    h2d_bytes_per_s: float
    expert_bytes: int
    latency_cpu: float | None = None  # Fiddler's knob: ms per token on the slow tier
    latency_gpu: float | None = None  # Fiddler's knob: ms per fetched expert on the fast tier
    source: str = "measured"

    def cpu_ms(self, tokens: int) -> float:
        if self.latency_cpu is not None:
            return self.latency_cpu * tokens
        return self.cpu(tokens)

    def resident_ms(self, tokens: int) -> float:
        """A resident expert on the fast tier (Fiddler counts it as free)."""
        if self.latency_gpu is not None:
            return 0.0
        return self.gpu(tokens)

    def fetch_copy_ms(self) -> float:
        return 1000.0 * self.expert_bytes / self.h2d_bytes_per_s if self.h2d_bytes_per_s > 0 else math.inf

    def fetch_ms(self, tokens: int) -> float:
        """Copy a non-resident expert to the fast tier and run it there."""
        if self.latency_gpu is not None:
            return self.latency_gpu
        return self.fetch_copy_ms() + self.gpu(tokens)

    def with_overrides(self, latency_cpu: float | None = None, latency_gpu: float | None = None) -> CostModel:
        for name, value in (("latency_cpu", latency_cpu), ("latency_gpu", latency_gpu)):
            if value is not None and (not isinstance(value, (int, float)) or value < 0 or math.isnan(value)):
                raise ValueError(f"{name} must be a number of milliseconds >= 0, got {value!r}")
        return replace(self, latency_cpu=latency_cpu, latency_gpu=latency_gpu)

    def summary(self) -> dict[str, Any]:
        """The fitted values, for reports: ms, ms/token, GB/s."""
        return {
            "source": self.source,
            "cpu_a_ms": round(self.cpu.a_ms, 4), "cpu_b_ms_per_token": round(self.cpu.b_ms, 5),
            "gpu_a_ms": round(self.gpu.a_ms, 4), "gpu_b_ms_per_token": round(self.gpu.b_ms, 5),
            "h2d_gb_per_s": round(self.h2d_bytes_per_s / 1e9, 3),
            "expert_bytes": self.expert_bytes,
            "fetch_copy_ms": round(self.fetch_copy_ms(), 4),
            "latency_cpu": self.latency_cpu, "latency_gpu": self.latency_gpu,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def fixed_costs(latency_cpu: float, latency_gpu: float, expert_bytes: int = 1) -> CostModel:
    """Fiddler's constant model, without measuring anything (tests, dry runs)."""
    zero = LinearFit(0.0, 0.0)
    return CostModel(cpu=zero, gpu=zero, h2d_bytes_per_s=math.inf, expert_bytes=expert_bytes,
                     latency_cpu=latency_cpu, latency_gpu=latency_gpu, source="fixed")


Timer = Callable[[], float]  # seconds


def _best_ms(run: Callable[[], None], sync: Callable[[], None], repeats: int, timer: Timer) -> float:
    run()  # warm: allocator, kernels, thread pool
    sync()
    samples = []
    for _ in range(repeats):
        t0 = timer()
        run()
        sync()
        samples.append((timer() - t0) * 1000.0)
    return float(np.min(samples))  # noise on a shared machine only adds time: the minimum is the cost


def measure_costs(*, slow_weights: tuple[Any, Any], fast_device: str, act: Callable[[Any], Any],
                  token_counts: Sequence[int] = (1, 2, 4, 8, 16, 32), repeats: int = 5,
                  timer: Timer = time.perf_counter) -> CostModel:
    """Microbenchmark one expert of the real shape (`slow_weights` = its gate_up and down on the slow
    tier): slow-tier latency per token count, a host-to-fast copy through a staging buffer, and
    fast-tier latency. Fits `a + b * tokens` to both latencies. Takes a few hundred ms for Mixtral.
    """
    import torch
    import torch.nn.functional as F

    gate_up, down = slow_weights
    cuda = torch.device(fast_device).type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    hidden = gate_up.shape[-1]

    def expert(x: Any, gu: Any, dn: Any) -> Any:
        g, u = F.linear(x, gu).chunk(2, dim=-1)
        return F.linear(act(g) * u, dn)

    cpu_ms, gpu_ms = [], []
    stage_gu = torch.empty_like(gate_up, device=fast_device)
    stage_dn = torch.empty_like(down, device=fast_device)
    with torch.inference_mode():
        for n in token_counts:
            x = torch.randn(n, hidden, dtype=gate_up.dtype)
            cpu_ms.append(_best_ms(lambda: expert(x, gate_up, down), lambda: None, repeats, timer))
        expert_bytes = gate_up.numel() * gate_up.element_size() + down.numel() * down.element_size()

        def copy() -> None:
            stage_gu.copy_(gate_up, non_blocking=cuda)
            stage_dn.copy_(down, non_blocking=cuda)

        copy_ms = _best_ms(copy, sync, repeats, timer)
        for n in token_counts:
            xf = torch.randn(n, hidden, dtype=gate_up.dtype, device=fast_device)
            gpu_ms.append(_best_ms(lambda: expert(xf, stage_gu, stage_dn), sync, repeats, timer))
    bandwidth = expert_bytes / (copy_ms / 1000.0) if copy_ms > 0 else math.inf
    return CostModel(cpu=LinearFit.fit(token_counts, cpu_ms), gpu=LinearFit.fit(token_counts, gpu_ms),
                     h2d_bytes_per_s=bandwidth, expert_bytes=int(expert_bytes))
