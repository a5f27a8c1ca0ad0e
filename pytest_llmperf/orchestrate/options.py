"""Every option, described once, and a test's `llmperf` keywords: how the session and each test are set up.

The Settings dataclass is the table, one field per option, each declared with `option(...)`: its ini key
`llmperf_X`, for what a user changes per run also a flag `--llmperf-X` (an expert knob is an ini key only), its
parser (below: each turns what the command line or an ini key gave into a value, or raises ValueError with what was
expected, the option named in front of it) and default. docs/options.md is generated from this table
(scripts/reference_docs.py) and says each one's reasons.

Precedence: marker > command line (`PYTEST_ADDOPTS` and `-o` too) > environment (`LLMPERF_HISTORY` only) > ini >
default. `Settings.from_config` resolves them for the session; a test's marker comes on top in `Settings.for_test`
(measure/keywords.py says which keywords a marker may set).

A test's markers (`marker_kwargs`): a module's `pytestmark`, a class's marker, the function's own and a parametrize
case's `marks=` may each give keywords; the nearest one wins per keyword (parameter case > function > class >
module), so a module can set what its tests share and a test what is its own. Two markers at the same level that
give one keyword two values (stacked decorators) are an error naming both: which one was meant cannot be told.

Re-run commands printed in messages (`rerun_command`) repeat the options the user gave on the command line, so
following a hint (e.g. an update) never lands in the same refusal for want of --llmperf-baseline-dir.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import pytest

from ..environments.records import COMPARE_DEPS_MODES
from ..history import settings as history_values
from ..judge.baseline_layout import check_name
from ..measure.keywords import PER_TEST, check_marker_kwargs
from ..measure.memory import MODES
from ..measure.scenario import OUTPUT_MODES, ScenarioError
from .protocol import worker_settings

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


#: The key of a Settings field's metadata that holds its Option.
OPTION = "llmperf_option"


@dataclass(frozen=True)
class Option:
    name: str  # e.g. "runs" -> --llmperf-runs, llmperf_runs
    help: str  # one line; the reasoning is in docs/
    parse: Callable[[Any], Any]
    default: Any = None
    metavar: str | None = None
    expert: bool = False  # an ini key only (-o llmperf_X=... for one run), no command-line flag
    ini_type: str = "string"
    flag: bool = False  # a CLI switch (store_true)
    repeatable: bool = False  # a CLI option given several times
    env: str | None = None  # the one environment variable, for a value a command line must not show (a password)
    empty_given: bool = False  # an empty ini value is a value to parse, not "unset"

    @property
    def cli(self) -> str:
        return "--llmperf-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return "llmperf_" + self.name

    def add_to(self, parser: pytest.Parser, group: pytest.OptionGroup) -> None:
        if not self.expert:
            action = "store_true" if self.flag else "append" if self.repeatable else "store"
            kwargs = {} if self.flag else {"metavar": self.metavar}
            group.addoption(self.cli, action=action, default=None, dest=self.ini, help=self.help, **kwargs)
        parser.addini(self.ini, help=self.help, type=self.ini_type, default=None)  # type: ignore[arg-type]

    def value(self, config: pytest.Config) -> Any:
        """Command line > environment > ini > default; a bad value is a UsageError naming where it came from."""
        for _, label, raw in self._sources(config):
            try:
                return self.parse(raw)
            except (TypeError, ValueError) as exc:
                raise pytest.UsageError(f"llmperf: bad value for {label}: {exc}") from None
        return self.default

    def source(self, config: pytest.Config) -> str | None:
        """Where the value comes from: 'cli' (a flag or -o), 'env', 'ini', or None for the default."""
        found = self._sources(config)
        return found[0][0] if found else None

    def _sources(self, config: pytest.Config) -> list[tuple[str, str, Any]]:
        found: list[tuple[str, str, Any]] = []
        cli = config.getoption(self.ini, default=None) if not self.expert else None
        if cli is not None:
            found.append(("cli", self.cli, cli))
        # `-o llmperf_X=...` is the command line's (a path resolves against the invocation directory), after a flag
        overridden = any(o.partition("=")[0].strip() == self.ini for o in config.option.override_ini or ())
        where = f"-o {self.ini}" if overridden else f"ini option {self.ini} in {config.inipath or 'the config file'}"
        try:
            ini = config.getini(self.ini)
        except ValueError as exc:  # pytest's own conversion (bool ini type): name the option
            raise pytest.UsageError(f"llmperf: bad value for {where}: {exc}") from None
        given = ini is not None and ini != [] and (ini != "" or self.empty_given)
        if given and overridden:
            found.append(("cli", where, ini))
        env = os.environ.get(self.env) if self.env else None
        if env:  # an empty secret (a fork's CI) is unset
            found.append(("env", f"environment variable {self.env}", env))
        if given and not overridden:
            found.append(("ini", where, ini))
        return found


def option(help: str, parse: Callable[[Any], Any], default: Any = None, metavar: str | None = None, **kw: Any) -> Any:
    """A Settings field that is an option (named after the field): its help, parser, default and value form."""
    spec = Option("", help, parse, default, metavar, **kw)
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={OPTION: spec})
    return field(default=default, metadata={OPTION: spec})


#: Paths resolved as pytest resolves its own: from the CLI against the invocation directory, from the ini file
#: against that file's directory.
PATHS = ("report_dir", "baseline_dir", "cache_dir", "json", "env_dir")


@dataclass(frozen=True)
class CoreOptions:
    """The options of measuring, judging and reporting."""

    # fmt: off
    device: str | None = option("Hardware target, e.g. cpu, a100 (default: detected)", plain_name, None, "NAME")
    report_dir: str = option("Directory of the reports (default: reports/)", as_string, "reports", "DIR")
    json: str | None = option("Also write the JSON report to this path", as_string, None, "PATH")
    baseline_dir: str | None = option("Directory of baselines/ (default: baselines/)", as_string, None, "DIR")
    machine: str | None = option("Name of this machine's baseline set", plain_name, None, "NAME")
    runs: int | str = option("Measured runs per batch size and process (default: auto)", auto_or_positive_int,
                             "auto", "N|auto")
    warmups: int = option("Warmup runs per batch size (default: 1)", non_negative_int, 1, "N", expert=True)
    max_runs: int = option("Most runs per batch size (default: 30)", positive_int, 30, "N", expert=True)
    alpha: float = option("Chance of a false 'regressed' in a job (default: 0.01)", probability, 0.01,
                          "P")
    rtol: float | str = option("Relative tolerance of a slowdown (default: auto)", rtol, "auto", "R|auto")
    max_load: float = option("Busy cores of others allowed; inf: any (default: 0.25)", load_limit,
                             0.25, "CORES")
    threads: int | str = option("torch threads of in-process backends (default: auto)", threads, "auto",
                                "auto|N", expert=True)
    fail_on: tuple[str, ...] = option("Outcomes that fail the run, a comma list or none", fail_on,
                                      DEFAULT_FAIL_ON, "OUTCOMES")
    outputs: str = option("What changed generated tokens do (default: fail)", outputs_mode, "fail",
                          "fail|warn|off")
    memory_rtol: float = option("Relative tolerance of peak memory (default: 0.1)", non_negative_float, 0.1,
                                "R", expert=True)
    malloc: str = option("Host allocator while measuring (default: steady)", malloc_mode, "steady",
                         "steady|system", expert=True)
    processes: int | str = option("Worker processes per side; 1: none (default: auto)",
                                  auto_or_positive_int, "auto", "N|auto")
    max_processes: int | None = option("Most worker processes per side (default: 5 x processes)",
                                       positive_int, None, "N", expert=True)
    budget: float | str = option("Seconds an A/B job's rounds may take (default: auto)", budget, "auto",
                                 "SECONDS|auto")
    compare: str | None = option("Measure the working tree against this git ref, A/B", git_ref, None, "REF",
                                 empty_given=True)
    interleave: str = option("How an A/B job's sides take turns (default: run)", interleave_mode, "run",
                             "run|batch|process", expert=True)
    worker_start: str = option("How a worker process starts (default: fork on Linux)", worker_start,
                               "fork" if sys.platform.startswith("linux") else "exec", "fork|exec", expert=True)
    worker_timeout: float = option("Seconds before a worker counts as hung (default: 3600)",
                                   positive_float, 3600.0, "S", expert=True)
    update: bool = option("Rewrite the baselines of the selected tests", boolean, False, flag=True)
    update_missing: bool = option("Write the missing baselines only", boolean, False, flag=True)
    instructions: bool = option("Also count instructions (cpu, valgrind)", boolean, False, flag=True)
    instructions_only: bool = option("Count instructions, time nothing", boolean, False, flag=True)
    cache_dir: str | None = option("Cache of the embedded models", as_string, None, "DIR")
    model: Mapping[str, str] = option("A local model for an embedded name (repeatable)", model_map, {},
                                      "NAME=PATH", ini_type="linelist", repeatable=True)
    export: tuple[str, ...] = option("Dashboard files: github-action-benchmark, bencher", export_formats, (),
                                     "FORMATS")
    # fmt: on


@dataclass(frozen=True)
class ServerOptions:
    # fmt: off
    # Servers (pytest_llmperf/servers/fixtures.py): attach to a running server instead of starting one.
    tgi_url: str | None = option("Attach llmperf_tgi to this running TGI server", url, None, "URL")
    tgi_launcher: str = option("The TGI launcher program (default: from PATH)", as_string,
                               "text-generation-launcher", "PATH", expert=True)
    openai_url: str | None = option("Attach to this running OpenAI-compatible server", url, None, "URL")
    vllm_python: str | None = option("The Python of vLLM's environment (default: this one)", as_string,
                                     None, "PATH", expert=True)
    jetstream_url: str | None = option("Attach to this running JetStream server", as_string, None,
                                       "HOST:PORT")
    server_timeout: float = option("Seconds a started server may take (default: 600)",
                                   positive_float, 600.0, "S", expert=True)
    # The offload engine (llmperf_offload); its fixture's keyword arguments take precedence.
    offload_expert_budget_gb: float | None = option("Offload: most GiB of experts on the fast device",
                                                    non_negative_float, None, "GB", expert=True)
    offload_device_memory_gb: float | None = option("Offload: size the budget for a device of this many GiB",
                                                    non_negative_float, None, "GB", expert=True)
    offload_popularity: str | None = option("Offload: expert popularity profile (JSON)", as_string, None,
                                            "PATH", expert=True)
    # fmt: on


@dataclass(frozen=True)
class EnvironmentOptions:
    # fmt: off
    # Each side's dependencies in an A/B comparison (pytest_llmperf/environments/, docs/environments.md).
    compare_deps: str = option("A/B: how each side's environment is made (default: auto)", compare_deps,
                               "auto", "auto|build|code-only")
    base_python: str | None = option("A/B: the base side's prepared interpreter", as_string, None, "PATH")
    env_dir: str | None = option("A/B: cache of the built environments", as_string, None, "DIR", expert=True)
    env_extras: tuple[str, ...] = option("A/B: extras to install, one per line", name_list, (), "NAME",
                                         ini_type="linelist", expert=True)
    env_groups: tuple[str, ...] = option("A/B: dependency groups to install, one per line", name_list, (),
                                         "NAME", ini_type="linelist", expert=True)
    compare_deps_paths: tuple[str, ...] = option("A/B: more dependency files or globs, one per line",
                                                 path_list, (), "PATH", ini_type="linelist", expert=True)
    # fmt: on


@dataclass(frozen=True)
class HistoryOptions:
    # fmt: off
    # The history of every job's results (pytest_llmperf/history/, docs/history.md).
    history: str = option("Results store: a SQLite path, postgresql:// URL, or off", history_values.store_location,
                          history_values.DEFAULT_STORE, "PATH|URL|off", env="LLMPERF_HISTORY")
    history_check: str = option("What the history does at a job's end (default: report)", history_values.check_mode,
                                "report", "report|fail|off")
    history_min_effect: float = option("Smallest change of a series that matters (default: 0.05)",
                                       non_negative_float, 0.05, "R", expert=True)
    history_anchor: str | None = option("The git ref creep is measured from", as_string, None, "REF",
                                        expert=True)
    history_branch: str | None = option("The default branch (default: origin's HEAD)", as_string, None,
                                        "NAME", expert=True)
    history_rows: bool = option("Also write history-rows.jsonl (default: true)", boolean, True,
                                "true|false", expert=True)
    # fmt: on


@dataclass(frozen=True)
class Settings(HistoryOptions, EnvironmentOptions, ServerOptions, CoreOptions):
    """The session's resolved options (marker settings come on top per test): every group's fields, core first."""

    rootdir: Path = Path(".")  # the pytest rootdir
    given: tuple[str, ...] = ()  # options typed on the command line, repeated by re-run hints

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        inherited = worker_settings()
        if inherited is not None:  # a worker process: exactly the controller's settings, measured in-process
            return cls.from_json(inherited, Path(config.rootpath))
        values = {o.name: o.value(config) for o in OPTIONS}
        config_dir = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
        if OPTIONS_BY_NAME["report_dir"].source(config) is None:  # by default beside the config, as baselines/
            values["report_dir"] = str(config_dir / "reports")
        for name in PATHS:
            if values[name] is None:
                continue
            base = config_dir if OPTIONS_BY_NAME[name].source(config) == "ini" else config.invocation_params.dir
            values[name] = str((Path(base) / Path(values[name]).expanduser()).resolve())
        if values["baseline_dir"] is None:
            values["baseline_dir"] = str(config_dir / "baselines")
        values["instructions"] = values["instructions"] or values["instructions_only"]
        # what the user typed (not PYTEST_ADDOPTS, which a re-run inherits), repeated by re-run hints
        args = config.invocation_params.args
        typed = {arg.partition("=")[0] for arg in args}
        given = tuple(o.name for o in OPTIONS if o.cli in typed or (o.expert and any(f"{o.ini}=" in a for a in args)))
        return cls(**values, rootdir=Path(config.rootpath), given=given)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], rootdir: Path) -> Settings:
        """Settings as `as_dict` wrote them (lists read back as the tuples they were); unknown names ignored."""
        known = {o.name for o in OPTIONS}
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
        return cls(**values, rootdir=rootdir)

    def as_dict(self) -> dict[str, Any]:
        """Every option's value, by name (the JSON report's `settings`)."""
        return {o.name: getattr(self, o.name) for o in OPTIONS}

    def resolved(self, **values: Any) -> Settings:
        """These settings with values decided by the session (an `auto` resolved for the target)."""
        return replace(self, **values)

    def for_worker(self) -> str:
        """What a worker process measures with (ENV_SETTINGS, JSON): these settings, measured in the worker itself,
        writing nothing (its controller judges, records and reports)."""
        mine: dict[str, Any] = {"processes": 1, "compare": None, "json": None, "update": False, "update_missing": False}
        if self.compare:  # A/B: a steady load is both sides', and a run taken again would break its pairing with
            mine["max_load"] = math.inf  # the other side's run (docs/gate.md, "A busy machine")
        return json.dumps({**self.as_dict(), **mine})

    def for_test(self, marker_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Per-test settings: the marker's keywords over the session's values."""
        merged = {name: getattr(self, name) for name in PER_TEST}
        # A per-metric rtol in the marker ({"prefill_ms": 0.1}) falls back to the session's rtol for the rest.
        merged["default_rtol"] = self.rtol
        merged.update(marker_kwargs)
        return merged


