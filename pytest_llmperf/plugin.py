"""pytest-llmperf's hooks: thin, and light to import (pytest loads this module in every run).

The session (orchestrate/session.py) holds the state; the fixture object (orchestrate/benchmark.py) measures
and judges in this process; the controller (orchestrate/controller.py) does both with worker processes; the
report package writes what was judged (report/session_report.py). Heavy libraries load when a benchmark runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from .measure.scenario import MARKER_HELP, ScenarioError
from .offload.fixture import llmperf_offload
from .orchestrate.fixtures import llmperf, llmperf_hf
from .orchestrate.markers import marker_kwargs
from .orchestrate.options import Settings, add_options
from .orchestrate.session import MEASURED_KEY, SESSION_KEY, LLMPerfSession, check_output_paths, marker_devices
from .orchestrate.worker import WorkerRecorder, worker_out
from .servers.fixtures import (
    llmperf_jetstream,
    llmperf_openai,
    llmperf_servers,
    llmperf_tgi,
    llmperf_vllm,
)
from .warning import PytestLLMPerfWarning

INVALID_MARKER_KEY = pytest.StashKey[str]()
OTHER_DEVICES_KEY = pytest.StashKey[bool]()  # skipped: its marker's devices do not include this one
# Hooks of the exports (pytest-benchmark's records, JUnit properties) live in their own module.
pytest_plugins = ("pytest_llmperf.orchestrate.export_hooks",)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    settings = Settings.from_config(config)
    check_output_paths(settings)
    llm = config.stash[SESSION_KEY] = LLMPerfSession(settings)
    out = worker_out()
    if out is not None:  # a worker process: measure, and report to the controller
        llm.recorder = WorkerRecorder(out)
        config.pluginmanager.register(llm.recorder, "llmperf-worker")
        return
    if (
        not hasattr(config, "workerinput")
        and config.getoption("dist", "no") == "no"
        and (settings["compare"] or llm.processes > 1)
    ):  # under xdist, llmperf tests are refused instead
        from .orchestrate.controller import ProcessController

        config.pluginmanager.register(ProcessController(config, llm, _is_planned), "llmperf-controller")
    if settings["instructions"]:
        from .orchestrate.counting import check_setup

        check_setup(llm)
    from .orchestrate.hygiene import BaselineHygiene

    config.pluginmanager.register(BaselineHygiene(config, llm), "llmperf-baselines")


def pytest_unconfigure(config: pytest.Config) -> None:
    llm = config.stash.get(SESSION_KEY, None)
    if llm is not None and llm.recorder is not None:
        llm.recorder.close()
    if SESSION_KEY in config.stash:
        del config.stash[SESSION_KEY]


def pytest_report_header(config: pytest.Config) -> list[str]:
    from .report.header import header_lines

    return header_lines(config.stash[SESSION_KEY])


def _is_llmperf(item: pytest.Item) -> bool:
    return item.get_closest_marker("llmperf") is not None or "llmperf" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = config.stash[SESSION_KEY]
    selected = [item for item in items if _is_llmperf(item)]
    session.selected = len(selected)
    on_xdist_worker = hasattr(config, "workerinput")
    if selected and not on_xdist_worker:  # before any fixture loads a model
        from .measure.allocator import steady_malloc

        session.malloc = steady_malloc() if session.settings["malloc"] == "steady" else "system (--llmperf-malloc)"
    for item in selected:
        if on_xdist_worker:  # refuse: timed tests must not run side by side with other tests
            item.stash[INVALID_MARKER_KEY] = (
                "timed benchmark tests must not run under pytest-xdist (side by side they measure each other). "
                "Run them without -n (pytest -p no:xdist, or -n 0), or deselect them with -m 'not llmperf'"
            )
            continue
        problem = _marker_problem(session, item)
        if problem is not None:
            item.stash[INVALID_MARKER_KEY] = problem
            session.invalid_here += 1
            continue
        wanted = marker_kwargs(item).get("processes")
        if wanted not in (None, 1) and session.in_process:  # the option wins here: say so, not in silence
            item.warn(
                PytestLLMPerfWarning(
                    f"llmperf: the marker's processes={wanted} is not used: --llmperf-processes=1 measures every "
                    "benchmark in this pytest process (its runs are the gate's units)"
                )
            )
        devices = marker_devices(item)
        if devices is not None and session.device not in devices:
            session.skipped_here += 1
            item.stash[OTHER_DEVICES_KEY] = True
            item.add_marker(
                pytest.mark.skip(
                    reason=f"llmperf: runs on {', '.join(devices)}; the current device is {session.device}"
                )
            )


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Count the benchmarks this session runs once -k, -m and the like have deselected theirs (the counts above saw
    every collected test: `pytest -m 'not llmperf'` failed as a session that judged nothing)."""
    llm = session.config.stash.get(SESSION_KEY, None)
    if llm is None or hasattr(session.config, "workerinput"):
        return
    final = [item for item in session.items if _is_llmperf(item) or getattr(item, "measured_elsewhere", False)]
    llm.selected = len(final)
    llm.invalid_here = sum(INVALID_MARKER_KEY in item.stash for item in final)
    llm.skipped_here = sum(OTHER_DEVICES_KEY in item.stash for item in final)


