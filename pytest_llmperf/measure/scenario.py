"""What a benchmark measures: the scenario, built from the `llmperf` marker, the options and defaults.

The marker's keywords are the scenario's fields (plus `devices`); unknown keywords are rejected at
collection with the list of known ones, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import inspect
import math
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
    outputs: str | None = None,
    memory_rtol: float | None = None,
    instructions: bool | None = None,
) -> dict[str, Any]:
    """The signature of `@pytest.mark.llmperf(...)`; calling it validates the keywords."""
    return {k: v for k, v in locals().items() if v is not None}


MARKER_KEYWORDS = tuple(inspect.signature(llmperf_marker).parameters)
MARKER_HELP = (
    "llmperf(batch_sizes=[1], sequence_length=, decode_length=, runs=, warmups=, max_runs=, alpha=, "
    "rtol=float|{metric: float}, metrics=[...], knobs={...}, group=, stop_after_oom=, max_load=, devices=[...], "
    "processes=, outputs=fail|warn|off, memory_rtol=, instructions=): an LLM inference benchmark; `devices` lists the "
    "hardware targets it runs on, `processes` the worker processes that measure it, `outputs` what a change of the "
    "generated tokens does, `memory_rtol` how much peak memory may grow, `instructions` whether to count them"
)


#: What generated tokens that differ from the baseline's do (judge/outputs.py); named here, where scenarios
#: are checked, so that the measuring side needs nothing from the judging side.
OUTPUT_MODES = ("fail", "warn", "off")


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
    outputs: str = "fail"  # generated tokens that differ from the baseline's: fail | warn | off (judge/outputs.py)
    memory_rtol: float = 0.1  # peak memory may grow this much (and MEMORY_FLOOR_MIB) before it regressed

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(
            not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in self.batch_sizes
        ):
            raise ScenarioError(f"batch_sizes must be positive integers, got {list(self.batch_sizes)}")
        if self.sequence_length < 1:
            raise ScenarioError(f"sequence_length must be >= 1, got {self.sequence_length}")
        if self.decode_length < 1:
            raise ScenarioError(f"decode_length must be >= 1, got {self.decode_length}")
        if self.runs < 1 or self.warmups < 0:
            raise ScenarioError(f"runs must be >= 1 and warmups >= 0, got runs={self.runs} warmups={self.warmups}")
        if not 0 < self.alpha < 1:
            raise ScenarioError(f"alpha must lie in (0, 1), got {self.alpha}")
        if not (self.rtol >= 0 and math.isfinite(self.rtol)) or any(
            not (v >= 0 and math.isfinite(v)) for v in self.rtol_per_metric.values()
        ):
            raise ScenarioError("rtol must be a finite number >= 0 (a NaN tolerance would pass any slowdown)")
        if not self.max_load >= 0:
            raise ScenarioError(f"max_load must be >= 0 cores (inf: no limit), got {self.max_load}")
        if not (self.memory_rtol >= 0 and math.isfinite(self.memory_rtol)):
            raise ScenarioError(f"memory_rtol must be a finite number >= 0, got {self.memory_rtol}")
        if self.outputs not in OUTPUT_MODES:
            raise ScenarioError(f"outputs must be one of {', '.join(OUTPUT_MODES)}, got {self.outputs!r}")

    def rtol_for(self, metric: str) -> float:
        return self.rtol_per_metric.get(metric, self.rtol)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scenario:
        known = {f.name for f in fields(cls)}
        # strict JSON writes an infinite max_load (--llmperf-max-load=inf) as null: no limit
        values = {k: v for k, v in data.items() if k in known and not (k == "max_load" and v is None)}
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
            f"@pytest.mark.llmperf got unknown keyword(s) {', '.join(unknown)}; known: {', '.join(MARKER_KEYWORDS)}"
        )
    checked = llmperf_marker(**kwargs)
    for name, value in checked.items():
        check_setting(name, value, where="@pytest.mark.llmperf")
    return checked


# -- one check per keyword: by type and range, never coerced (int("12") or int(16.9) would run something else)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _expect(ok: bool, name: str, value: Any, expected: str, where: str) -> None:
    if not ok:
        raise ScenarioError(f"{where}: {name}={value!r} is not valid: expected {expected}")


def check_setting(name: str, value: Any, *, where: str = "llmperf setting") -> None:
    """Raise ScenarioError naming `name` unless `value` has the keyword's type and range."""
    if name == "batch_sizes":
        _expect(
            isinstance(value, (list, tuple))
            and len(value) > 0
            and all(_is_int(b) and b >= 1 for b in value)
            and len(set(value)) == len(value),
            name,
            value,
            "a list of distinct integers >= 1, e.g. [1, 2, 4]",
            where,
        )
    elif name in ("sequence_length", "decode_length", "runs", "max_runs"):
        _expect(_is_int(value) and value >= 1, name, value, "an integer >= 1", where)
    elif name == "warmups":
        _expect(_is_int(value) and value >= 0, name, value, "an integer >= 0", where)
    elif name in ("alpha", "default_alpha"):
        _expect(_is_number(value) and 0 < value < 1, name, value, "a number in (0, 1)", where)
    elif name in ("rtol", "default_rtol"):
        finite = lambda v: _is_number(v) and math.isfinite(v) and v >= 0  # noqa: E731
        if isinstance(value, Mapping):
            _expect(
                all(isinstance(k, str) and finite(v) for k, v in value.items()),
                name,
                value,
                "a number >= 0 per metric name, e.g. {'prefill_ms': 0.1, 'default': 0.05}",
                where,
            )
        else:
            _expect(
                finite(value),
                name,
                value,
                "a finite number >= 0 (or a {metric: number} mapping)"
                + ("; auto is --llmperf-rtol's: leave rtol out to use the session's" if value == "auto" else ""),
                where,
            )
    elif name == "metrics":
        _expect(
            isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(m, str) for m in value),
            name,
            value,
            "a non-empty list of metric names, e.g. ['prefill_ms', 'decode_token_ms']",
            where,
        )
    elif name == "knobs":
        _expect(
            isinstance(value, Mapping) and all(isinstance(k, str) for k in value),
            name,
            value,
            "a mapping of knob names to values, e.g. {'threads': 1}",
            where,
        )
        if isinstance(value, Mapping) and "threads" in value:
            _expect(
                _is_int(value["threads"]) and value["threads"] >= 1,
                "knobs['threads']",
                value["threads"],
                "an integer >= 1",
                where,
            )
    elif name == "group":
        _expect(value is None or isinstance(value, str), name, value, "a string", where)
    elif name in ("stop_after_oom", "instructions"):
        _expect(isinstance(value, bool), name, value, "True or False", where)
    elif name == "max_load":
        _expect(_is_number(value) and value >= 0, name, value, "a number of cores >= 0 (float('inf'): no limit)", where)
    elif name == "memory_rtol":
        _expect(_is_number(value) and math.isfinite(value) and value >= 0, name, value, "a finite number >= 0", where)
    elif name == "outputs":
        _expect(value in OUTPUT_MODES, name, value, f"one of {', '.join(map(repr, OUTPUT_MODES))}", where)
    elif name == "devices":
        _expect(
            (isinstance(value, str) and value != "")
            or (isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(d, str) and d for d in value)),
            name,
            value,
            "a device name or a list of them, e.g. ['cpu', 'a100']",
            where,
        )


