"""The live cost model: the start-up costs corrected by what the engine observes while it runs.

A start-up measurement taken on a busy machine can be 100x off, and every plan after it would follow the
wrong figure for the engine's whole life. So every expert the engine runs is timed (runtime.py feeds the
timings here) and each tier keeps, per token-count bucket (1, 2, 3-4, 5-8, ... tokens), a window of the
last `window` ratios observed / start-up prediction. The live cost is the start-up prediction times the
median ratio of the bucket (the tier's median over all buckets while that bucket has seen nothing): a
robust estimate that follows the machine within a few observations and ignores a single outlier.

Tiers: `cpu` (one expert on the slow tier), `copy` (one expert's host-to-fast copy), `gpu` (one expert
on the fast tier, resident or fetched). Overrides stay fixed, as in Fiddler: with `latency_cpu` the cpu
tier ignores observations, with `latency_gpu` the copy and gpu tiers do.

A tier the plans never use is never observed, so a figure that is too high would stay wrong forever. So
when a tier has gone `probe_every` plans without an observation, the scheduler sends one expert (the one
with the fewest tokens) there once: a probe. Its cost is bounded (one expert per `probe_every` plans).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .costs import CostModel

TIERS = ("cpu", "copy", "gpu")
_FLOOR_MS = 1e-6  # a start-up prediction of 0 ms still gets a finite ratio


def bucket(tokens: int) -> int:
    """0 for 1 token, 1 for 2, 2 for 3-4, 3 for 5-8, ...: costs grow with tokens, the ratio much less."""
    return max(0, int(tokens) - 1).bit_length()


def bucket_label(b: int) -> str:
    lo, hi = (1, 1) if b == 0 else (2 ** (b - 1) + 1, 2**b)
    return str(lo) if lo == hi else f"{lo}-{hi}"


@dataclass
class OnlineCosts:
    """`CostModel`'s interface (cpu_ms, fetch_ms, resident_ms, ...) over `base`, corrected by `observe()`."""

    base: CostModel
    window: int = 8
    probe_every: int = 32
    enabled: bool = True
    observations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    probes: int = 0
    _ratios: dict[tuple[str, int], deque[float]] = field(default_factory=dict, repr=False)
    _tier: dict[str, deque[float]] = field(default_factory=dict, repr=False)
    _since: dict[str, int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"online_window must be an integer >= 1, got {self.window!r}")
        if not isinstance(self.probe_every, int) or self.probe_every < 1:
            raise ValueError(f"online_probe_every must be an integer >= 1, got {self.probe_every!r}")
        self._tier = {t: deque(maxlen=4 * self.window) for t in TIERS}
        self._since = dict.fromkeys(TIERS, self.probe_every)  # probe an unused tier at the first plan

    # -- what is fixed -------------------------------------------------------------------------------

    @property
    def latency_cpu(self) -> float | None:
        return self.base.latency_cpu

    @property
    def latency_gpu(self) -> float | None:
        return self.base.latency_gpu

    def learns(self, tier: str) -> bool:
        """Observations change this tier (online on, and no override fixes it)."""
        if not self.enabled:
            return False
        return self.base.latency_cpu is None if tier == "cpu" else self.base.latency_gpu is None

    # -- the model -------------------------------------------------------------------------------------

    def _base_ms(self, tier: str, tokens: int) -> float:
        if tier == "cpu":
            return self.base.cpu(tokens)
        if tier == "copy":
            return self.base.fetch_copy_ms()
        return self.base.gpu(tokens)

    def scale(self, tier: str, tokens: int = 1) -> float:
        """Live / start-up cost of one expert with `tokens` tokens on `tier` (1.0 until observed)."""
        if not self.learns(tier):
            return 1.0
        key = (tier, bucket(tokens) if tier != "copy" else 0)
        with self._lock:
            ratios = self._ratios.get(key) or self._tier[tier]
            return float(math.exp(np.median(ratios))) if ratios else 1.0

    def live_ms(self, tier: str, tokens: int) -> float:
        base = self._base_ms(tier, tokens)
        return base * self.scale(tier, tokens) if math.isfinite(base) else base

    def cpu_ms(self, tokens: int) -> float:
        return self.base.cpu_ms(tokens) if self.base.latency_cpu is not None else self.live_ms("cpu", tokens)

    def resident_ms(self, tokens: int) -> float:
        return self.base.resident_ms(tokens) if self.base.latency_gpu is not None else self.live_ms("gpu", tokens)

    def fetch_copy_ms(self) -> float:
        return self.live_ms("copy", 0)

    def fetch_ms(self, tokens: int) -> float:
        if self.base.latency_gpu is not None:
            return self.base.latency_gpu
        return self.fetch_copy_ms() + self.live_ms("gpu", tokens)

    # -- learning --------------------------------------------------------------------------------------

    def observe(self, tier: str, tokens: int, ms: float) -> None:
        """One expert (or one copy) took `ms` on `tier`. Called from the main thread and the CPU worker."""
        if tier not in TIERS:
            raise ValueError(f"tier {tier!r} is not one of {', '.join(TIERS)}")
        if not self.learns(tier) or not (ms > 0 and math.isfinite(ms)):
            return
        base = self._base_ms(tier, tokens)
        if not math.isfinite(base):
            return
        ratio = math.log(ms / max(base, _FLOOR_MS))
        key = (tier, bucket(tokens) if tier != "copy" else 0)
        with self._lock:
            self._ratios.setdefault(key, deque(maxlen=self.window)).append(ratio)
            self._tier[tier].append(ratio)
            self.observations[tier] += 1
            self._since[tier] = 0

    def observer(self, tier: str, tokens: int) -> Callable[[float], None] | None:
        """A callback for one timing, or None when this tier does not learn (saves the clock reads' work)."""
        if not self.learns(tier):
            return None
        return lambda ms: self.observe(tier, tokens, ms)

    def planned(self) -> None:
        """The scheduler made one plan: tiers it did not use age towards a probe."""
        with self._lock:
            for tier in TIERS:
                self._since[tier] += 1

    def wants_probe(self, tier: str) -> bool:
        """`tier` has gone `probe_every` plans without an observation (and learns)."""
        if not self.learns(tier):
            return False
        with self._lock:
            return self._since[tier] >= self.probe_every

    def probed(self, tier: str) -> None:
        """A plan probes `tier` ("cpu", or "copy" for a fetch, which also times the gpu tier)."""
        with self._lock:
            self.probes += 1
            for t in ((tier,) if tier == "cpu" else ("copy", "gpu")):
                self._since[t] = 0  # one probe, then wait for its observation or another interval

    # -- reports ---------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The live model per tier and bucket: the factor on the start-up cost, observations, live ms."""
        with self._lock:
            keys = sorted(self._ratios)
        buckets: dict[str, dict[str, Any]] = {}
        for tier, b in keys:
            tokens = 2**b if tier != "copy" else 0
            label = "copy" if tier == "copy" else f"{tier}[{bucket_label(b)} tokens]"
            buckets[label] = {"scale": round(self.scale(tier, max(tokens, 1)), 4),
                              "observed": len(self._ratios[(tier, b)]),
                              "live_ms": round(self.live_ms(tier, tokens), 5)}
        return {"online": self.enabled, "window": self.window, "probe_every": self.probe_every,
                "fixed": [t for t in TIERS if not self.learns(t)] if self.enabled else list(TIERS),
                "observations": dict(self.observations), "probes": self.probes,
                "scale": {t: round(self.scale(t), 4) for t in TIERS},
                "buckets": buckets}

    def counters(self) -> dict[str, float]:
        """Flat figures for a run's counters: the live model at the end of the run."""
        return {"costs.cpu_1tok_ms": self.cpu_ms(1), "costs.fetch_1tok_ms": self.fetch_ms(1),
                **{f"costs.{t}_scale": self.scale(t) for t in TIERS},
                "costs.observations": float(sum(self.observations.values())), "costs.probes": float(self.probes)}

    def summary(self) -> dict[str, Any]:
        """The start-up model (`CostModel.summary`) and the live one."""
        return {**self.base.summary(), "live": self.snapshot()}
