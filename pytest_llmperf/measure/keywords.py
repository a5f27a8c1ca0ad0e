"""The `llmperf` marker's keywords, in one table: what each is, whether a test's marker overrides the session's option
of that name with it, and whether `llmperf.measure()` takes it too. The marker's help, the names a marker may set
and the overrides are read from it; each value is checked by type and range, never coerced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .scenario import OUTPUT_MODES, Scenario, ScenarioError


def _is_int(value: Any, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_number(value: Any, finite: bool = True) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    return number and value >= 0 and (math.isfinite(value) or not finite)


def _batch_sizes(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(_is_int(b) for b in v) and len(set(v)) == len(v)


def _rtol(v: Any) -> bool:
    return all(isinstance(k, str) and _is_number(x) for k, x in v.items()) if isinstance(v, Mapping) else _is_number(v)


def _knobs(v: Any) -> bool:
    return isinstance(v, Mapping) and all(isinstance(k, str) for k in v)


def _devices(v: Any) -> bool:
    return (isinstance(v, str) and v != "") or (
        isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(d, str) and d for d in v)
    )


@dataclass(frozen=True)
class Keyword:
    name: str
    shown: str  # how the marker's help shows it
    check: Callable[[Any], bool]  # whether a value has the keyword's type and range
    expected: str  # what the error says is expected
    option: bool = False  # overrides the session's --llmperf-<name> (or ini llmperf_<name>) for this test
    measure: bool = True  # llmperf.measure() takes it too (False: about the test, not one measurement)
    note: str = ""  # said after the list in the marker's help


AT_LEAST_1 = "an integer >= 1"
# fmt: off
KEYWORDS = (
    Keyword("batch_sizes", "batch_sizes=[1]", _batch_sizes, "a list of distinct integers >= 1, e.g. [1, 2, 4]"),
    Keyword("sequence_length", "sequence_length=", _is_int, AT_LEAST_1),
    Keyword("decode_length", "decode_length=", _is_int, AT_LEAST_1),
    Keyword("runs", "runs=", _is_int, AT_LEAST_1, option=True),
    Keyword("warmups", "warmups=", lambda v: _is_int(v, 0), "an integer >= 0", option=True),
    Keyword("max_runs", "max_runs=", _is_int, AT_LEAST_1, option=True),
    Keyword("alpha", "alpha=", lambda v: _is_number(v) and 0 < v < 1, "a number in (0, 1)", option=True),
    Keyword("rtol", "rtol=float|{metric: float}", _rtol, "a finite number >= 0 (or a {metric: number} mapping)",
            option=True),
    Keyword("metrics", "metrics=[...]", lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(
        isinstance(m, str) for m in v), "a non-empty list of metric names, e.g. ['prefill_ms', 'decode_token_ms']"),
    Keyword("knobs", "knobs={...}", _knobs, "a mapping of knob names to values, e.g. {'threads': 1}"),
    Keyword("group", "group=", lambda v: v is None or isinstance(v, str), "a string"),
    Keyword("stop_after_oom", "stop_after_oom=", lambda v: isinstance(v, bool), "True or False"),
    Keyword("max_load", "max_load=", lambda v: _is_number(v, finite=False),
            "a number of cores >= 0 (float('inf'): no limit)", option=True),
    Keyword("devices", "devices=[...]", _devices, "a device name or a list of them, e.g. ['cpu', 'a100']",
            measure=False, note="`devices` lists the hardware targets it runs on"),
    Keyword("processes", "processes=", lambda v: True, "", measure=False,
            note="`processes` the worker processes that measure it"),
    Keyword("outputs", "outputs=fail|warn|off", lambda v: v in OUTPUT_MODES,
            f"one of {', '.join(map(repr, OUTPUT_MODES))}", option=True,
            note="`outputs` what a change of the generated tokens does"),
    Keyword("memory_rtol", "memory_rtol=", _is_number, "a finite number >= 0", option=True,
            note="`memory_rtol` how much peak memory may grow"),
    Keyword("instructions", "instructions=", lambda v: isinstance(v, bool), "True or False", measure=False,
            note="`instructions` whether to count them"),
)
# fmt: on
#: Every keyword a marker may give.
MARKER_KEYWORDS = tuple(k.name for k in KEYWORDS)
#: Settings a test's marker may override (the other options are session-wide).
PER_TEST = tuple(k.name for k in KEYWORDS if k.option)
#: llmperf.measure() keywords: the marker's, less those about the whole test.
OVERRIDES = tuple(k.name for k in KEYWORDS if k.measure)
MARKER_HELP = f"llmperf({', '.join(k.shown for k in KEYWORDS)}): an LLM inference benchmark; " + ", ".join(
    k.note for k in KEYWORDS if k.note
)
#: The checks by name; the session's fallbacks of a marker's alpha and rtol are checked as they are.
CHECKS = {k.name: k for k in KEYWORDS} | {"default_alpha": KEYWORDS[6], "default_rtol": KEYWORDS[7]}


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


def check_setting(name: str, value: Any, *, where: str = "llmperf setting") -> None:
    """Raise ScenarioError naming `name` unless `value` has the keyword's type and range."""
    keyword = CHECKS.get(name)
    if keyword is not None and not keyword.check(value):
        expected = keyword.expected
        if keyword.name == "rtol" and isinstance(value, Mapping):
            expected = "a number >= 0 per metric name, e.g. {'prefill_ms': 0.1, 'default': 0.05}"
        elif keyword.name == "rtol" and value == "auto":
            expected += "; auto is --llmperf-rtol's: leave rtol out to use the session's"
        raise ScenarioError(f"{where}: {name}={value!r} is not valid: expected {expected}")
    if name == "knobs" and "threads" in value and not _is_int(value["threads"]):
        raise ScenarioError(f"{where}: knobs['threads']={value['threads']!r} is not valid: expected {AT_LEAST_1}")


def build_scenario(settings: Mapping[str, Any]) -> Scenario:
    """A test's Scenario from its settings (llmperf.measure() keywords > marker > the session's options); every value
    is checked by type and range, never coerced, and what is not given is the Scenario's default. Whether its
    schedule can fail is orchestrate/items.py's (a test's) and orchestrate/controller.py's (a job's)."""
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
