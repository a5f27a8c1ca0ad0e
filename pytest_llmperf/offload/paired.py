"""Two policies of one offload engine measured side by side: the seed-004 comparison of ours and Fiddler's.

Which policy wins depends on the machine's state at the moment (issue 15: ours lost on one host and won on
another), so comparing two benchmarks measured minutes apart says little. `PairedPolicies` runs both in
the same process, one right after the other, the order alternating run by run, so the machine's state
cancels in their ratio. Each policy keeps its own scheduler, and so its own live cost model, across runs.

A run's sample is policy `a`'s run; its counters add `pair.a_decode_tokens_per_s`,
`pair.b_decode_tokens_per_s` and `pair.ratio` (a / b). The report's "Policy pairs" section turns the runs
into the paired ratio with its 95% interval (judge/stats.py `paired`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..measure.backend import BackendError, GenerationRequest
from ..measure.metrics import run_values
from ..measure.records import RunSample
from .backend import OffloadBackend
from .scheduler import Scheduler
from .seam import OffloadError

#: The knobs a policy of a pair may set (the rest, e.g. threads, apply to both through the marker's knobs).
POLICY_KNOBS = ("latency_cpu", "latency_gpu", "schedule")


class PairedPolicies(OffloadBackend):
    """`PairedPolicies(backend, ("ours", {"schedule": "makespan"}), ("fiddler", {...}))`: see the module docstring."""

    counters_better: Mapping[str, str] = {
        **OffloadBackend.counters_better,
        "pair.ratio": "higher",
        "pair.a_decode_tokens_per_s": "higher",
        "pair.b_decode_tokens_per_s": "higher",
    }

    def __init__(
        self, backend: OffloadBackend, a: tuple[str, Mapping[str, Any]], b: tuple[str, Mapping[str, Any]]
    ) -> None:
        super().__init__(engine=backend.engine, name=backend.name, clock=backend.clock)
        self.counters_better = {**backend.counters_better, **type(self).counters_better}
        self.labels = (a[0], b[0])
        self.schedulers = (self._scheduler(*a), self._scheduler(*b))
        self._runs = 0

    def _scheduler(self, label: str, knobs: Mapping[str, Any]) -> Scheduler:
        unknown = sorted(set(knobs) - set(POLICY_KNOBS))
        if unknown:
            raise BackendError(
                f"policy {label!r} of a pair sets {', '.join(unknown)}; a policy may set "
                f"{', '.join(POLICY_KNOBS)} (other knobs go to the marker, for both)"
            )
        engine, before = self.engine, self.engine.runtime.scheduler
        try:
            engine.set_costs(**{k: knobs.get(k) for k in POLICY_KNOBS})
            return engine.runtime.scheduler
        except OffloadError as exc:
            raise BackendError(f"policy {label!r}: {exc}") from None
        finally:
            engine.runtime.scheduler = before

    def generate(self, request: GenerationRequest) -> RunSample:
        order = (0, 1) if self._runs % 2 == 0 else (1, 0)  # alternate who goes first: no position bias
        self._runs += 1
        before = self.engine.runtime.scheduler
        samples: dict[int, RunSample] = {}
        try:
            for side in order:
                self.engine.runtime.scheduler = self.schedulers[side]
                samples[side] = super().generate(request)
        finally:
            self.engine.runtime.scheduler = before
        a, b = (run_values(samples[side]).get("decode_tokens_per_s", float("nan")) for side in (0, 1))
        sample = samples[0]
        sample.counters.update(
            {
                "pair.a_decode_tokens_per_s": a,
                "pair.b_decode_tokens_per_s": b,
                "pair.ratio": a / b if b > 0 else float("nan"),
            }
        )
        return sample

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "pair": {"a": self.labels[0], "b": self.labels[1]}}
