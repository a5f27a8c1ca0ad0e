"""Every option, described once: CLI flag `--llmperf-X`, ini key `llmperf_X`, env var `LLMPERF_X`.

Precedence: marker > CLI > environment > ini > default (as pytest-timeout does). `Option.value`
resolves one option for the session; per-test settings add the marker on top in `Settings.for_test`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from ..history import settings as history_values
from . import option_values as parsers
from .worker import worker_settings


@dataclass(frozen=True)
class Option:
    name: str  # e.g. "runs" -> --llmperf-runs, llmperf_runs, LLMPERF_RUNS
    help: str
    parse: Callable[[Any], Any]
    default: Any = None
    ini_type: str = "string"
    flag: bool = False  # a CLI switch (store_true)
    repeatable: bool = False  # a CLI option given several times
    metavar: str | None = None

    @property
    def cli(self) -> str:
        return "--llmperf-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return "llmperf_" + self.name

    @property
    def env(self) -> str:
        return "LLMPERF_" + self.name.upper()

    @property
    def dest(self) -> str:
        return "llmperf_" + self.name

    def add_to(self, parser: pytest.Parser, group: pytest.OptionGroup) -> None:
        help_text = f"{self.help} (ini: {self.ini}, env: {self.env})"
        if self.flag:
            group.addoption(self.cli, action="store_true", default=None, dest=self.dest, help=help_text)
        elif self.repeatable:
            group.addoption(self.cli, action="append", default=None, dest=self.dest, metavar=self.metavar,
                            help=help_text)
        else:
            group.addoption(self.cli, action="store", default=None, dest=self.dest, metavar=self.metavar,
                            help=help_text)
        parser.addini(self.ini, help=self.help, type=self.ini_type, default=None)  # type: ignore[arg-type]

    def value(self, config: pytest.Config) -> Any:
        """CLI > environment > ini > default; a bad value is a UsageError naming where it came from."""
        for _, label, raw in self._sources(config):
            try:
                return self.parse(raw)
            except (TypeError, ValueError) as exc:
                raise pytest.UsageError(f"llmperf: bad value for {label}: {exc}") from None
        return self.default

    def source(self, config: pytest.Config) -> str | None:
        """Where the value comes from: 'cli', 'env', 'ini', or None for the default."""
        found = self._sources(config)
        return found[0][0] if found else None

    def _sources(self, config: pytest.Config) -> list[tuple[str, str, Any]]:
        found: list[tuple[str, str, Any]] = []
        cli = config.getoption(self.dest, default=None)
        if cli is not None:
            found.append(("cli", self.cli, cli))
        env = os.environ.get(self.env)
        if env is not None and env != "":
            found.append(("env", f"environment variable {self.env}", env))
        try:
            ini = config.getini(self.ini)
        except ValueError as exc:  # pytest's own conversion (bool ini type): name the option
            raise pytest.UsageError(f"llmperf: bad value for ini option {self.ini} in "
                                    f"{config.inipath or 'the config file'}: {exc}") from None
        if ini is not None and ini != [] and ini != "":
            found.append(("ini", f"ini option {self.ini} in {config.inipath or 'the config file'}", ini))
        return found


OPTIONS: tuple[Option, ...] = (
    Option("device", "Hardware target the results belong to, e.g. cpu, a100, h100 (default: detected)",
           parsers.plain_name, metavar="NAME"),
    Option("report_dir", "Directory for reports/<device>.md and .json (default: reports)",
           parsers.as_string, default="reports", metavar="DIR"),
    Option("json", "Also write the JSON report to this path", parsers.as_string, metavar="PATH"),
    Option("baseline_dir", "Directory holding baselines/<device>/ (default: baselines beside the config file)",
           parsers.as_string, metavar="DIR"),
    Option("machine", "Name of this machine's baseline set, baselines/<device>/<machine>/ (default: on the cpu "
           "target a slug of the CPU's identity, e.g. intel-xeon-f6-m167-s1-amxbf16; on GPU targets none, "
           "baselines/<device>/). Give runners that share hardware one name", parsers.plain_name, metavar="NAME"),
    Option("runs", "Measured runs per batch size: in each worker process, whose median the gate tests; measured in "
           "one process (--llmperf-processes=1), the runs of the first look (default: auto, 3 per worker process, "
           "10 in one process)", parsers.auto_or_positive_int, default="auto", metavar="N|auto"),
    Option("warmups", "Warmup runs per batch size, measured and discarded (default: 1)",
           parsers.non_negative_int, default=1, metavar="N"),
    Option("max_runs", "Measured in one process: most runs per batch size while a row is undecided, more added in "
           "doublings from --llmperf-runs (default: 30)",
           parsers.positive_int, default=30, metavar="N"),
    Option("alpha", "Family-wise error rate of 'regressed': the chance that a job of unchanged code ends with a "
           "regressed row, however many rows and looks it has (default: 0.01)", parsers.probability,
           default=0.01, metavar="P"),
    Option("rtol", "Relative tolerance: a row regresses when its slowdown is credibly beyond it, and passes when "
           "shown to be within it; auto: 0.05 for A/B (--llmperf-compare), against stored baselines the measured "
           "drift between sessions: 0.15 on the cpu target, 0.05 on GPU targets (default: auto)", parsers.rtol,
           default="auto", metavar="R|auto"),
    Option("max_load", "Retake a run during which other processes kept more than this many cores busy; "
           "refuse to judge or record a batch that stayed busy; inf: never (default: 0.25)", parsers.load_limit,
           default=0.25, metavar="CORES"),
    Option("threads", "torch threads while measuring in-process backends; auto = 1 on the cpu target (timings "
           "at 2 threads on a shared 2-core machine spread 2-3x wider, docs/noise.md), torch's default on a GPU "
           "target; a marker's knobs={'threads': n} wins (default: auto)", parsers.threads, default="auto",
           metavar="auto|N"),
    Option("fail_on", "Outcomes that fail the run, a comma list out of regressed, missing, inconclusive, refused, "
           "unjudged (a session that selected benchmarks and judged none), or none "
           "(default: regressed,missing,inconclusive,unjudged)", parsers.fail_on,
           default=parsers.DEFAULT_FAIL_ON, metavar="OUTCOMES"),
    Option("outputs", "What generated tokens that differ from the baseline's (or the compared ref's) do, where the "
           "backend reports them (in-process backends: greedy, fixed length): fail the test, warn, or off "
           "(default: fail; a marker's outputs= wins)", parsers.outputs_mode, default="fail", metavar="fail|warn|off"),
    Option("memory_rtol", "Relative tolerance of peak memory (RSS, CUDA, GPU): a batch size whose median peak grew "
           "more than this and more than 16 MiB regressed; memory is nearly deterministic on a fixed shape, so it "
           "is held to a tolerance, not a rank test (default: 0.1)", parsers.non_negative_float, default=0.1,
           metavar="R"),
    Option("malloc", "Host allocator during benchmarks: steady fixes glibc's mmap and trim thresholds so every "
           "session allocates alike (timings of unchanged code otherwise settle into per-session modes); "
           "system leaves it (default: steady)", parsers.malloc_mode, default="steady", metavar="steady|system"),
    Option("processes", "Worker processes per side at a benchmark's first look, each reduced to its medians; the "
           "gate tests per-process values. 1 measures in the pytest process itself (default: auto, 5)",
           parsers.auto_or_positive_int, default="auto", metavar="N|auto"),
    Option("max_processes", "Most worker processes per side while a row is undecided; one more is added a round "
           "from --llmperf-processes on, for the batch sizes still undecided, and the test is judged after every "
           "round (default: 5 times --llmperf-processes, 4 times for 1 or 2, where a fifth doubling would trim away "
           "what it adds)",
           parsers.positive_int, metavar="N"),
    Option("compare", "Measure the working tree against this git ref (e.g. origin/main, HEAD) in one job, "
           "A/B in alternating worker processes, instead of against stored baselines", parsers.as_string,
           metavar="REF"),
    Option("interleave", "How the two sides of an A/B comparison alternate: run, the two worker processes of a "
           "round run together and take turns run by run, so each pair of runs is measured a fraction of a second "
           "apart (the speed of a shared machine changes within seconds); batch, they take turns at every batch "
           "size; process, one whole worker process after the other (default: run)", parsers.interleave_mode,
           default="run", metavar="run|batch|process"),
    Option("worker_start", "How a worker process starts: fork, from a server that imported once per job what both "
           "sides share from site-packages (pytest; numpy, torch and transformers where a test builds a torch model), "
           "so a worker imports only its side's project (a round of a small test: 2-3 times faster); exec, a fresh "
           "interpreter each (default: fork on Linux, exec elsewhere)", parsers.worker_start,
           default="fork" if sys.platform.startswith("linux") else "exec", metavar="fork|exec"),
    Option("worker_timeout", "Seconds a worker process (with --llmperf-processes=1: a benchmark's measurement) "
           "may run before it is stopped as hung (default: 3600)", parsers.positive_float, default=3600.0,
           metavar="S"),
    Option("update", "Rewrite the baselines of the selected tests; they pass", parsers.boolean, default=False,
           flag=True),
    Option("update_missing", "Write baselines that are missing; leave existing ones alone", parsers.boolean,
           default=False, flag=True),
    Option("instructions", "Also count the instructions of prefill and decode (cpu target, in-process backends): one "
           "process per side under valgrind's callgrind, compared to a tolerance; a marker's instructions= wins "
           "(docs/instructions.md)", parsers.boolean, default=False, flag=True),
    Option("instructions_only", "Count instructions and time nothing for the tests that count: their rows are the "
           "counts alone, one process per side, no timing rounds (implies --llmperf-instructions; a test whose "
           "marker says instructions=False is timed as usual)", parsers.boolean, default=False, flag=True),
    Option("cache_dir", "Where the embedded default models are built and cached "
           "(default: $XDG_CACHE_HOME/pytest-llmperf)", parsers.as_string, metavar="DIR"),
    Option("model", "Use a local model for an embedded model name, NAME=PATH (repeatable)",
           parsers.model_map, default={}, ini_type="linelist", repeatable=True, metavar="NAME=PATH"),
    # Servers (pytest_llmperf/servers/fixtures.py): attach to a running server instead of starting one.
    Option("tgi_url", "Attach llmperf_tgi to this running TGI server instead of starting one, e.g. "
           "http://127.0.0.1:8080", parsers.url, metavar="URL"),
    Option("tgi_launcher", "The text-generation-launcher program llmperf_tgi starts (default: from PATH)",
           parsers.as_string, default="text-generation-launcher", metavar="PATH"),
    Option("openai_url", "Attach llmperf_openai and llmperf_vllm to this running OpenAI-compatible server "
           "(base URL, without /v1)", parsers.url, metavar="URL"),
    Option("vllm_python", "The Python interpreter (of vLLM's own environment) llmperf_vllm starts vLLM with "
           "(default: this one)", parsers.as_string, metavar="PATH"),
    Option("jetstream_url", "Attach llmperf_jetstream to this running JetStream server, host:port",
           parsers.as_string, metavar="HOST:PORT"),
    Option("server_timeout", "Seconds a started server may take to become healthy (default: 600)",
           parsers.positive_float, default=600.0, ini_type="string", metavar="S"),
    # The offload engine (llmperf_offload); its fixture's keyword arguments take precedence.
    Option("offload_expert_budget_gb", "Offload engine: most GiB of experts kept on the fast device "
           "(default: as many as fit after the reserve)", parsers.non_negative_float, metavar="GB"),
    Option("offload_device_memory_gb", "Offload engine: size the budget as if the fast device had this many GiB, "
           "e.g. 24 to emulate an RTX 3090 (default: its real free memory)", parsers.non_negative_float, metavar="GB"),
    Option("offload_popularity", "Offload engine: expert popularity profile (JSON written by "
           "OffloadEngine.calibrate) that ranks experts for the fast device (default: round robin across layers)",
           parsers.as_string, metavar="PATH"),
    Option("export", "Also write files for benchmark dashboards into the report directory, a comma list out of "
           "github-action-benchmark (<device>.customSmallerIsBetter.json and .customBiggerIsBetter.json) and "
           "bencher (<device>.bmf.json, Bencher Metric Format), or none (default: none; docs/reports.md)",
           parsers.export_formats, default=(), metavar="FORMATS"),
    # The history of every job's results (pytest_llmperf/history/, docs/history.md).
    Option("history", "Where every job's results are kept for change-point detection across jobs: a SQLite file "
           "(a path, or sqlite:///PATH; relative to the rootdir), a postgresql:// URL (the postgres extra; better "
           "from the environment, a CI secret), or off (default: .llmperf/history.sqlite)",
           history_values.store_location, default=history_values.DEFAULT_STORE, metavar="PATH|URL|off"),
    Option("history_check", "What the history does at the end of a job: report (analyse the series the job "
           "measured, list changes in the reports), fail (also fail the session on a confirmed, unmarked regression "
           "of at least --llmperf-history-min-effect, or a store that cannot be written), off (append only) "
           "(default: report)", history_values.check_mode, default="report", metavar="report|fail|off"),
    Option("history_min_effect", "The smallest change of a series that matters, relative: a confirmed regression "
           "this large fails with --llmperf-history-check=fail, creep of half of it is flagged, and a series noisier "
           "than it is warned about (default: 0.05)", parsers.non_negative_float, default=0.05, metavar="R"),
    Option("history_anchor", "The git ref creep is measured from, e.g. the last release tag (default: the oldest "
           "commit analysed)", parsers.as_string, metavar="REF"),
    Option("history_branch", "The default branch, whose first-parent commits make a series (default: origin's "
           "HEAD, else main or master)", parsers.as_string, metavar="NAME"),
    Option("history_rows", "Also write the job's rows to history-rows.jsonl in the report directory, for "
           "`pytest-llmperf history import` where the job has no database (default: true)", parsers.boolean,
           default=True, metavar="true|false"),
)

OPTIONS_BY_NAME: Mapping[str, Option] = {o.name: o for o in OPTIONS}

#: Settings a test's marker may override (the rest are session-wide).
PER_TEST = ("runs", "warmups", "max_runs", "alpha", "rtol", "max_load", "outputs", "memory_rtol")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmperf", "LLM inference benchmarks (pytest-llmperf)")
    for option in OPTIONS:
        option.add_to(parser, group)


@dataclass(frozen=True)
class Settings:
    """The session's resolved options (marker settings come on top per test)."""

    values: Mapping[str, Any]
    rootdir: Path
    given: tuple[str, ...] = ()  # options given on the command line, repeated by re-run hints

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        inherited = worker_settings()
        if inherited is not None:  # a worker process: exactly the controller's settings, measured in-process
            return cls({**{o.name: o.default for o in OPTIONS}, **inherited}, Path(config.rootpath))
        values = {o.name: o.value(config) for o in OPTIONS}
        # Directories: from the command line or environment relative to where pytest was invoked,
        # from the ini file relative to that file (as pytest's own "paths" ini type does).
        config_dir = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
        for name in ("report_dir", "baseline_dir", "cache_dir", "json"):
            if values[name] is None:
                continue
            base = config_dir if OPTIONS_BY_NAME[name].source(config) == "ini" else config.invocation_params.dir
            values[name] = str((Path(base) / Path(values[name]).expanduser()).resolve())
        if values["baseline_dir"] is None:
            values["baseline_dir"] = str(config_dir / "baselines")
        if values["report_dir"] == "reports" and OPTIONS_BY_NAME["report_dir"].source(config) is None:
            values["report_dir"] = str(config_dir / "reports")
        values["instructions"] = values["instructions"] or values["instructions_only"]
        given = tuple(o.name for o in OPTIONS if o.source(config) == "cli")
        return cls(values, Path(config.rootpath), given)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def resolved(self, **values: Any) -> Settings:
        """These settings with values decided by the session (an `auto` resolved for the target)."""
        return replace(self, values={**self.values, **values})

    def for_test(self, marker_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Per-test settings: the marker's keywords over the session's values."""
        merged = {name: self.values[name] for name in PER_TEST if name in self.values}
        # A per-metric rtol in the marker ({"prefill_ms": 0.1}) falls back to the session's rtol for the rest.
        merged["default_rtol"] = self.values["rtol"]
        merged.update(marker_kwargs)
        return merged
