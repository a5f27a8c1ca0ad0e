"""What a benchmark measures: the scenario, built from the `llmperf` marker's keywords over the session's options
(keywords.py), its fields checked where it is made, and the prompt every benchmark sends (`make_prompt`): cut from
repetitions of a fixed English paragraph.

The embedded models' tokenizer (backends/models.py) has one token per word of it, so a prompt of N
words is N tokens there; servers and other tokenizers receive the same text (their notes say how the
length they counted is checked).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

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


# -- one check per keyword: by type and range, never coerced (int("12") or int(16.9) would run something else)


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


# A fixed English paragraph: prompts are cut from repetitions of it.
PROMPT_TEXT = (
    "University of Washington is a public research university in Seattle . it was founded in 1861 "
    "and is one of the oldest universities on the west coast . the main campus lies on the shores "
    "of lake washington and lake union and has more than five hundred buildings . students come "
    "from every state and from many countries to study medicine engineering law and the arts . "
)


def make_prompt(sequence_length: int) -> str:
    """A prompt of at least `sequence_length` words (tokens for the embedded tokenizer)."""
    words = PROMPT_TEXT.split()
    reps = sequence_length // len(words) + 2
    return " ".join((words * reps)[: sequence_length + 16])
