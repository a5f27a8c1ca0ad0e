"""What a benchmark measures: the scenario, built from the `llmperf` marker, the options and defaults.

The marker's keywords are the scenario's fields (plus `devices`); unknown keywords are rejected at
collection with the list of known ones, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any


def llmperf_marker(
    *,
    batch_sizes: Sequence[int] | None = None,
    sequence_length: int | None = None,
    decode_length: int | None = None,
    runs: int | None = None,
    warmups: int | None = None,
    max_runs: int | None = None,
    alpha: float | None = None,
    rtol: float | Mapping[str, float] | None = None,
    metrics: Sequence[str] | None = None,
    knobs: Mapping[str, Any] | None = None,
    group: str | None = None,
    stop_after_oom: bool | None = None,
    max_load: float | None = None,
    devices: Sequence[str] | None = None,
    processes: int | None = None,
) -> dict[str, Any]:
    """The signature of `@pytest.mark.llmperf(...)`; calling it validates the keywords."""
    return {k: v for k, v in locals().items() if v is not None}


MARKER_KEYWORDS = tuple(inspect.signature(llmperf_marker).parameters)
MARKER_HELP = (
    "llmperf(batch_sizes=[1], sequence_length=, decode_length=, runs=, warmups=, max_runs=, alpha=, "
    "rtol=float|{metric: float}, metrics=[...], knobs={...}, group=, stop_after_oom=, max_load=, devices=[...], "
    "processes=): an LLM inference benchmark; `devices` lists the hardware targets it runs on, `processes` the "
    "worker processes that measure it"
)


class ScenarioError(ValueError):
    """A marker or override that does not describe a valid scenario."""


@dataclass(frozen=True)
class Scenario:
    batch_sizes: tuple[int, ...] = (1,)
    sequence_length: int = 128
    decode_length: int = 8
    runs: int = 10
    warmups: int = 1
    max_runs: int = 30
    alpha: float = 0.01
    rtol: float = 0.05
    rtol_per_metric: Mapping[str, float] = field(default_factory=dict)
    metrics: tuple[str, ...] | None = None  # gated metrics; None = the default set for the backend
    knobs: Mapping[str, Any] = field(default_factory=dict)
    group: str | None = None
    stop_after_oom: bool = True
    max_load: float = float("inf")  # cores other processes may use during a run before it is retaken

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(not isinstance(b, int) or b < 1 for b in self.batch_sizes):
            raise ScenarioError(f"batch_sizes must be positive integers, got {list(self.batch_sizes)}")
        if self.sequence_length < 1:
            raise ScenarioError(f"sequence_length must be >= 1, got {self.sequence_length}")
        if self.decode_length < 1:
            raise ScenarioError(f"decode_length must be >= 1, got {self.decode_length}")
        if self.runs < 1 or self.warmups < 0:
            raise ScenarioError(f"runs must be >= 1 and warmups >= 0, got runs={self.runs} warmups={self.warmups}")
        if not 0 < self.alpha < 1:
            raise ScenarioError(f"alpha must lie in (0, 1), got {self.alpha}")
        if self.rtol < 0 or any(v < 0 for v in self.rtol_per_metric.values()):
            raise ScenarioError("rtol must be >= 0")

    def rtol_for(self, metric: str) -> float:
        return self.rtol_per_metric.get(metric, self.rtol)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scenario:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["batch_sizes"] = tuple(values.get("batch_sizes", (1,)))
        values["metrics"] = tuple(values["metrics"]) if values.get("metrics") is not None else None
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["batch_sizes"] = list(self.batch_sizes)
        data["metrics"] = list(self.metrics) if self.metrics is not None else None
        data["knobs"] = dict(self.knobs)
        data["rtol_per_metric"] = dict(self.rtol_per_metric)
        return data


def check_marker_kwargs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a marker's arguments; raise ScenarioError naming the bad keyword and the valid ones."""
    if args:
        raise ScenarioError("@pytest.mark.llmperf takes keyword arguments only, e.g. llmperf(batch_sizes=[1, 2])")
    unknown = sorted(set(kwargs) - set(MARKER_KEYWORDS))
    if unknown:
        raise ScenarioError(
            f"@pytest.mark.llmperf got unknown keyword(s) {', '.join(unknown)}; "
            f"known: {', '.join(MARKER_KEYWORDS)}"
        )
    return llmperf_marker(**kwargs)


def build_scenario(settings: Mapping[str, Any]) -> Scenario:
    """Make a Scenario from resolved settings (marker > overrides > CLI > env > ini > default)."""
    rtol = settings.get("rtol", 0.05)
    per_metric: dict[str, float] = {}
    if isinstance(rtol, Mapping):
        per_metric = {str(k): float(v) for k, v in rtol.items() if k != "default"}
        rtol = rtol.get("default", settings.get("default_rtol", 0.05))
    metrics = settings.get("metrics")
    try:
        return Scenario(
            batch_sizes=tuple(int(b) for b in settings.get("batch_sizes", (1,))),
            sequence_length=int(settings.get("sequence_length", 128)),
            decode_length=int(settings.get("decode_length", 8)),
            runs=int(settings.get("runs", 10)),
            warmups=int(settings.get("warmups", 1)),
            max_runs=max(int(settings.get("max_runs", 30)), int(settings.get("runs", 10))),
            alpha=float(settings.get("alpha", 0.01)),
            rtol=float(rtol),
            rtol_per_metric=per_metric,
            metrics=tuple(metrics) if metrics is not None else None,
            knobs=dict(settings.get("knobs", {})),
            group=settings.get("group"),
            stop_after_oom=bool(settings.get("stop_after_oom", True)),
            max_load=float(settings.get("max_load", float("inf"))),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ScenarioError):
            raise
        raise ScenarioError(f"invalid llmperf scenario setting: {exc}") from exc