OPTIONS: tuple[Option, ...] = tuple(
    replace(f.metadata[OPTION], name=f.name) for f in fields(Settings) if OPTION in f.metadata
)
OPTIONS_BY_NAME: Mapping[str, Option] = {o.name: o for o in OPTIONS}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmperf", "LLM inference benchmarks (pytest-llmperf)")
    for each in OPTIONS:
        each.add_to(parser, group)


def refuse_expert_flags(args: list[str]) -> None:
    """An expert knob typed as a flag (`--llmperf-warmups=0`) is refused naming its ini key, not only as pytest's
    "unrecognized arguments"."""
    expert = {o.cli: o.ini for o in OPTIONS if o.expert}
    for arg in args:
        flag, _, value = arg.partition("=")
        if flag in expert:
            raise pytest.UsageError(
                f"{flag} is an ini key now: `-o {expert[flag]}={value or 'VALUE'}` for one run, or {expert[flag]} "
                "in the ini file (docs/options.md)"
            )


NAME = "llmperf"


def _levels(item: pytest.Item) -> list[tuple[str, list[pytest.Mark]]]:
    """The item's llmperf markers grouped by where they are set, nearest first."""
    callspec = getattr(item, "callspec", None)
    case = [m for m in getattr(callspec, "marks", ()) if m.name == NAME]
    levels: list[tuple[str, list[pytest.Mark]]] = [(f"the parameter case {item.name}", case)] if case else []
    by_node: dict[int, tuple[str, list[pytest.Mark]]] = {}
    for node, mark in item.iter_markers_with_node(NAME):
        if any(mark is m for m in case):
            continue
        where = "the test" if node is item else f"{type(node).__name__.lower()} {node.name}"
        by_node.setdefault(id(node), (where, []))[1].append(mark)
    return levels + list(by_node.values())


