"""Parsers of option values: each turns what the command line or an ini key gave into a value, or raises
ValueError with what was expected (orchestrate/options.py names the option in front of it)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..environments.records import COMPARE_DEPS_MODES
from ..judge.baseline_layout import check_name
from ..measure.memory import MODES
from ..measure.scenario import OUTPUT_MODES

#: Outcomes `--llmperf-fail-on` may list: a benchmark's kind (judge/verdicts.py), or `unjudged`, a session that
#: selected benchmarks and judged none of them (all refused, new, ungated, or skipped on this device).
FAIL_ON_CHOICES = ("regressed", "missing", "inconclusive", "refused", "unjudged")
DEFAULT_FAIL_ON = ("regressed", "missing", "inconclusive", "unjudged")


def boolean(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def integer(text: str | int, minimum: int) -> int:
    try:
        value = minimum - 1 if isinstance(text, (bool, float)) else int(str(text).strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"expected an integer >= {minimum}, got {text!r}")
    return value


def positive_int(text: str | int) -> int:
    return integer(text, 1)


def non_negative_int(text: str | int) -> int:
    return integer(text, 0)


def number(text: str | float, expected: str, ok: Callable[[float], bool], *, allow_inf: bool = False) -> float:
    """A finite number that `ok` accepts (NaN never: every comparison with it is false, so a NaN tolerance passes
    anything)."""
    try:
        value = math.nan if isinstance(text, bool) else float(str(text).strip() if isinstance(text, str) else text)
    except ValueError:
        value = math.nan
    if math.isnan(value) or (math.isinf(value) and not allow_inf) or not ok(value):
        raise ValueError(f"expected {expected}, got {text!r}")
    return value


def probability(text: str | float) -> float:
    return number(text, "a number in (0, 1)", lambda v: 0 < v < 1)


def non_negative_float(text: str | float) -> float:
    return number(text, "a number >= 0", lambda v: v >= 0)


def load_limit(text: str | float) -> float:
    """Cores other processes may use; `inf` switches the check off (a backend test on a shared machine)."""
    return number(text, "a number of cores >= 0, or inf", lambda v: v >= 0, allow_inf=True)


def positive_float(text: str | float) -> float:
    return number(text, "a number > 0", lambda v: v > 0)


def auto_or(parse: Callable[[Any], Any], expected: str | None = None) -> Callable[[Any], Any]:
    """`auto` (decided by the session for its mode and target) or what `parse` accepts."""

    def parsed(text: Any) -> Any:
        if str(text).strip().lower() == "auto":
            return "auto"
        try:
            return parse(text)
        except ValueError:
            if expected is None:
                raise
            raise ValueError(f"expected {expected}, got {text!r}") from None

    return parsed


#: auto: 1 on the cpu target, torch's own default on a GPU target.
threads = auto_or(positive_int, "auto or an integer >= 1")
#: auto: the measured default for the mode and target class.
rtol = auto_or(non_negative_float)
#: auto: decided from the job's first look.
budget = auto_or(positive_float)
auto_or_positive_int = auto_or(positive_int)


def comma_list(text: str | Sequence[str], choices: Sequence[str]) -> tuple[str, ...]:
    """A comma list out of `choices` (in their order), or `none`."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names = [str(i).strip().lower() for i in items if str(i).strip()]
    if names == ["none"]:
        return ()
    unknown = [n for n in names if n not in choices]
    if unknown or not names:
        raise ValueError(f"expected a comma list out of {', '.join(choices)} (or none), got {text!r}")
    return tuple(n for n in choices if n in names)


def fail_on(text: str | Sequence[str]) -> tuple[str, ...]:
    return comma_list(text, FAIL_ON_CHOICES)


def url(text: str) -> str:
    value = str(text).strip().rstrip("/")
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"expected an http:// or https:// URL, got {text!r}")
    return value


def as_string(text: str) -> str:
    return str(text)


def git_ref(text: str) -> str:
    """A git ref to compare against. Empty is refused, never read as "no comparison": an unset variable in CI
    (`--llmperf-compare=$BASE_REF`) would gate against stored baselines, or against none, in silence."""
    value = str(text).strip()
    if not value:
        raise ValueError(
            "expected a git ref (e.g. origin/main, HEAD), got an empty value: an unset variable? Give the ref, or "
            "leave it out to gate against the stored baselines"
        )
    if value.endswith("/"):
        raise ValueError(f"expected a git ref (e.g. origin/main), got {text!r}: an unset variable after the '/'?")
    return value


def one_of(choices: Sequence[str]) -> Callable[[str], str]:
    """A parser of one word out of `choices`, any case."""

    def parse(text: str) -> str:
        value = str(text).strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


def plain_name(text: str) -> str:
    """A device or machine name: it becomes a directory name, so never a path or '..'."""
    return check_name(str(text).strip())


#: How the two sides of an A/B comparison alternate (orchestrate/turns.py).
INTERLEAVE_MODES = ("run", "batch", "process")


#: How a worker process starts (orchestrate/forkserver.py): forked from a server that imported the heavy libraries
#: once, or a fresh interpreter each. The server needs Linux (PR_SET_PDEATHSIG, descriptors over a socket).
WORKER_STARTS = ("fork", "exec")


def export_formats(text: str | Sequence[str]) -> tuple[str, ...]:
    from ..report.exports import FORMATS  # given only where a dashboard is fed: imported then

    return comma_list(text, FORMATS)


def words(items: Sequence[str] | str) -> list[str]:
    """The items of a list option: given one by one (ini one per line), or in one text comma or space separated."""
    return [w for w in (re.split(r"[,\s]+", items) if isinstance(items, str) else map(str.strip, items)) if w]


def model_map(items: Sequence[str] | str) -> dict[str, str]:
    """`NAME=PATH` pairs."""
    mapping: dict[str, str] = {}
    for item in words(items):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"expected NAME=PATH, got {item!r}")
        mapping[name.strip()] = path.strip()
    return mapping


def path_list(items: Sequence[str] | str) -> tuple[str, ...]:
    """Paths or globs relative to the rootdir; `-o llmperf_compare_deps_paths=a,b` gives two."""
    paths = tuple(p.strip() for item in words(items) for p in item.split(",") if p.strip())
    for path in paths:  # an absolute path would name one file for both sides: never a difference
        if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
            raise ValueError(f"expected paths or globs relative to the rootdir, got {path!r}")
    return paths


def name_list(items: Sequence[str] | str) -> tuple[str, ...]:
    """Names (extras, dependency groups); `-o llmperf_env_extras=a,b` gives two."""
    names = tuple(n.strip() for item in words(items) for n in item.split(",") if n.strip())
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"expected names of extras or dependency groups (letters, digits, . _ -), got {name!r}")
    return names


malloc_mode = one_of(MODES)
interleave_mode = one_of(INTERLEAVE_MODES)
worker_start = one_of(WORKER_STARTS)
outputs_mode = one_of(OUTPUT_MODES)
#: How the sides' environments are made in an A/B comparison (pytest_llmperf/environments/plan.py).
compare_deps = one_of(COMPARE_DEPS_MODES)
