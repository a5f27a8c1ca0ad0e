"""What the controlling pytest process does at a session's end: fail the run where --llmperf-fail-on says so, write
the reports, show the summary, hand the results to other tools' formats (JUnit properties, pytest-benchmark's
records), and keep the baselines tidy. Plugin objects registered only in the controlling process (plugin.py), never
in a worker.

The report layer is given a typed `SessionSummary` and returns what it `Written`; whether the run fails is the
judge's (verdicts.run_failures).

Baseline hygiene (`BaselineHygiene`): entries of tests that no longer exist, and schema-1 entries an update dropped.
A baseline file keeps entries until something removes them, so a renamed or deleted test leaves its entry behind
forever. After a run this names, per baseline file of a module whose tests were all collected, the keys whose test
is gone; `--llmperf-update` over such a module with none of its tests deselected (`pytest benchmarks/test_x.py
--llmperf-update`) removes them. A partial selection (`file::test`, `-k`, `-m`) never prunes: the other tests were
not looked at.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from ..judge.baseline_layout import key_of_test, stale_keys
from ..judge.verdicts import run_failures
from ..report.summary import SessionSummary, Written
from ..warning import warn_at
from .items import runs_tests
from .session import LLMPerfSession


class SessionEnd:
    def __init__(self, perf_session: LLMPerfSession) -> None:
        self.perf_session = perf_session
        self.written = Written()
        self.ended: SessionSummary | None = None  # filled once, when the session ends (its summary shows it)

    def summary(self) -> SessionSummary:
        perf_session, settings = self.perf_session, self.perf_session.settings
        envs = perf_session.environments
        fingerprint = perf_session.fingerprint if perf_session.outcomes else {}
        if envs is not None:  # what each side ran, beside what this machine is
            fingerprint = {**fingerprint, "environments": envs.to_json()}
        return SessionSummary(
            device=perf_session.device,
            mode=perf_session.mode,
            outcomes=list(perf_session.outcomes),
            selected=perf_session.selected,
            skipped_here=perf_session.skipped_here,
            invalid_here=perf_session.invalid_here,
            fail_on=settings.fail_on,
            settings=settings.as_dict(),
            report_dir=perf_session.report_dir,
            json_path=perf_session.json_path,
            export=settings.export,
            fingerprint=fingerprint,
            compared_to=perf_session.compared_to,
            compared_commit=perf_session.compared_commit,
            processes_used=list(perf_session.processes_used),
            rerun=perf_session.rerun,
            environment_lines=envs.shown_lines(
                f"A {perf_session.compared_to}",
                "B the working tree",
                (perf_session.imported_anywhere or None) if envs.per_side else None,
            )
            if envs
            else [],
            changed_packages=[c.name for c in envs.changes] if envs and envs.per_side else [],
        )

    @property
    def benchmarked(self) -> bool:
        return bool(self.perf_session.outcomes or self.perf_session.selected)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.benchmarked:
            return  # no benchmark in this session: nothing to fail or write, and no statistics to import
        summary = self.ended = self.summary()
        # A kind listed in --llmperf-fail-on fails its test; should a test have swallowed that failure, or nothing
        # have been judged at all, the session still exits non-zero (the pytest-cov way: set the status here).
        failures = run_failures(summary.outcomes, summary.fail_on, gating=summary.gating, selected=summary.selected)
        if session.exitstatus == pytest.ExitCode.OK and runs_tests(session.config) and failures:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if summary.outcomes:
            from ..report.session_report import write_reports

            history = self._append_history()  # before the reports, which show its analysis
            if history.errors and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            self.written = write_reports(summary)
            self.written.paths[:0] = history.paths
            self.written.warnings += history.warnings
            self.written.errors += history.errors
            if self.written.errors and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.USAGE_ERROR

    def _append_history(self) -> Written:
        """The job's rows into the history store and its rows file, and the analysis the reports show
        (history/job.py); its errors fail the session (--llmperf-history-check=fail)."""
        from datetime import datetime, timezone

        from ..history.job import append_job
        from ..history.rows import Job

        perf_session, settings = self.perf_session, self.perf_session.settings
        compared = settings.compare if perf_session.compared_to else None
        # to the microsecond: the store lists runs by it, and two jobs can end within one second
        ended_at = datetime.now(timezone.utc).isoformat(timespec="microseconds")
        job = Job(
            perf_session.device,
            perf_session.fingerprint,
            settings.rootdir,
            perf_session.machine,
            compared,
            settings.history_branch,
            ended_at,
        )
        try:
            done = append_job(
                perf_session.outcomes,
                job,
                store=settings.history,
                report_dir=perf_session.report_dir,
                rows_file=settings.history_rows,
                check=settings.history_check,
                min_effect=settings.history_min_effect,
                anchor=settings.history_anchor,
            )
        except Exception as exc:  # a bug or a store's damaged row: the job's verdicts and reports still stand
            line = f"llmperf history: not appended or analysed ({type(exc).__name__}: {exc}); the verdicts stand"
            failed = settings.history_check == "fail"
            return Written(warnings=[] if failed else [line], errors=[line] if failed else [])
        return Written(list(done.written), warnings=list(done.lines), errors=list(done.errors))

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if not self.benchmarked:
            return
        if (exitstatus == pytest.ExitCode.USAGE_ERROR or not runs_tests(config)) and not self.perf_session.outcomes:
            return  # refused before anything ran, or --collect-only: nothing was to be judged
        from ..report.terminal import write_summary

        write_summary(terminalreporter, self.ended or self.summary(), self.written)


class Exports:
    """Our results in other tools' formats (the logic is report/exports.py's, imported when there are results)."""

    def __init__(self, perf_session: LLMPerfSession, config: pytest.Config) -> None:
        self.perf_session = perf_session
        # xunit2, pytest's default family, holds properties only on its <testsuite>: they wait for pytest's file
        path = junit_xml_path(config)
        self.junit_suite = path if path is not None and config.getini("junit_family") == "xunit2" else None
        self.suite_properties: list[tuple[str, str]] = []

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """This test's outcome, medians, ratios and verdicts (exports.junit_properties): with --junitxml in
        pytest's default family, xunit2, whose schema has no <testcase> properties, they are testsuite properties;
        otherwise the test's own user_properties (xunit1's <testcase> properties, pytest-reportlog). A test
        measured in worker processes gets the time of its timed runs as its duration."""
        outcomes = [o for o in self.perf_session.outcomes if o.result.nodeid == item.nodeid]
        if call.when == "call" and outcomes:
            from ..report import exports

            properties = exports.junit_properties(outcomes)
            if self.junit_suite is not None:
                self.suite_properties += properties
            else:
                item.user_properties.extend(properties)
        report = yield
        if call.when == "call" and outcomes:
            from ..report import exports

            report.duration = max(report.duration, exports.measured_seconds(outcomes))
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        """Before pytest-benchmark finishes (its own wrapper writes --benchmark-json, saves and compares): our
        results join its benchmarks, with its own statistics. After pytest wrote --junitxml: the testsuite
        properties join its file."""
        if (
            self.junit_suite is not None and self.perf_session.environments is not None
        ):  # also "DEPENDENCY CHANGES NOT MEASURED"
            self.suite_properties.append(("llmperf_environments", self.perf_session.environments.summary_line()))
        if self.perf_session.outcomes:
            from ..report import exports

            exports.add_to_pytest_benchmark(
                session.config, self.perf_session.device, [o.result for o in self.perf_session.outcomes]
            )
        result = yield
        if self.junit_suite is not None and self.suite_properties and self.junit_suite.exists():
            from ..report import exports

            try:
                exports.add_suite_properties(self.junit_suite, self.suite_properties)
            except (OSError, SyntaxError, ValueError) as exc:  # ElementTree's ParseError is a SyntaxError
                session.config.get_terminal_writer().line(
                    f"llmperf: the benchmarks' properties were not added to {self.junit_suite}: {exc}", red=True
                )
        return result


def junit_xml_path(config: pytest.Config) -> Path | None:
    """The JUnit XML file pytest writes in this process (`--junitxml`, resolved as pytest resolves it), or None: none
    asked for, or a pytest-xdist worker, which writes none."""
    path = config.getoption("xmlpath", None)
    if not path or hasattr(config, "workerinput"):
        return None
    return Path(os.path.normpath(os.path.abspath(os.path.expanduser(os.path.expandvars(path)))))


class BaselineHygiene:
    """Registered by plugin.py in the controlling process, with the session it reads: the store, the mode, the
    outcomes."""

    def __init__(self, config: pytest.Config, perf_session: LLMPerfSession) -> None:
        self.config = config
        self.perf_session = perf_session
        self.collected: dict[str, set[str]] = {}  # module -> keys of every test collected from it
        self.paths: dict[str, Path] = {}  # module -> its file
        self.deselected: set[str] = set()  # modules with a deselected test
        self.benchmarked: set[str] = set()  # modules with a selected llmperf test
        self.stale: dict[str, list[str]] = {}  # module -> stale keys (reported; pruned under --llmperf-update)

    def _active(self) -> bool:
        """The session benchmarked something (the store is read only then)."""
        return bool(self.benchmarked)

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        module = item.nodeid.split("::", 1)[0]
        self.collected.setdefault(module, set()).add(key_of_test(item.nodeid))
        self.paths[module] = Path(item.path)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected.update(item.nodeid.split("::", 1)[0] for item in items)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.benchmarked = {
            item.nodeid.split("::", 1)[0]
            for item in items
            if item.get_closest_marker("llmperf") is not None or "llmperf" in getattr(item, "fixturenames", ())
        }

    def _whole_modules(self) -> set[str]:
        """Modules that the command line collected whole (a file or directory argument, not `file::test`)."""
        base = Path(self.config.invocation_params.dir)
        roots = [(base / arg).resolve() for arg in self.config.args if "::" not in arg]
        return {
            m
            for m, path in self.paths.items()
            if any(path.resolve() == root or root in path.resolve().parents for root in roots)
        }

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self._active():
            return
        from ..judge.baselines import BaselineError

        store = self.perf_session.store
        for module in sorted(self.benchmarked & self._whole_modules()):
            try:
                stored = list(store.entries(module))
            except BaselineError:
                continue  # the tests of the module already report the file
            stale = stale_keys(stored, self.collected.get(module, set()))
            if not stale:
                continue
            if self.perf_session.mode == "update" and module not in self.deselected:
                try:
                    store.prune(module, stale)
                    continue
                except BaselineError as exc:
                    warn_at(f"llmperf: stale entries not pruned: {exc}", store.path_for(module))
            self.stale[module] = stale
        for path, module, keys in store.dropped_entries():
            warn_at(
                f"llmperf: baseline file {path} was rewritten as schema 3; the schema-1 entries of tests not "
                f"re-recorded in this run cannot be converted and were dropped: {', '.join(keys)}. Re-record them "
                f"with: {store.update_command(module)}",
                path,
            )

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self._active():
            return
        store = self.perf_session.store
        lines = [
            f"pruned stale baseline entries from {path} (their tests no longer exist): {', '.join(keys)}"
            for path, keys in sorted(store.pruned.items())
        ]
        lines += [
            f"removed {path}: a temporary file that an interrupted baseline write left (the file it was "
            "writing is whole)"
            for path in store.cleared
        ]
        lines += [
            f"stale baseline entries in {store.path_for(module)} (their tests no longer exist in {module}): "
            f"{', '.join(keys)}. Remove them with: {store.update_command(module)} (the whole module, "
            "no -k)"
            for module, keys in sorted(self.stale.items())
        ]
        if not lines:
            return
        if not self.perf_session.outcomes:
            terminalreporter.write_sep("=", f"llmperf: {self.perf_session.device}")
        for line in lines:
            terminalreporter.write_line(line)
