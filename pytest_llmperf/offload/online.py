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
with the fewest tokens) there once: a probe. Its answer replaces what the tier knew (stale by then: a busy
spell must not keep a tier unused for several probes). Each probe that does not bring the tier back into
use doubles the interval (at most 64x), so a tier that stays worse costs ever fewer probes.

Modes (`modes=True`, the engine sets it when both tiers compute on the host): per-expert costs do not say
what running the CPU experts on the worker thread beside the fast tier costs (the hand-off, two threads
of Python contending for the GIL on small experts). So a layer that has work on both sides is also timed
as a whole, and `overlap` / `sequential` keep, per bucket of the layer's token-expert assignments, the
ratio observed / planned (max of the two sides overlapped, their sum sequential). The scheduler plans
both ways and runs the one whose plan times its ratio is lower; a mode unused for `probe_every` plans is
probed like a tier.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .costs import CostModel

TIERS = ("cpu", "copy", "gpu")
MODES = ("overlap", "sequential")
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
    modes: bool = False  # also learn overlapped vs sequential layers (see the module docstring)
    observations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS + MODES, 0))
    probes: int = 0
    sequential_plans: int = 0  # plans with work on both sides that the modes ran one side after the other
    _ratios: dict[tuple[str, int], deque[float]] = field(default_factory=dict, repr=False)
    _tier: dict[str, deque[float]] = field(default_factory=dict, repr=False)
    # Medians cached until the next observation of their window: plans read them many times per layer.
    _scales: dict[tuple[str, int], float] = field(default_factory=dict, repr=False)
    _tier_scale: dict[str, float] = field(default_factory=dict, repr=False)
    _since: dict[str, int] = field(default_factory=dict, repr=False)
    _interval: dict[str, int] = field(default_factory=dict, repr=False)  # plans between probes, per tier
    _probing: set[str] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"online_window must be an integer >= 1, got {self.window!r}")
        if not isinstance(self.probe_every, int) or self.probe_every < 1:
            raise ValueError(f"online_probe_every must be an integer >= 1, got {self.probe_every!r}")
        self._tier = {t: deque(maxlen=4 * self.window) for t in TIERS + MODES}
        self._since = dict.fromkeys(TIERS + MODES, self.probe_every)  # probe an unused tier at the first plan
        self._interval = dict.fromkeys(TIERS + MODES, self.probe_every)
        self._learns = {t: self._learns_now(t) for t in TIERS + MODES}  # base and flags are fixed from here on

    # -- what is fixed -------------------------------------------------------------------------------

    @property
    def latency_cpu(self) -> float | None:
        return self.base.latency_cpu

    @property
    def latency_gpu(self) -> float | None:
        return self.base.latency_gpu

    def learns(self, tier: str) -> bool:
        """Observations change this tier (online on, and no override fixes it)."""
        return self._learns[tier]

    def _learns_now(self, tier: str) -> bool:
        if not self.enabled:
            return False
        if tier in MODES:  # plans priced in an override's units say nothing about real layer times
            return self.modes and self.base.latency_cpu is None and self.base.latency_gpu is None
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
        if not self._learns[tier]:
            return 1.0
        key = (tier, (int(tokens) - 1).bit_length() if tokens > 1 and tier != "copy" else 0)  # bucket(), inlined
        scale = self._scales.get(key)
        if scale is None:
            with self._lock:
                window = self._ratios.get(key)
                if window:
                    scale = self._scales[key] = math.exp(statistics.median(window))
                else:  # a bucket not seen yet: the tier's median over all buckets
                    scale = self._tier_scale.get(tier)
                    if scale is None:
                        ratios = self._tier[tier]
                        scale = self._tier_scale[tier] = math.exp(statistics.median(ratios)) if ratios else 1.0
        return scale

    def live_ms(self, tier: str, tokens: int) -> float:
        base = self._base_ms(tier, tokens)
        return base * self.scale(tier, tokens) if math.isfinite(base) else base

    # The scheduler prices every expert of every layer with these: kept to a few lookups.
    def cpu_ms(self, tokens: int) -> float:
        if self.base.latency_cpu is not None:
            return self.base.latency_cpu * tokens
        return self.base.cpu(tokens) * self.scale("cpu", tokens)

    def resident_ms(self, tokens: int) -> float:
        if self.base.latency_gpu is not None:
            return 0.0
        return self.base.gpu(tokens) * self.scale("gpu", tokens)

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
        if math.isfinite(base):
            self._record(tier, tokens, ms / max(base, _FLOOR_MS))

    def observe_layer(self, mode: str, tokens: int, planned_ms: float, ms: float) -> None:
        """A layer with work on both sides, run in `mode`, took `ms`; its plan said `planned_ms`."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        if self.learns(mode) and ms > 0 and math.isfinite(ms) and planned_ms > 0 and math.isfinite(planned_ms):
            self._record(mode, tokens, ms / planned_ms)

    def _record(self, tier: str, tokens: int, ratio: float) -> None:
        key = (tier, bucket(tokens) if tier != "copy" else 0)
        with self._lock:
            if tier in self._probing:
                # A probe's answer: the tier went unused for a probe interval, so what it knew is stale (e.g.
                # inflated by a busy spell, which would otherwise keep it unused for several probes). The
                # answer replaces it; the next probe waits twice as long.
                self._probing.discard(tier)
                for stale in [k for k in self._ratios if k[0] == tier]:
                    del self._ratios[stale]
                    self._scales.pop(stale, None)
                self._tier[tier].clear()
            else:  # the plans use this tier: probing starts again from the short interval
                self._interval[tier] = self.probe_every
            self._ratios.setdefault(key, deque(maxlen=self.window)).append(math.log(ratio))
            self._tier[tier].append(math.log(ratio))
            self._scales.pop(key, None)
            self._tier_scale.pop(tier, None)
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
            for tier in TIERS + MODES:
                self._since[tier] += 1

    def wants_probe(self, tier: str) -> bool:
        """`tier` learns and has gone its probe interval without an observation: `probe_every` plans, doubled
        after each probe that did not bring it back into use (at most 64x), so a tier that stays worse
        costs ever fewer probes."""
        if not self.learns(tier):
            return False
        with self._lock:
            return self._since[tier] >= self._interval[tier]

    def probed(self, tier: str) -> None:
        """A plan probes `tier` (a mode, "cpu", or "copy" for a fetch, which also times the gpu tier)."""
        with self._lock:
            self.probes += 1
            self._probing.add(tier)
            self._interval[tier] = min(2 * self._interval[tier], 64 * self.probe_every)
            for t in (tier,) if tier != "copy" else ("copy", "gpu"):
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
            buckets[label] = {
                "scale": round(self.scale(tier, max(tokens, 1)), 4),
                "observed": len(self._ratios[(tier, b)]),
            }
            if tier in TIERS:
                buckets[label]["live_ms"] = round(self.live_ms(tier, tokens), 5)
        return {
            "online": self.enabled,
            "window": self.window,
            "probe_every": self.probe_every,
            "modes": self.modes,
            "fixed": [t for t in TIERS if not self.learns(t)],
            "observations": dict(self.observations),
            "probes": self.probes,
            "sequential_plans": self.sequential_plans,
            "scale": {t: round(self.scale(t), 4) for t in TIERS + MODES},
            "buckets": buckets,
        }

    def counters(self) -> dict[str, float]:
        """Flat figures for a run's counters: the live model at the end of the run."""
        return {
            "costs.cpu_1tok_ms": self.cpu_ms(1),
            "costs.fetch_1tok_ms": self.fetch_ms(1),
            **{f"costs.{t}_scale": self.scale(t) for t in TIERS + MODES},
            "costs.observations": float(sum(self.observations.values())),
            "costs.probes": float(self.probes),
        }

    def summary(self) -> dict[str, Any]:
        """The start-up model (`CostModel.summary`) and the live one."""
        return {**self.base.summary(), "live": self.snapshot()}
