"""The option groups beside the core (options.py): servers and the offload engine, each A/B side's environment, the
history across jobs. Each is a frozen dataclass of `option(...)` fields; Settings inherits them all."""

from __future__ import annotations

from dataclasses import dataclass

from ..history import settings as history_values
from . import option_values as parsers
from .option_sources import option


@dataclass(frozen=True)
class ServerOptions:
    # Servers (pytest_llmperf/servers/fixtures.py): attach to a running server instead of starting one.
    tgi_url: str | None = option(
        "Attach llmperf_tgi to this running TGI server instead of starting one, e.g. http://127.0.0.1:8080",
        parsers.url,
        metavar="URL",
    )
    tgi_launcher: str = option(
        "The text-generation-launcher program llmperf_tgi starts (default: from PATH)",
        parsers.as_string,
        default="text-generation-launcher",
        metavar="PATH",
    )
    openai_url: str | None = option(
        "Attach llmperf_openai and llmperf_vllm to this running OpenAI-compatible server (base URL, without /v1)",
        parsers.url,
        metavar="URL",
    )
    vllm_python: str | None = option(
        "The Python interpreter (of vLLM's own environment) llmperf_vllm starts vLLM with (default: this one)",
        parsers.as_string,
        metavar="PATH",
    )
    jetstream_url: str | None = option(
        "Attach llmperf_jetstream to this running JetStream server, host:port", parsers.as_string, metavar="HOST:PORT"
    )
    server_timeout: float = option(
        "Seconds a started server may take to become healthy (default: 600)",
        parsers.positive_float,
        default=600.0,
        ini_type="string",
        metavar="S",
    )
    # The offload engine (llmperf_offload); its fixture's keyword arguments take precedence.
    offload_expert_budget_gb: float | None = option(
        "Offload engine: most GiB of experts kept on the fast device (default: as many as fit after the reserve)",
        parsers.non_negative_float,
        metavar="GB",
    )
    offload_device_memory_gb: float | None = option(
        "Offload engine: size the budget as if the fast device had this many GiB, "
        "e.g. 24 to emulate an RTX 3090 (default: its real free memory)",
        parsers.non_negative_float,
        metavar="GB",
    )
    offload_popularity: str | None = option(
        "Offload engine: expert popularity profile (JSON written by "
        "OffloadEngine.calibrate) that ranks experts for the fast device (default: round robin across layers)",
        parsers.as_string,
        metavar="PATH",
    )


@dataclass(frozen=True)
class EnvironmentOptions:
    # Each side's dependencies in an A/B comparison (pytest_llmperf/environments/, docs/environments.md).
    compare_deps: str = option(
        "A/B: each side's environment. auto: built by uv from that side's own lock or requirements when the sides' "
        "dependency files differ by their bytes, then compared by what the two hold (the same: this one shared); "
        "build: always built, each side its own (the A/A check of the machinery); code-only: both sides run this "
        "environment and the report names the dependency files that differ as not measured (default: auto)",
        parsers.compare_deps,
        default="auto",
        metavar="auto|build|code-only",
    )
    base_python: str | None = option(
        "A/B: run the base side (the compared ref) with this interpreter, prepared with its dependencies (conda, a "
        "container), instead of building its environment; uv checks it against the base side's dependency files, "
        "and the working tree's side runs in this environment, checked against its own",
        parsers.as_string,
        metavar="PATH",
    )
    env_dir: str | None = option(
        "A/B: where the sides' built environments are cached, one directory per key "
        "(default: $XDG_CACHE_HOME/pytest-llmperf/envs)",
        parsers.as_string,
        metavar="DIR",
    )
    env_extras: tuple[str, ...] = option(
        "A/B: the project's extras to install in each side's built environment (pyproject.toml's "
        "[project.optional-dependencies], built from uv.lock or with the requirements); as uv's --extra",
        parsers.name_list,
        default=(),
        ini_type="linelist",
        repeatable=True,
        metavar="NAME",
    )
    env_groups: tuple[str, ...] = option(
        "A/B: dependency groups to install in each side's built environment, beyond uv's defaults (pyproject.toml's "
        "[dependency-groups]); as uv's --group",
        parsers.name_list,
        default=(),
        ini_type="linelist",
        repeatable=True,
        metavar="NAME",
    )
    compare_deps_paths: tuple[str, ...] = option(
        "A/B: more files that define a side's environment, paths or globs relative to the rootdir, beside "
        "requirements*.txt, constraints*.txt, pyproject.toml, uv.lock, pylock.toml, uv.toml, .python-version and "
        "the local wheels and directories they name",
        parsers.path_list,
        default=(),
        ini_type="linelist",
        repeatable=True,
        metavar="PATH",
    )


@dataclass(frozen=True)
class HistoryOptions:
    # The history of every job's results (pytest_llmperf/history/, docs/history.md).
    history: str = option(
        "Where every job's results are kept for change-point detection across jobs: a SQLite file (a path, or "
        "sqlite:///PATH; relative to the rootdir), a postgresql:// URL (the postgres extra; better from the "
        "environment, a CI secret), or off (default: .llmperf/history.sqlite)",
        history_values.store_location,
        default=history_values.DEFAULT_STORE,
        metavar="PATH|URL|off",
    )
    history_check: str = option(
        "What the history does at the end of a job: report (analyse the series the job measured, list changes in the "
        "reports), fail (also fail the session on a confirmed, unmarked regression of at least "
        "--llmperf-history-min-effect that is still in effect, or a store that cannot be written), off (append only) "
        "(default: report)",
        history_values.check_mode,
        default="report",
        metavar="report|fail|off",
    )
    history_min_effect: float = option(
        "The smallest change of a series that matters, relative: a confirmed regression this large fails with "
        "--llmperf-history-check=fail, creep of half of it is flagged, and a series noisier than it is warned about "
        "(default: 0.05)",
        parsers.non_negative_float,
        default=0.05,
        metavar="R",
    )
    history_anchor: str | None = option(
        "The git ref creep is measured from, e.g. the last release tag (default: the oldest commit analysed)",
        parsers.as_string,
        metavar="REF",
    )
    history_branch: str | None = option(
        "The default branch, whose first-parent commits make a series (default: origin's HEAD, else main or master)",
        parsers.as_string,
        metavar="NAME",
    )
    history_rows: bool = option(
        "Also write the job's rows to history-rows.jsonl in the report directory, for `pytest-llmperf history "
        "import` where the job has no database (default: true)",
        parsers.boolean,
        default=True,
        metavar="true|false",
    )
