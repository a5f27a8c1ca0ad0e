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

import contextlib
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
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
    def fit(cls, tokens: Sequence[int], ms: Sequence[float] | np.ndarray) -> LinearFit:
        """Least squares on relative residuals (weights 1/ms: a 1-token decode expert matters as much as a
        32-token one), clamped to non-negative coefficients (noise can make a tiny intercept negative)."""
        x = np.asarray(tokens, dtype=float)
        y = np.asarray(ms, dtype=float)
        if len(x) < 2 or np.ptp(x) == 0:
            raise ValueError("a linear fit needs at least two distinct token counts")
        w = 1.0 / np.maximum(np.abs(y), 1e-9)
        b, a = np.polyfit(x, y, 1, w=w)
        if b < 0:  # flat or noisy: fall back to the mean as a constant cost
            a, b = float(np.mean(y)), 0.0
        if a < 0:  # refit through the origin, same weights
            a, b = 0.0, float(np.dot(w * w * x, y) / np.dot(w * w * x, x))
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
    calibration: Calibration | None = None  # how a measured model was obtained (None: injected or fixed)

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
            "cpu_a_ms": round(self.cpu.a_ms, 4),
            "cpu_b_ms_per_token": round(self.cpu.b_ms, 5),
            "gpu_a_ms": round(self.gpu.a_ms, 4),
            "gpu_b_ms_per_token": round(self.gpu.b_ms, 5),
            "h2d_gb_per_s": round(self.h2d_bytes_per_s / 1e9, 3),
            "expert_bytes": self.expert_bytes,
            "fetch_copy_ms": round(self.fetch_copy_ms(), 4),
            "latency_cpu": self.latency_cpu,
            "latency_gpu": self.latency_gpu,
            "calibration": self.calibration.summary() if self.calibration else None,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def fixed_costs(latency_cpu: float, latency_gpu: float, expert_bytes: int = 1) -> CostModel:
    """Fiddler's constant model, without measuring anything (tests, dry runs)."""
    zero = LinearFit(0.0, 0.0)
    return CostModel(
        cpu=zero,
        gpu=zero,
        h2d_bytes_per_s=math.inf,
        expert_bytes=expert_bytes,
        latency_cpu=latency_cpu,
        latency_gpu=latency_gpu,
        source="fixed",
    )


Timer = Callable[[], float]  # seconds

#: Above these the start-up figures are not trusted without a warning (the online correction still fixes them).
MAX_SPREAD = 0.5  # interquartile range / median of one point's repeated timings
MAX_FIT_ERROR = 0.5  # largest |fit - measured| / measured over the fitted points
MAX_BUSY_CORES = 0.5  # other processes plus other threads of ours, averaged over the measurement


class CostWarning(UserWarning):
    """The start-up cost measurement is not trustworthy: a poor fit, a wide spread or a busy machine."""


@dataclass(frozen=True)
class Calibration:
    """How the start-up costs were obtained, with the figures that say whether to trust them."""

    rounds: int  # interleaved rounds: every point timed once per round, in rotating order
    estimator: str
    spread: float  # worst interquartile range / median over the points
    fit_error: float  # worst relative residual of the two linear fits
    foreign_cores: float  # other processes' load during the measurement (LoadMeter)
    sibling_cores: float  # other threads of this process during the measurement
    seconds: float
    warning: str | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "estimator": self.estimator,
            "spread": round(self.spread, 3),
            "fit_error": round(self.fit_error, 3),
            "foreign_cores": round(self.foreign_cores, 2),
            "sibling_cores": round(self.sibling_cores, 2),
            "seconds": round(self.seconds, 3),
            "warning": self.warning,
        }


def relative_fit_error(fit: LinearFit) -> float:
    y = np.asarray(fit.measured_ms, dtype=float)
    if not len(y):
        return 0.0
    pred = np.asarray([fit(t) for t in fit.tokens])
    return float(np.max(np.abs(pred - y) / np.maximum(y, 1e-9)))


def _interleaved_ms(
    points: Sequence[tuple[Callable[[], None], Callable[[], None]]],
    rounds: int,
    timer: Timer,
    min_seconds: float = 0.0,
    max_rounds: int = 1000,
) -> np.ndarray:
    """[round, point] milliseconds: one warm-up of each point, then every point once per round, the order
    rotated each round, so a disturbance lasting part of the measurement hits every point alike. At least
    `rounds` rounds, more until `min_seconds` have passed (the load meter reads 10 ms ticks, and a tiny
    expert's rounds take microseconds), at most `max_rounds`."""
    for run, sync in points:
        run()
        sync()
    out: list[list[float]] = []
    start = timer()
    while len(out) < rounds or (timer() - start < min_seconds and len(out) < max_rounds):
        shift = len(out) % len(points)
        row = [0.0] * len(points)
        for i in [*range(shift, len(points)), *range(shift)]:
            run, sync = points[i]
            t0 = timer()
            run()
            sync()
            row[i] = (timer() - t0) * 1000.0
        out.append(row)
    return np.asarray(out)


ESTIMATE_PERCENTILE = 10


def robust_ms(samples: np.ndarray) -> np.ndarray:
    """Per point (column): the 10th percentile. Noise on a shared machine only adds time, so a low
    quantile is the cost; unlike the minimum it needs a tenth of the rounds to be quiet, not one lucky one.
    Measured beside a busy neighbour thread (docs/offload.md, scripts/offload_costs.py neighbour): with the
    switch interval below, within 1.4x of a quiet start-up; the 25th percentile without it went to 2.6x."""
    return np.percentile(samples, ESTIMATE_PERCENTILE, axis=0)


