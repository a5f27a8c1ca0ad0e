"""pytest-llmperf's hooks. Thin: the work happens in the session, runner, judge and report modules."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest

from .report import markdown as report
from .report import accumulate, dashboards, mermaid, terminal, verdict_table
from .report import html as html_report
from .measure.allocator import steady_malloc
from .judge.baselines import now_iso
from .orchestrate.fixtures import SESSION_KEY, llmperf, llmperf_hf  # noqa: F401  (fixtures)
from .offload.fixture import llmperf_offload  # noqa: F401
from .servers.fixtures import (llmperf_jetstream, llmperf_openai, llmperf_servers, llmperf_tgi,  # noqa: F401
                               llmperf_vllm)
from .orchestrate.options import Settings, add_options
from .judged import failing, failing_line, judged_line
from .measure.scenario import MARKER_HELP, ScenarioError, build_scenario, check_marker_kwargs
from .orchestrate.judging import PytestLLMPerfWarning
from .orchestrate.session import LLMPerfSession, marker_devices
from .orchestrate.controller import ProcessController, check_settings
from .orchestrate.worker import WorkerRecorder, worker_out
from _pytest.skipping import evaluate_skip_marks  # the controller skips what pytest would skip, the same way
from .orchestrate.hygiene import BaselineHygiene

INVALID_MARKER_KEY = pytest.StashKey[str]()
# Hooks of the exports (pytest-benchmark's records, JUnit properties) live in their own module.
pytest_plugins = ("pytest_llmperf.orchestrate.export_hooks",)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    llm = config.stash[SESSION_KEY] = LLMPerfSession(Settings.from_config(config))
    out = worker_out()
    if out is not None:  # a worker process: measure, and report to the controller
        llm.recorder = WorkerRecorder(out)
        config.pluginmanager.register(llm.recorder, "llmperf-worker")
    elif (not hasattr(config, "workerinput") and config.getoption("dist", "no") == "no"
          and (llm.settings["compare"] or llm.processes > 1)):  # under xdist, llmperf tests are refused instead
        check_settings(llm)
        config.pluginmanager.register(ProcessController(config, llm, _is_planned), "llmperf-controller")
    if out is None:
        config.pluginmanager.register(BaselineHygiene(config, llm), "llmperf-baselines")


def pytest_unconfigure(config: pytest.Config) -> None:
    llm = config.stash.get(SESSION_KEY, None)
    if llm is not None and llm.recorder is not None:
        llm.recorder.close()
    config.stash.__delitem__(SESSION_KEY) if SESSION_KEY in config.stash else None


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash[SESSION_KEY]
    s = session.settings
    return [
        f"llmperf: device={session.device} ({'given' if session.device_given else 'detected'}), mode={session.mode}, "
        f"runs={s['runs']}, warmups={s['warmups']}, max_runs={s['max_runs']}, alpha={s['alpha']}, rtol={s['rtol']}, "
        f"malloc={s['malloc']}, threads={session.threads_text()}, fail_on={','.join(s['fail_on']) or 'none'}",
        f"llmperf: {_measured_how(session)}",
        f"llmperf: baselines={session.store.directory}, reports={s['report_dir']}",
    ]


def _measured_how(session: LLMPerfSession) -> str:
    if session.recorder is not None:
        return "a worker process of the controlling pytest process"
    auto = " (auto for this target)" if session.settings["processes"] == "auto" else ""
    where = (f"the working tree against {session.settings['compare']} (A/B, alternating)"
             if session.settings["compare"] else "against the stored baselines")
    if session.processes == 1 and not session.settings["compare"]:
        return f"processes=1{auto}: in this pytest process, the gate tests runs " + where
    return (f"processes={session.processes}{auto} per side (worker processes; the gate tests their medians), "
            f"max_processes={session.settings['max_processes'] or 2 * session.processes}, {where}")


def _is_llmperf(item: pytest.Item) -> bool:
    return item.get_closest_marker("llmperf") is not None or "llmperf" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = config.stash[SESSION_KEY]
    selected = [item for item in items if _is_llmperf(item)]
    session.selected = len(selected)
    on_xdist_worker = hasattr(config, "workerinput")
    if selected and not on_xdist_worker:  # before any fixture loads a model
        session.malloc = steady_malloc() if session.settings["malloc"] == "steady" else "system (--llmperf-malloc)"
    for item in selected:
        if on_xdist_worker:  # refuse: timed tests must not run side by side with other tests
            item.stash[INVALID_MARKER_KEY] = (
                "timed benchmark tests must not run under pytest-xdist (side by side they measure each other). "
                "Run them without -n (pytest -p no:xdist, or -n 0), or deselect them with -m 'not llmperf'")
            continue
        marker = item.get_closest_marker("llmperf")
        if marker is not None:
            try:  # also the marker's runs against alpha, with the session's options underneath
                kwargs = check_marker_kwargs(marker.args, marker.kwargs)
                build_scenario({k: v for k, v in session.settings.for_test(kwargs).items() if k != "devices"},
                               check_runs=session.runs_are_the_unit and not kwargs.get("processes", 1) > 1)
            except ScenarioError as exc:
                item.stash[INVALID_MARKER_KEY] = str(exc)
                continue
        devices = marker_devices(item)
        if devices is not None and session.device not in devices:
            item.add_marker(pytest.mark.skip(
                reason=f"llmperf: runs on {', '.join(devices)}; the current device is {session.device}"))


def _is_planned(item: pytest.Item) -> bool:
    """A benchmark test the controller measures in worker processes (not one that is skipped or invalid)."""
    if not _is_llmperf(item) or INVALID_MARKER_KEY in item.stash:
        return False
    return evaluate_skip_marks(item) is None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if INVALID_MARKER_KEY in item.stash:
        pytest.fail(f"{item.nodeid}: {item.stash[INVALID_MARKER_KEY]}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or not session.outcomes:
        return
    terminalreporter.write_sep("=", f"llmperf: {session.device}")
    line, colour = judged_line(session.outcomes)  # first: a run that judged nothing must say so
    terminalreporter.write_line(line, **{colour: True, "bold": colour != "green"})
    failed = failing(session.outcomes, session.settings["fail_on"])
    if failed:
        terminalreporter.write_line(failing_line(failed, session.settings["fail_on"]), red=True, bold=True)
    for line in terminal.summary_lines(session):
        terminalreporter.write_line(line)
    for path in getattr(session, "written", []):
        terminalreporter.write_line(f"report: {path}")
    for line in getattr(session, "report_errors", []):
        terminalreporter.write_line(line, red=True)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    llm = session.config.stash.get(SESSION_KEY, None)
    # An outcome listed in --llmperf-fail-on fails its test; should a test have swallowed that failure, the
    # session still exits non-zero (the pytest-cov way: set the status here, never raise from the summary).
    if llm is not None and session.exitstatus == pytest.ExitCode.OK and failing(llm.outcomes, llm.settings["fail_on"]):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if llm is None or not llm.outcomes or hasattr(session.config, "workerinput") or llm.recorder is not None:
        return
    created = now_iso()
    results = [o.result for o in llm.outcomes]
    counts_line = terminal.counts_line(llm.counts())
    report_dir = Path(llm.settings["report_dir"])
    session_doc = report.json_document(llm.device, created, llm.fingerprint, llm.settings.values, results,
                                       llm.outcomes, llm.counts())
    written = [report_dir / f"{llm.device}.md", report_dir / f"{llm.device}.json"]
    # A report that cannot be written is one clear line after the verdicts (never a traceback hiding them),
    # and fails a session that would otherwise pass.
    llm.written, llm.report_errors = [], []
    doc, warning = accumulate.update_report(written[1], session_doc)  # every benchmark measured on the device
    if warning:
        warnings.warn(PytestLLMPerfWarning(f"llmperf report: {warning}"), stacklevel=1)
    try:
        report.write_atomic(written[0], report.markdown(doc, counts_line))
        report.write_json(written[1], doc)
        llm.written += written
    except OSError as exc:
        llm.report_errors.append(f"llmperf: cannot write the report under {report_dir}: {exc}. "
                                 "Make it writable or set --llmperf-report-dir")
    if llm.settings["json"]:
        try:
            report.write_json(Path(llm.settings["json"]), doc)
            llm.written.append(Path(llm.settings["json"]))
        except OSError as exc:
            llm.report_errors.append(f"llmperf: cannot write --llmperf-json={llm.settings['json']}: {exc}. "
                                     "Give a writable file path")
    dashboards.write_session_exports(llm, report_dir, session_doc)  # --llmperf-export
    if not llm.report_errors:
        try:
            llm.written.append(html_report.write_session_index(report_dir))  # the path, or why it was skipped
        except OSError as exc:
            llm.report_errors.append(f"llmperf: cannot write {report_dir / 'index.html'}: {exc}")
    if llm.report_errors and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        try:
            with open(summary_path, "a", encoding="utf-8") as handle:
                table = verdict_table.markdown_table(session_doc, with_measured=False)
                handle.write(f"## llmperf: {llm.device}\n\n{counts_line}\n\n{table}\n\n")
                handle.write(mermaid.throughput_charts(doc))
        except OSError as exc:
            llm.report_errors.append(f"llmperf: warning: cannot append the summary to GITHUB_STEP_SUMMARY="
                                     f"{summary_path}: {exc}; the reports above are complete")