def marker_kwargs(item: pytest.Item) -> dict[str, Any]:
    """The test's checked llmperf keywords ({} without a marker); ScenarioError naming a bad or ambiguous one."""
    merged: dict[str, Any] = {}
    for where, marks in reversed(_levels(item)):  # farthest first: nearer levels overwrite
        level: dict[str, Any] = {}
        for mark in marks:
            kwargs = check_marker_kwargs(mark.args, mark.kwargs)
            for name, value in kwargs.items():
                if name in level and level[name] != value:
                    raise ScenarioError(
                        f"two @pytest.mark.llmperf markers on {where} give {name} two values ({level[name]!r} and "
                        f"{value!r}); keep one of them (markers of a class or module are overridden by the test's own)"
                    )
                level[name] = value
        merged.update(level)
    return merged


#: Options a hint decides itself instead of repeating.
NOT_REPEATED = ("update", "update_missing", "device")


def _format(name: str, value: Any) -> list[str]:
    option = OPTIONS_BY_NAME[name]
    if isinstance(value, bool) and not option.expert:
        return [option.cli] if value else []
    if isinstance(value, Mapping):  # --llmperf-model NAME=PATH, repeated
        return [f"{option.cli}=" + shlex.quote(f"{k}={v}") for k, v in value.items()]
    if isinstance(value, (tuple, list)):
        text = ",".join(map(str, value)) or ("" if option.expert else "none")
    elif isinstance(value, float):
        text = format(value, "g")
    else:
        text = str(value).lower() if isinstance(value, bool) else str(value)
    if option.expert:  # an ini key only: -o sets it for the one run
        return ["-o", shlex.quote(f"{option.ini}={text}")]
    return [f"{option.cli}={shlex.quote(text)}"]


def rerun_command(
    settings: Settings,
    device: str,
    nodeid: str | None = None,
    *,
    update: bool = False,
    replace: Mapping[str, Any] | None = None,
    extra: Sequence[str] = (),
) -> str:
    """`pytest [nodeid] --llmperf-device=D <the options given> [--llmperf-update]`; `replace` sets or
    overrides options (e.g. a higher max_load)."""
    replace = dict(replace or {})
    parts = ["pytest"] + ([shlex.quote(nodeid)] if nodeid else [])
    parts.append(f"--llmperf-device={shlex.quote(replace.pop('device', device))}")
    for name in settings.given:
        if name in NOT_REPEATED or name in replace:
            continue
        parts += _format(name, getattr(settings, name))
    for name, value in replace.items():
        parts += _format(name, value)
    parts += list(extra)
    if update:
        parts.append("--llmperf-update")
    return " ".join(parts)