def _marker_problem(session: LLMPerfSession, item: pytest.Item) -> str | None:
    """Why a test's llmperf marker cannot work (a bad keyword, a schedule that could never fail), or None."""
    from .orchestrate.checks import check_test_settings

    try:
        check_test_settings(session, item, marker_kwargs(item))
    except ScenarioError as exc:
        return str(exc)
    return None


def _runs_tests(config: pytest.Config) -> bool:
    """The session runs test bodies (not --collect-only, --setup-only or --setup-plan)."""
    option = config.option
    return not (option.collectonly or getattr(option, "setuponly", False) or getattr(option, "setupplan", False))


def _is_planned(item: pytest.Item) -> bool:
    """A benchmark test the controller measures in worker processes (not one that is skipped or invalid)."""
    from _pytest.skipping import evaluate_skip_marks  # the controller skips what pytest would skip, the same way

    if not _is_llmperf(item) or INVALID_MARKER_KEY in item.stash:
        return False
    return evaluate_skip_marks(item) is None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if INVALID_MARKER_KEY in item.stash:
        pytest.fail(f"{item.nodeid}: {item.stash[INVALID_MARKER_KEY]}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A benchmark test that passed without calling llmperf.measure() measured and judged nothing: it fails."""
    report = yield
    if (
        call.when == "call"
        and report.passed
        and _is_llmperf(item)
        and MEASURED_KEY not in item.stash
        and not getattr(item, "measured_elsewhere", False)
    ):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: an llmperf benchmark test (its llmperf marker or fixture) that never "
            "called llmperf.measure(backend): nothing was measured or judged. Call it in the test, or "
            "drop the marker and the fixture"
        )
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or session.recorder is not None or not (session.outcomes or session.selected):
        return
    if (exitstatus == pytest.ExitCode.USAGE_ERROR or not _runs_tests(config)) and not session.outcomes:
        return  # refused before anything ran, or --collect-only: nothing was to be judged
    from .report.terminal import write_summary

    write_summary(terminalreporter, session)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    llm = session.config.stash.get(SESSION_KEY, None)
    if llm is None or hasattr(session.config, "workerinput") or llm.recorder is not None:
        return
    if not (llm.outcomes or llm.selected):
        return  # no benchmark in this session: nothing to fail or write, and no statistics to import
    from .report.session_report import write_reports
    from .report.terminal import session_fails

    # A kind listed in --llmperf-fail-on fails its test; should a test have swallowed that failure, or nothing
    # have been judged at all, the session still exits non-zero (the pytest-cov way: set the status here).
    if session.exitstatus == pytest.ExitCode.OK and _runs_tests(session.config) and session_fails(llm):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if llm.outcomes:
        if _append_history(llm) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        write_reports(llm)
        if llm.report_errors and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR


def _append_history(llm: LLMPerfSession) -> bool:
    """The job's rows into the history store and its rows file, and the analysis the reports show (written before
    them, so the HTML and markdown reports include it); True when the history fails the session."""
    from pathlib import Path

    from .history.job import append_job
    from .history.rows import Job
    from .judge.baselines import now_iso

    settings = llm.settings
    job = Job(
        llm.device,
        llm.fingerprint,
        settings.rootdir,
        llm.machine,
        settings["compare"] if llm.compared_to else None,
        settings["history_branch"],
        now_iso(),
    )
    done = append_job(
        llm.outcomes,
        job,
        store=settings["history"],
        report_dir=Path(settings["report_dir"]),
        rows_file=settings["history_rows"],
        check=settings["history_check"],
        min_effect=settings["history_min_effect"],
        anchor=settings["history_anchor"],
    )
    llm.written += done.written
    llm.report_warnings += done.lines
    llm.report_errors += done.errors
    return bool(done.errors)
