"""Parsers of option values: each turns what the CLI, an ini key or the environment gave into a value, or raises
ValueError with what was expected (orchestrate/options.py names the option in front of it)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from ..environments.records import COMPARE_DEPS_MODES
from ..judge.baseline_layout import check_name
from ..measure.allocator import MODES
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
    if isinstance(text, (bool, float)):
        raise ValueError(f"expected an integer >= {minimum}, got {text!r}")
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"expected an integer >= {minimum}, got {text!r}")
    return value


def positive_int(text: str | int) -> int:
    return integer(text, 1)


def non_negative_int(text: str | int) -> int:
    return integer(text, 0)


def number(text: str | float, expected: str, *, allow_inf: bool = False) -> float:
    """A finite number (NaN never: every comparison with it is false, so a NaN tolerance passes anything)."""
    if isinstance(text, bool):
        raise ValueError(f"expected {expected}, got {text!r}")
    try:
        value = float(str(text).strip()) if isinstance(text, str) else float(text)
    except ValueError:
        raise ValueError(f"expected {expected}, got {text!r}") from None
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"expected {expected}, got {text!r}")
    return value


def probability(text: str | float) -> float:
    value = number(text, "a number in (0, 1)")
    if not 0 < value < 1:
        raise ValueError(f"expected a number in (0, 1), got {text!r}")
    return value


def non_negative_float(text: str | float) -> float:
    value = number(text, "a number >= 0")
    if value < 0:
        raise ValueError(f"expected a number >= 0, got {text!r}")
    return value


def load_limit(text: str | float) -> float:
    """Cores other processes may use; `inf` switches the check off (a backend test on a shared machine)."""
    value = number(text, "a number of cores >= 0, or inf", allow_inf=True)
    if value < 0:
        raise ValueError(f"expected a number of cores >= 0, or inf, got {text!r}")
    return value


def positive_float(text: str | float) -> float:
    value = number(text, "a number > 0")
    if not value > 0:
        raise ValueError(f"expected a number > 0, got {text!r}")
    return value


def threads(text: str | int) -> str | int:
    """`auto` (1 on the cpu target, torch's own default on a GPU target) or a thread count >= 1."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    try:
        return integer(text, 1)
    except ValueError:
        raise ValueError(f"expected auto or an integer >= 1, got {text!r}") from None


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


def plain_name(text: str) -> str:
    """A device or machine name: it becomes a directory name, so never a path or '..'."""
    return check_name(str(text).strip())


def malloc_mode(text: str) -> str:
    value = str(text).strip().lower()
    if value not in MODES:
        raise ValueError(f"expected one of {', '.join(MODES)}, got {text!r}")
    return value


#: How the two sides of an A/B comparison alternate (orchestrate/turns.py).
INTERLEAVE_MODES = ("run", "batch", "process")


def interleave_mode(text: str) -> str:
    value = str(text).strip().lower()
    if value not in INTERLEAVE_MODES:
        raise ValueError(f"expected one of {', '.join(INTERLEAVE_MODES)}, got {text!r}")
    return value


#: How a worker process starts (orchestrate/forkserver.py): forked from a server that imported the heavy libraries
#: once, or a fresh interpreter each. The server needs Linux (PR_SET_PDEATHSIG, descriptors over a socket).
WORKER_STARTS = ("fork", "exec")


def worker_start(text: str) -> str:
    value = str(text).strip().lower()
    if value not in WORKER_STARTS:
        raise ValueError(f"expected one of {', '.join(WORKER_STARTS)}, got {text!r}")
    return value


def outputs_mode(text: str) -> str:
    value = str(text).strip().lower()
    if value not in OUTPUT_MODES:
        raise ValueError(f"expected one of {', '.join(OUTPUT_MODES)}, got {text!r}")
    return value


def rtol(text: str | float) -> float | str:
    """`auto` (the measured default for the mode and target class) or a number >= 0."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    return non_negative_float(text)


def export_formats(text: str | Sequence[str]) -> tuple[str, ...]:
    from ..report.dashboards import FORMATS  # given only where a dashboard is fed: imported then

    return comma_list(text, FORMATS)


def budget(text: str | float) -> float | str:
    """`auto` (decided from the job's first look) or a number of seconds > 0."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    return positive_float(text)


def auto_or_positive_int(text: str | int) -> int | str:
    """`auto` (decided by the session for its mode and target) or an integer >= 1."""
    if str(text).strip().lower() == "auto":
        return "auto"
    return positive_int(text)


def model_map(items: list[str] | str) -> dict[str, str]:
    """`NAME=PATH` pairs (CLI repeated, ini one per line, env comma separated)."""
    if isinstance(items, str):
        items = [p for chunk in items.split(",") for p in chunk.split()]
    mapping: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"expected NAME=PATH, got {item!r}")
        mapping[name.strip()] = path.strip()
    return mapping


def compare_deps(text: str) -> str:
    """How the sides' environments are made in an A/B comparison (pytest_llmperf/environments/plan.py)."""
    value = str(text).strip().lower()
    if value not in COMPARE_DEPS_MODES:
        raise ValueError(f"expected one of {', '.join(COMPARE_DEPS_MODES)}, got {text!r}")
    return value


def path_list(items: list[str] | tuple[str, ...] | str) -> tuple[str, ...]:
    """Paths or globs relative to the rootdir: CLI repeated, ini one per line, an environment variable comma or
    whitespace separated."""
    if isinstance(items, str):
        items = [p for chunk in items.split(",") for p in chunk.split()]
    paths = tuple(str(item).strip() for item in items if str(item).strip())
    for path in paths:  # an absolute path would name one file for both sides: never a difference
        if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
            raise ValueError(f"expected paths or globs relative to the rootdir, got {path!r}")
    return paths


def name_list(items: list[str] | tuple[str, ...] | str) -> tuple[str, ...]:
    """Names (extras, dependency groups): CLI repeated, ini one per line, an environment variable comma or
    whitespace separated."""
    if isinstance(items, str):
        items = [p for chunk in items.split(",") for p in chunk.split()]
    names = tuple(str(item).strip() for item in items if str(item).strip())
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"expected names of extras or dependency groups (letters, digits, . _ -), got {name!r}")
    return names
