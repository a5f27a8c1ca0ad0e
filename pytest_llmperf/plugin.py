"""pytest-llmperf's entry point: its options, and in `pytest_configure` the one decision of which plugin objects
this pytest process needs. Light to import (pytest loads this module in every run); heavy libraries load when a
benchmark runs.

- A side's collection for its controller (LLMPERF_COLLECT_OUT): what it collects, and what fails to.
- A worker process (its controller set LLMPERF_WORKER_OUT): the benchmark tests (orchestrate/items.py) and the
  `WorkerRecorder`, which hands what they measure to the controller (orchestrate/worker.py).
- A pytest-xdist worker: the benchmark tests, each refused (side by side they would measure each other).
- Otherwise, the controlling process: the benchmark tests; the `ProcessController` where they are measured in
  worker processes or A/B (orchestrate/controller.py), else they measure and judge themselves in this process
  (orchestrate/benchmark.py); the session's end (orchestrate/session_end.py: exit status, reports, summary,
  exports, and the baselines' hygiene).

The session (orchestrate/session.py) holds the resolved settings and every outcome, under config.stash.
"""

from __future__ import annotations

import pytest

from .measure.keywords import MARKER_HELP
from .offload.fixture import llmperf_offload
from .orchestrate.fixtures import llmperf, llmperf_hf
from .orchestrate.items import XDIST_REFUSAL, BenchmarkItems, is_planned
from .orchestrate.options import Settings, add_options, refuse_expert_flags
from .orchestrate.session import SESSION_KEY, LLMPerfSession, check_output_paths
from .orchestrate.worker import CollectRecorder, WorkerRecorder, collect_out, worker_out
from .servers.fixtures import (
    llmperf_jetstream,
    llmperf_openai,
    llmperf_servers,
    llmperf_tgi,
    llmperf_vllm,
)

#: The names this plugin registers its objects under (pytest_unconfigure takes them out again).
PLUGINS = (
    "llmperf-collector",
    "llmperf-tests",
    "llmperf-worker",
    "llmperf-controller",
    "llmperf-end",
    "llmperf-exports",
    "llmperf-baselines",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    refuse_expert_flags(args)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    settings = Settings.from_config(config)
    check_output_paths(settings)
    perf_session = config.stash[SESSION_KEY] = LLMPerfSession(settings)
    for name, plugin in plugins_for(config, perf_session):
        config.pluginmanager.register(plugin, name)


def plugins_for(config: pytest.Config, perf_session: LLMPerfSession) -> list[tuple[str, object]]:
    """The plugin objects of this pytest process's mode, decided once."""
    collecting = collect_out()
    if collecting is not None:  # a side's collection for a controller: what it has, and what failed
        return [("llmperf-collector", CollectRecorder(collecting))]
    out = worker_out()
    if out is not None:  # a worker process: measure, and report to the controller
        perf_session.recorder = WorkerRecorder(out)
        return [("llmperf-tests", BenchmarkItems(perf_session)), ("llmperf-worker", perf_session.recorder)]
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        return [("llmperf-tests", BenchmarkItems(perf_session, refusal=XDIST_REFUSAL))]
    from .orchestrate.session_end import BaselineHygiene, Exports, SessionEnd

    plugins: list[tuple[str, object]] = [("llmperf-tests", BenchmarkItems(perf_session))]
    # under xdist's controller the workers refuse the benchmark tests instead
    if config.getoption("dist", "no") == "no" and (perf_session.settings.compare or perf_session.processes > 1):
        from .orchestrate.controller import ProcessController

        plugins.append(("llmperf-controller", ProcessController(config, perf_session, is_planned)))
    if perf_session.settings.instructions:
        from .orchestrate.counting import check_setup

        check_setup(perf_session)
    plugins += [
        ("llmperf-end", SessionEnd(perf_session)),
        ("llmperf-exports", Exports(perf_session, config)),
        ("llmperf-baselines", BaselineHygiene(config, perf_session)),
    ]
    return plugins


def pytest_unconfigure(config: pytest.Config) -> None:
    for name in PLUGINS:
        plugin = config.pluginmanager.get_plugin(name)
        if plugin is not None:
            config.pluginmanager.unregister(plugin, name)
            if isinstance(plugin, (WorkerRecorder, CollectRecorder)):
                plugin.close()
    if SESSION_KEY in config.stash:
        del config.stash[SESSION_KEY]


def pytest_report_header(config: pytest.Config) -> list[str]:
    from .orchestrate.session import header_lines

    return header_lines(config.stash[SESSION_KEY])


__all__ = [  # the fixtures, registered by being imported here
    "llmperf",
    "llmperf_hf",
    "llmperf_jetstream",
    "llmperf_offload",
    "llmperf_openai",
    "llmperf_servers",
    "llmperf_tgi",
    "llmperf_vllm",
]
