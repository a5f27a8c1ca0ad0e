"""The `llmperf` marker's keywords, in one table: what each is, whether a test's marker overrides the session's option
of that name with it, and whether `llmperf.measure()` takes it too. The marker's help, the names a marker may set
and the overrides are read from it; each value is checked by type and range, never coerced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .scenario import OUTPUT_MODES, Scenario, ScenarioError


@dataclass(frozen=True)
class Keyword:
    name: str
    shown: str  # how the marker's help shows it
    option: bool = False  # overrides the session's --llmperf-<name> for this test
    measure: bool = True  # llmperf.measure() takes it too (False: about the test, not one measurement)
    note: str = ""  # said after the list in the marker's help


KEYWORDS = (
    Keyword("batch_sizes", "batch_sizes=[1]"),
    Keyword("sequence_length", "sequence_length="),
    Keyword("decode_length", "decode_length="),
    Keyword("runs", "runs=", option=True),
    Keyword("warmups", "warmups=", option=True),
    Keyword("max_runs", "max_runs=", option=True),
    Keyword("alpha", "alpha=", option=True),
    Keyword("rtol", "rtol=float|{metric: float}", option=True),
    Keyword("metrics", "metrics=[...]"),
    Keyword("knobs", "knobs={...}"),
    Keyword("group", "group="),
    Keyword("stop_after_oom", "stop_after_oom="),
    Keyword("max_load", "max_load=", option=True),
    Keyword("devices", "devices=[...]", measure=False, note="`devices` lists the hardware targets it runs on"),
    Keyword("processes", "processes=", measure=False, note="`processes` the worker processes that measure it"),
    Keyword(
        "outputs", "outputs=fail|warn|off", option=True, note="`outputs` what a change of the generated tokens does"
    ),
    Keyword("memory_rtol", "memory_rtol=", option=True, note="`memory_rtol` how much peak memory may grow"),
    Keyword("instructions", "instructions=", measure=False, note="`instructions` whether to count them"),
)
#: Every keyword a marker may give.
MARKER_KEYWORDS = tuple(k.name for k in KEYWORDS)
#: Settings a test's marker may override (the other options are session-wide).
PER_TEST = tuple(k.name for k in KEYWORDS if k.option)
#: llmperf.measure() keywords: the marker's, less those about the whole test.
OVERRIDES = tuple(k.name for k in KEYWORDS if k.measure)
MARKER_HELP = f"llmperf({', '.join(k.shown for k in KEYWORDS)}): an LLM inference benchmark; " + ", ".join(
    k.note for k in KEYWORDS if k.note
)


def check_marker_kwargs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a marker's arguments; raise ScenarioError naming the bad keyword and the valid ones."""
    if args:
        raise ScenarioError("@pytest.mark.llmperf takes keyword arguments only, e.g. llmperf(batch_sizes=[1, 2])")
    unknown = sorted(set(kwargs) - set(MARKER_KEYWORDS))
    if unknown:
        raise ScenarioError(
            f"@pytest.mark.llmperf got unknown keyword(s) {', '.join(unknown)}; known: {', '.join(MARKER_KEYWORDS)}"
        )
    checked = {name: value for name, value in kwargs.items() if value is not None}  # None: as if not given
    for name, value in checked.items():
        check_setting(name, value, where="@pytest.mark.llmperf")
    return checked


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


def build_scenario(settings: Mapping[str, Any]) -> Scenario:
    """A test's Scenario from its settings (llmperf.measure() keywords > marker > the session's options); every value
    is checked by type and range, never coerced, and what is not given is the Scenario's default. Whether its
    schedule can fail is orchestrate/checks.py's."""
    for name, value in settings.items():
        check_setting(name, value)
    given = {f.name for f in fields(Scenario)} & set(settings)
    values = {name: settings[name] for name in given}
    rtol = settings.get("rtol", settings.get("default_rtol"))
    if isinstance(rtol, Mapping):  # a per-metric rtol falls back to the session's rtol for the other metrics
        values["rtol_per_metric"] = {str(k): float(v) for k, v in rtol.items() if k != "default"}
        rtol = rtol.get("default", settings.get("default_rtol"))
    if rtol is not None:
        values["rtol"] = float(rtol)
    if "batch_sizes" in values:
        values["batch_sizes"] = tuple(values["batch_sizes"])
    if values.get("metrics") is not None:
        values["metrics"] = tuple(values["metrics"])
    if "knobs" in values:
        values["knobs"] = dict(values["knobs"])
    for name in ("alpha", "max_load", "memory_rtol"):
        if name in values:
            values[name] = float(values[name])
    if "max_runs" in values or "runs" in values:  # at least the first look's runs
        values["max_runs"] = max(values.get("max_runs", Scenario.max_runs), values.get("runs", Scenario.runs))
    return Scenario(**values)
