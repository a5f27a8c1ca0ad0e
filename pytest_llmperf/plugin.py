"""pytest-llmperf's hooks. Thin: the work happens in the session, runner, judge and report modules."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest

from .report import markdown as report
from .report import accumulate, terminal, verdict_table
from .measure.allocator import steady_malloc
from .judge.baselines import now_iso
from .fixtures import SESSION_KEY, llmperf, llmperf_hf  # noqa: F401  (fixtures)
from .offload.fixture import llmperf_offload  # noqa: F401
from .servers.fixtures import (llmperf_jetstream, llmperf_openai, llmperf_servers, llmperf_tgi,  # noqa: F401
                               llmperf_vllm)
from .options import Settings, add_options
from .measure.scenario import MARKER_HELP, ScenarioError, check_marker_kwargs
from .session import LLMPerfSession, PytestLLMPerfWarning, marker_devices

INVALID_MARKER_KEY = pytest.StashKey[str]()
# Hooks of the exports (pytest-benchmark's records, JUnit properties) live in their own module.
pytest_plugins = ("pytest_llmperf.report.export_hooks",)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    config.stash[SESSION_KEY] = LLMPerfSession(Settings.from_config(config))


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash.__delitem__(SESSION_KEY) if SESSION_KEY in config.stash else None


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash[SESSION_KEY]
    s = session.settings
    return [
        f"llmperf: device={session.device} ({'given' if session.device_given else 'detected'}), mode={session.mode}, "
        f"runs={s['runs']}, warmups={s['warmups']}, max_runs={s['max_runs']}, alpha={s['alpha']}, rtol={s['rtol']}, "
        f"malloc={s['malloc']}",
        f"llmperf: baselines={session.store.device_dir}, reports={s['report_dir']}",
    ]


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
            try:
                check_marker_kwargs(marker.args, marker.kwargs)
            except ScenarioError as exc:
                item.stash[INVALID_MARKER_KEY] = str(exc)
                continue
        devices = marker_devices(item)
        if devices is not None and session.device not in devices:
            item.add_marker(pytest.mark.skip(
                reason=f"llmperf: runs on {', '.join(devices)}; the current device is {session.device}"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if INVALID_MARKER_KEY in item.stash:
        pytest.fail(f"{item.nodeid}: {item.stash[INVALID_MARKER_KEY]}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or not session.outcomes:
        return
    terminalreporter.write_sep("=", f"llmperf: {session.device}")
    for line in terminal.summary_lines(session):
        terminalreporter.write_line(line)
    for path in getattr(session, "written", []):
        terminalreporter.write_line(f"report: {path}")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    llm = session.config.stash.get(SESSION_KEY, None)
    if llm is None or not llm.outcomes or hasattr(session.config, "workerinput"):
        return
    created = now_iso()
    results = [o.result for o in llm.outcomes]
    counts_line = terminal.counts_line(llm.counts())
    report_dir = Path(llm.settings["report_dir"])
    session_doc = report.json_document(llm.device, created, llm.fingerprint, llm.settings.values, results,
                                       llm.outcomes, llm.counts())
    written = [report_dir / f"{llm.device}.md", report_dir / f"{llm.device}.json"]
    doc, warning = accumulate.update_report(written[1], session_doc)  # every benchmark measured on the device
    if warning:
        warnings.warn(PytestLLMPerfWarning(f"llmperf report: {warning}"), stacklevel=1)
    try:
        report.write_atomic(written[0], report.markdown(doc, counts_line))
        report.write_json(written[1], doc)
        if llm.settings["json"]:
            written.append(Path(llm.settings["json"]))
            report.write_json(written[-1], doc)
    except OSError as exc:
        raise pytest.UsageError(f"llmperf: cannot write the report under {report_dir}: {exc}. "
                                "Make it writable or set --llmperf-report-dir") from None
    llm.written = written
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        with open(summary_path, "a", encoding="utf-8") as handle:
            table = verdict_table.markdown_table(session_doc, with_measured=False)
            handle.write(f"## llmperf: {llm.device}\n\n{counts_line}\n\n{table}\n\n")