@contextlib.contextmanager
def gil_switch_interval(seconds: float) -> Iterator[None]:
    """Hand the GIL back sooner while timing: a Python thread beside the measurement otherwise holds it
    for the default 5 ms after every torch op releases it, and a 0.05 ms expert times at milliseconds."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def spread(samples: np.ndarray) -> float:
    q1, q2, q3 = np.percentile(samples, [25, 50, 75], axis=0)
    return float(np.max((q3 - q1) / np.maximum(q2, 1e-9)))


def measure_costs(
    *,
    slow_weights: tuple[Any, Any],
    fast_device: str,
    act: Callable[[Any], Any],
    token_counts: Sequence[int] = (1, 2, 4, 8, 16, 32),
    rounds: int = 15,
    min_seconds: float = 0.5,
    timer: Timer = time.perf_counter,
) -> CostModel:
    """Microbenchmark one expert of the real shape (`slow_weights` = its gate_up and down on the slow
    tier): slow-tier latency per token count, a host-to-fast copy through a staging buffer, and
    fast-tier latency, all interleaved over `rounds` rounds, estimated per point by `robust_ms`, with
    the load meter around it. Fits `a + b * tokens` to both latencies. Warns (`CostWarning`) with the
    figures when the spread, the fit or the load says not to trust the result.
    """
    import torch
    import torch.nn.functional as F

    from ..measure.runner import LoadMeter

    if rounds < 3:
        raise ValueError(f"cost measurement rounds must be >= 3 for a robust estimate, got {rounds}")
    gate_up, down = slow_weights
    cuda = torch.device(fast_device).type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    hidden = gate_up.shape[-1]

    def expert(x: Any, gu: Any, dn: Any) -> Any:
        g, u = F.linear(x, gu).chunk(2, dim=-1)
        return F.linear(act(g) * u, dn)

    stage_gu = torch.empty_like(gate_up, device=fast_device)
    stage_dn = torch.empty_like(down, device=fast_device)
    expert_bytes = gate_up.numel() * gate_up.element_size() + down.numel() * down.element_size()

    def copy() -> None:
        stage_gu.copy_(gate_up, non_blocking=cuda)
        stage_dn.copy_(down, non_blocking=cuda)

    def on_cpu(x: Any) -> tuple[Callable[[], None], Callable[[], None]]:
        return (lambda: expert(x, gate_up, down)), (lambda: None)

    def on_fast(x: Any) -> tuple[Callable[[], None], Callable[[], None]]:
        return (lambda: expert(x, stage_gu, stage_dn)), sync

    with torch.inference_mode():
        xs = [torch.randn(n, hidden, dtype=gate_up.dtype) for n in token_counts]
        xfs = [x.to(fast_device) for x in xs]
        points = [*(on_cpu(x) for x in xs), (copy, sync), *(on_fast(x) for x in xfs)]
        meter = LoadMeter()
        with gil_switch_interval(0.0005):
            samples = _interleaved_ms(points, rounds, timer, min_seconds)
        load = meter.reading()
    k = len(token_counts)
    est = robust_ms(samples)
    cpu_ms, copy_ms, gpu_ms = est[:k], float(est[k]), est[k + 1 :]
    bandwidth = expert_bytes / (copy_ms / 1000.0) if copy_ms > 0 else math.inf
    cpu, gpu = LinearFit.fit(token_counts, cpu_ms), LinearFit.fit(token_counts, gpu_ms)
    calibration = Calibration(
        rounds=len(samples),
        estimator=f"{ESTIMATE_PERCENTILE}th percentile of interleaved rounds",
        spread=spread(samples),
        fit_error=max(relative_fit_error(cpu), relative_fit_error(gpu)),
        foreign_cores=load.foreign_cores,
        sibling_cores=load.sibling_cores,
        seconds=load.wall_s,
    )
    calibration = replace(calibration, warning=calibration_warning(calibration, cpu, copy_ms))
    if calibration.warning:
        warnings.warn(CostWarning(calibration.warning), stacklevel=2)
    return CostModel(
        cpu=cpu, gpu=gpu, h2d_bytes_per_s=bandwidth, expert_bytes=int(expert_bytes), calibration=calibration
    )


def calibration_warning(c: Calibration, cpu: LinearFit, copy_ms: float) -> str | None:
    """The warning text, with the figures, or None when the measurement looks trustworthy."""
    problems = []
    if c.foreign_cores + c.sibling_cores > MAX_BUSY_CORES:
        problems.append(
            f"the machine was busy ({c.foreign_cores:.2f} cores of other processes, "
            f"{c.sibling_cores:.2f} of other threads of this process)"
        )
    if c.spread > MAX_SPREAD:
        problems.append(f"repeated timings spread widely (interquartile range {c.spread:.0%} of the median)")
    if c.fit_error > MAX_FIT_ERROR:
        problems.append(f"a linear fit misses a measured point by {c.fit_error:.0%}")
    if not problems:
        return None
    return (
        f"offload cost model measured at start-up may be off: {'; '.join(problems)}. Measured: CPU expert "
        f"{cpu(1):.4f} ms at 1 token, {cpu.b_ms:.5f} ms/token; fetch copy {copy_ms:.4f} ms. The engine "
        "corrects the costs from what it observes while it runs (online_costs), unless overridden."
    )
