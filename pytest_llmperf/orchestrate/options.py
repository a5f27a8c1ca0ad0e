"""Every option, described once: the Settings dataclass is the table, one field per option, each declared with
`option(...)`: its ini key `llmperf_X`, for what a user changes per run also a flag `--llmperf-X` (an expert knob is an
ini key only), its parser (option_values.py) and default. docs/options.md is generated from this table
(scripts/reference_docs.py) and says each one's reasons.

Precedence: marker > command line (`PYTEST_ADDOPTS` and `-o` too) > environment (`LLMPERF_HISTORY` only) > ini >
default. `Settings.from_config` resolves them for the session; a test's marker comes on top in `Settings.for_test`
(measure/keywords.py says which keywords a marker may set).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import pytest

from ..history import settings as history_values
from ..measure.keywords import PER_TEST
from . import option_values as parsers
from .protocol import worker_settings

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
    device: str | None = option("Hardware target, e.g. cpu, a100 (default: detected)", parsers.plain_name, None, "NAME")
    report_dir: str = option("Directory of the reports (default: reports/)", parsers.as_string, "reports", "DIR")
    json: str | None = option("Also write the JSON report to this path", parsers.as_string, None, "PATH")
    baseline_dir: str | None = option("Directory of baselines/ (default: baselines/)", parsers.as_string, None, "DIR")
    machine: str | None = option("Name of this machine's baseline set", parsers.plain_name, None, "NAME")
    runs: int | str = option("Measured runs per batch size and process (default: auto)", parsers.auto_or_positive_int,
                             "auto", "N|auto")
    warmups: int = option("Warmup runs per batch size (default: 1)", parsers.non_negative_int, 1, "N", expert=True)
    max_runs: int = option("Most runs per batch size (default: 30)", parsers.positive_int, 30, "N", expert=True)
    alpha: float = option("Chance of a false 'regressed' in a job (default: 0.01)", parsers.probability, 0.01,
                          "P")
    rtol: float | str = option("Relative tolerance of a slowdown (default: auto)", parsers.rtol, "auto", "R|auto")
    max_load: float = option("Busy cores of others allowed; inf: any (default: 0.25)", parsers.load_limit,
                             0.25, "CORES")
    threads: int | str = option("torch threads of in-process backends (default: auto)", parsers.threads, "auto",
                                "auto|N", expert=True)
    fail_on: tuple[str, ...] = option("Outcomes that fail the run, a comma list or none", parsers.fail_on,
                                      parsers.DEFAULT_FAIL_ON, "OUTCOMES")
    outputs: str = option("What changed generated tokens do (default: fail)", parsers.outputs_mode, "fail",
                          "fail|warn|off")
    memory_rtol: float = option("Relative tolerance of peak memory (default: 0.1)", parsers.non_negative_float, 0.1,
                                "R", expert=True)
    malloc: str = option("Host allocator while measuring (default: steady)", parsers.malloc_mode, "steady",
                         "steady|system", expert=True)
    processes: int | str = option("Worker processes per side; 1: none (default: auto)",
                                  parsers.auto_or_positive_int, "auto", "N|auto")
    max_processes: int | None = option("Most worker processes per side (default: 5 x processes)",
                                       parsers.positive_int, None, "N", expert=True)
    budget: float | str = option("Seconds an A/B job's rounds may take (default: auto)", parsers.budget, "auto",
                                 "SECONDS|auto")
    compare: str | None = option("Measure the working tree against this git ref, A/B", parsers.git_ref, None, "REF",
                                 empty_given=True)
    interleave: str = option("How an A/B job's sides take turns (default: run)", parsers.interleave_mode, "run",
                             "run|batch|process", expert=True)
    worker_start: str = option("How a worker process starts (default: fork on Linux)", parsers.worker_start,
                               "fork" if sys.platform.startswith("linux") else "exec", "fork|exec", expert=True)
    worker_timeout: float = option("Seconds before a worker counts as hung (default: 3600)",
                                   parsers.positive_float, 3600.0, "S", expert=True)
    update: bool = option("Rewrite the baselines of the selected tests", parsers.boolean, False, flag=True)
    update_missing: bool = option("Write the missing baselines only", parsers.boolean, False, flag=True)
    instructions: bool = option("Also count instructions (cpu, valgrind)", parsers.boolean, False, flag=True)
    instructions_only: bool = option("Count instructions, time nothing", parsers.boolean, False, flag=True)
    cache_dir: str | None = option("Cache of the embedded models", parsers.as_string, None, "DIR")
    model: Mapping[str, str] = option("A local model for an embedded name (repeatable)", parsers.model_map, {},
                                      "NAME=PATH", ini_type="linelist", repeatable=True)
    export: tuple[str, ...] = option("Dashboard files: github-action-benchmark, bencher", parsers.export_formats, (),
                                     "FORMATS")
    # fmt: on


@dataclass(frozen=True)
class ServerOptions:
    # fmt: off
    # Servers (pytest_llmperf/servers/fixtures.py): attach to a running server instead of starting one.
    tgi_url: str | None = option("Attach llmperf_tgi to this running TGI server", parsers.url, None, "URL")
    tgi_launcher: str = option("The TGI launcher program (default: from PATH)", parsers.as_string,
                               "text-generation-launcher", "PATH", expert=True)
    openai_url: str | None = option("Attach to this running OpenAI-compatible server", parsers.url, None, "URL")
    vllm_python: str | None = option("The Python of vLLM's environment (default: this one)", parsers.as_string,
                                     None, "PATH", expert=True)
    jetstream_url: str | None = option("Attach to this running JetStream server", parsers.as_string, None,
                                       "HOST:PORT")
    server_timeout: float = option("Seconds a started server may take (default: 600)",
                                   parsers.positive_float, 600.0, "S", expert=True)
    # The offload engine (llmperf_offload); its fixture's keyword arguments take precedence.
    offload_expert_budget_gb: float | None = option("Offload: most GiB of experts on the fast device",
                                                    parsers.non_negative_float, None, "GB", expert=True)
    offload_device_memory_gb: float | None = option("Offload: size the budget for a device of this many GiB",
                                                    parsers.non_negative_float, None, "GB", expert=True)
    offload_popularity: str | None = option("Offload: expert popularity profile (JSON)", parsers.as_string, None,
                                            "PATH", expert=True)
    # fmt: on


@dataclass(frozen=True)
class EnvironmentOptions:
    # fmt: off
    # Each side's dependencies in an A/B comparison (pytest_llmperf/environments/, docs/environments.md).
    compare_deps: str = option("A/B: how each side's environment is made (default: auto)", parsers.compare_deps,
                               "auto", "auto|build|code-only")
    base_python: str | None = option("A/B: the base side's prepared interpreter", parsers.as_string, None, "PATH")
    env_dir: str | None = option("A/B: cache of the built environments", parsers.as_string, None, "DIR", expert=True)
    env_extras: tuple[str, ...] = option("A/B: extras to install, one per line", parsers.name_list, (), "NAME",
                                         ini_type="linelist", expert=True)
    env_groups: tuple[str, ...] = option("A/B: dependency groups to install, one per line", parsers.name_list, (),
                                         "NAME", ini_type="linelist", expert=True)
    compare_deps_paths: tuple[str, ...] = option("A/B: more dependency files or globs, one per line",
                                                 parsers.path_list, (), "PATH", ini_type="linelist", expert=True)
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
                                       parsers.non_negative_float, 0.05, "R", expert=True)
    history_anchor: str | None = option("The git ref creep is measured from", parsers.as_string, None, "REF",
                                        expert=True)
    history_branch: str | None = option("The default branch (default: origin's HEAD)", parsers.as_string, None,
                                        "NAME", expert=True)
    history_rows: bool = option("Also write history-rows.jsonl (default: true)", parsers.boolean, True,
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
