"""Every option, described once: the Settings dataclass is the table, one field per option, each declared with
`option(...)` (option_sources.py: its CLI flag `--llmperf-X`, ini key `llmperf_X`, env var `LLMPERF_X`, parser and
default).

Precedence: marker > CLI > environment > ini > default (as pytest-timeout does). `Settings.from_config` resolves
them for the session; a test's marker comes on top in `Settings.for_test` (measure/keywords.py says which keywords
a marker may set). docs/options.md is generated from this table (scripts/reference_docs.py).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pytest

from ..measure.keywords import PER_TEST
from . import option_values as parsers
from .option_groups import EnvironmentOptions, HistoryOptions, ServerOptions
from .option_sources import OPTION, Option, option
from .protocol import worker_settings

#: Paths resolved as pytest resolves its own: from the CLI or environment against the invocation directory, from
#: the ini file against that file's directory.
PATHS = ("report_dir", "baseline_dir", "cache_dir", "json", "env_dir")


@dataclass(frozen=True)
class CoreOptions:
    """The options of measuring, judging and reporting (the other groups: option_groups.py)."""

    device: str | None = option(
        "Hardware target the results belong to, e.g. cpu, a100, h100 (default: detected)",
        parsers.plain_name,
        metavar="NAME",
    )
    report_dir: str = option(
        "Directory for reports/<device>.md and .json (default: reports beside the config file)",
        parsers.as_string,
        default="reports",
        metavar="DIR",
    )
    json: str | None = option("Also write the JSON report to this path", parsers.as_string, metavar="PATH")
    baseline_dir: str | None = option(
        "Directory holding baselines/<device>/ (default: baselines beside the config file)",
        parsers.as_string,
        metavar="DIR",
    )
    machine: str | None = option(
        "Name of this machine's baseline set, baselines/<device>/<machine>/ (default: on the cpu "
        "target a slug of the CPU's identity, e.g. intel-xeon-f6-m167-s1-amxbf16; on GPU targets none, "
        "baselines/<device>/). Give runners that share hardware one name",
        parsers.plain_name,
        metavar="NAME",
    )
    runs: int | str = option(
        "Measured runs per batch size: in each worker process, whose median the gate tests; measured in "
        "one process (--llmperf-processes=1), the runs of the first look (default: auto, 3 per worker process, "
        "10 in one process)",
        parsers.auto_or_positive_int,
        default="auto",
        metavar="N|auto",
    )
    warmups: int = option(
        "Warmup runs per batch size, measured and discarded (default: 1)",
        parsers.non_negative_int,
        default=1,
        metavar="N",
    )
    max_runs: int = option(
        "Most runs per batch size: measured in one process, while a row is undecided (doubling from "
        "--llmperf-runs); in an A/B job's worker processes, each (default: 30)",
        parsers.positive_int,
        default=30,
        metavar="N",
    )
    alpha: float = option(
        "Family-wise error rate of 'regressed': the chance that a job of unchanged code ends with a "
        "regressed row, however many rows and looks it has (default: 0.01)",
        parsers.probability,
        default=0.01,
        metavar="P",
    )
    rtol: float | str = option(
        "Relative tolerance: a row regresses when its slowdown is credibly beyond it, and passes when "
        "shown to be within it; auto: 0.05 for A/B (--llmperf-compare), against stored baselines the measured "
        "drift between sessions: 0.15 on the cpu target, 0.05 on GPU targets (default: auto)",
        parsers.rtol,
        default="auto",
        metavar="R|auto",
    )
    max_load: float = option(
        "Retake a run during which other processes kept more than this many cores busy; "
        "refuse to judge or record a batch that stayed busy; inf: never (default: 0.25)",
        parsers.load_limit,
        default=0.25,
        metavar="CORES",
    )
    threads: int | str = option(
        "torch threads while measuring in-process backends; auto: 1 on the cpu target, torch's default on a GPU "
        "target; a marker's knobs={'threads': n} wins (default: auto)",
        parsers.threads,
        default="auto",
        metavar="auto|N",
    )
    fail_on: tuple[str, ...] = option(
        "Outcomes that fail the run, a comma list out of regressed, missing, inconclusive, refused, "
        "unjudged (a session that selected benchmarks and judged none), or none "
        "(default: regressed,missing,inconclusive,unjudged)",
        parsers.fail_on,
        default=parsers.DEFAULT_FAIL_ON,
        metavar="OUTCOMES",
    )
    outputs: str = option(
        "What generated tokens that differ from the baseline's (or the compared ref's) do, where the "
        "backend reports them (in-process backends: greedy, fixed length): fail the test, warn, or off "
        "(default: fail; a marker's outputs= wins)",
        parsers.outputs_mode,
        default="fail",
        metavar="fail|warn|off",
    )
    memory_rtol: float = option(
        "Relative tolerance of peak memory (RSS, CUDA, GPU): a batch size whose median peak grew "
        "more than this and more than 16 MiB regressed; memory is nearly deterministic on a fixed shape, so it "
        "is held to a tolerance, not a rank test (default: 0.1)",
        parsers.non_negative_float,
        default=0.1,
        metavar="R",
    )
    malloc: str = option(
        "Host allocator during benchmarks: steady fixes glibc's mmap and trim thresholds so every "
        "session allocates alike (timings of unchanged code otherwise settle into per-session modes); "
        "system leaves it (default: steady)",
        parsers.malloc_mode,
        default="steady",
        metavar="steady|system",
    )
    processes: int | str = option(
        "Worker processes per side at a benchmark's first look, each reduced to its medians; the "
        "gate tests per-process values. 1 measures in the pytest process itself (default: auto, 5; 8 in an A/B job)",
        parsers.auto_or_positive_int,
        default="auto",
        metavar="N|auto",
    )
    max_processes: int | None = option(
        "Most worker processes per side while a row is undecided, for the batch sizes still undecided "
        "(default: 5 times --llmperf-processes, 4 times for 1 or 2, where a fifth doubling would trim away "
        "what it adds)",
        parsers.positive_int,
        metavar="N",
    )
    budget: float | str = option(
        "Seconds an A/B job's rounds may take; its runs and processes are chosen within them "
        "(default: auto, 5 times its first look's, at most 5 min more than it)",
        parsers.budget,
        default="auto",
        metavar="SECONDS|auto",
    )
    compare: str | None = option(
        "Measure the working tree against this git ref (e.g. origin/main, HEAD) in one job, A/B in alternating worker "
        "processes, instead of against stored baselines; an empty value is refused",
        parsers.git_ref,
        metavar="REF",
        empty_given=True,
    )
    interleave: str = option(
        "How the two sides of an A/B comparison alternate: run, the two worker processes of a "
        "round run together and take turns run by run, so each pair of runs is measured a fraction of a second "
        "apart (the speed of a shared machine changes within seconds); batch, they take turns at every batch "
        "size; process, one whole worker process after the other (default: run)",
        parsers.interleave_mode,
        default="run",
        metavar="run|batch|process",
    )
    worker_start: str = option(
        "How a worker process starts: fork, from a server that imported what both sides share from site-packages "
        "once per job; exec, a fresh interpreter each (default: fork on Linux, exec elsewhere)",
        parsers.worker_start,
        default="fork" if sys.platform.startswith("linux") else "exec",
        metavar="fork|exec",
    )
    worker_timeout: float = option(
        "Seconds a worker process (with --llmperf-processes=1: a benchmark's measurement) "
        "may run before it is stopped as hung (default: 3600)",
        parsers.positive_float,
        default=3600.0,
        metavar="S",
    )
    update: bool = option(
        "Rewrite the baselines of the selected tests; they pass", parsers.boolean, default=False, flag=True
    )
    update_missing: bool = option(
        "Write baselines that are missing; leave existing ones alone", parsers.boolean, default=False, flag=True
    )
    instructions: bool = option(
        "Also count the instructions of prefill and decode (cpu target, in-process backends): one "
        "process per side under valgrind's callgrind, compared to a tolerance; a marker's instructions= wins "
        "(docs/instructions.md)",
        parsers.boolean,
        default=False,
        flag=True,
    )
    instructions_only: bool = option(
        "Count instructions and time nothing for the tests that count: their rows are the "
        "counts alone, one process per side, no timing rounds (implies --llmperf-instructions; a test whose "
        "marker says instructions=False is timed as usual)",
        parsers.boolean,
        default=False,
        flag=True,
    )
    cache_dir: str | None = option(
        "Where the embedded default models are built and cached (default: $XDG_CACHE_HOME/pytest-llmperf)",
        parsers.as_string,
        metavar="DIR",
    )
    model: Mapping[str, str] = option(
        "Use a local model for an embedded model name, NAME=PATH (repeatable)",
        parsers.model_map,
        default={},
        ini_type="linelist",
        repeatable=True,
        metavar="NAME=PATH",
    )
    export: tuple[str, ...] = option(
        "Also write files for benchmark dashboards into the report directory, a comma list out of "
        "github-action-benchmark (<device>.customSmallerIsBetter.json and .customBiggerIsBetter.json) and "
        "bencher (<device>.bmf.json, Bencher Metric Format), or none (default: none; docs/reports.md)",
        parsers.export_formats,
        default=(),
        metavar="FORMATS",
    )


@dataclass(frozen=True)
class Settings(HistoryOptions, EnvironmentOptions, ServerOptions, CoreOptions):
    """The session's resolved options (marker settings come on top per test): every group's fields, core first."""

    rootdir: Path = Path(".")  # the pytest rootdir
    given: tuple[str, ...] = ()  # options given on the command line, repeated by re-run hints

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
        given = tuple(o.name for o in OPTIONS if o.source(config) == "cli")
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