def check_metrics(metrics: Sequence[str] | None, known: Sequence[str], backend_kind: str) -> None:
    """A metric name that no backend measures gates nothing: reject it with the names that exist."""
    unknown = [m for m in metrics or () if m not in known]
    if unknown:
        raise ScenarioError(
            f"metrics: unknown metric(s) {', '.join(unknown)} for the {backend_kind} backend "
            f"(a typo would gate nothing); known: {', '.join(known)}"
        )


def check_rtol_metrics(
    per_metric: Mapping[str, float], known: Sequence[str], gated: Sequence[str], backend_kind: str
) -> None:
    """A tolerance for a metric that is not gated changes nothing: refuse it (a typo, or a metric that is not in
    metrics=[...]), naming what is gated."""
    names = [m for m in per_metric if m != "default"]
    unknown = [m for m in names if m not in known]
    if unknown:
        raise ScenarioError(
            f"rtol: unknown metric(s) {', '.join(unknown)} for the {backend_kind} backend (a typo "
            f"would leave the default tolerance in place); known: {', '.join(known)}"
        )
    ungated = [m for m in names if m not in gated]
    if ungated:
        raise ScenarioError(
            f"rtol names {', '.join(ungated)}, which this test does not gate (it gates "
            f"{', '.join(gated)}; peak memory is held to memory_rtol): add it to metrics=[...] or "
            "drop it from rtol"
        )


def build_scenario(settings: Mapping[str, Any]) -> Scenario:
    """Make a Scenario from resolved settings (marker > overrides > CLI > env > ini > default); every value is
    checked by type and range, never coerced. Whether its schedule can fail is orchestrate/checks.py's."""
    for name, value in settings.items():
        check_setting(name, value)
    rtol = settings.get("rtol", 0.05)
    per_metric: dict[str, float] = {}
    if isinstance(rtol, Mapping):
        per_metric = {str(k): float(v) for k, v in rtol.items() if k != "default"}
        rtol = rtol.get("default", settings.get("default_rtol", 0.05))
    metrics = settings.get("metrics")
    runs = settings.get("runs", 10)
    max_runs = max(settings.get("max_runs", 30), runs)
    alpha = float(settings.get("alpha", 0.01))
    return Scenario(
        batch_sizes=tuple(settings.get("batch_sizes", (1,))),
        sequence_length=settings.get("sequence_length", 128),
        decode_length=settings.get("decode_length", 8),
        runs=runs,
        warmups=settings.get("warmups", 1),
        max_runs=max_runs,
        alpha=alpha,
        rtol=float(rtol),
        rtol_per_metric=per_metric,
        metrics=tuple(metrics) if metrics is not None else None,
        knobs=dict(settings.get("knobs", {})),
        group=settings.get("group"),
        stop_after_oom=settings.get("stop_after_oom", True),
        max_load=float(settings.get("max_load", float("inf"))),
        outputs=settings.get("outputs", "fail"),
        memory_rtol=float(settings.get("memory_rtol", 0.1)),
    )
