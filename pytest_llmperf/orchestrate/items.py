"""The benchmark tests of a session: which they are, which cannot run here and why, and the check that each one
measured something; its marker's settings checked at collection, before anything is measured
(`check_test_settings`). A plugin object, registered in every pytest process that runs tests (plugin.py): the
controlling one, a worker process, and a pytest-xdist worker, where every benchmark test is refused (side by side
they would measure each other).

A test's settings are its marker over the session's options: every keyword is checked by type and range
(measure/scenario.py); `processes` must be an integer >= 1; and a test measured in this process must be able to
fail: its runs' schedule (runs, doubling to max_runs) has to let a slowdown to twice its tolerance be called
regressed (judge/procedure.py). Worker schedules are checked by the controller (controller.py), which knows the
whole job's family of rows.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Generator, Mapping
from typing import Any

import pytest

from ..measure.keywords import build_scenario
from ..measure.scenario import ScenarioError
from ..warning import PytestLLMPerfWarning
from .options import marker_kwargs
from .session import MEASURED_KEY, LLMPerfSession, marker_devices

INVALID_MARKER_KEY = pytest.StashKey[str]()  # why this benchmark test cannot run (it fails at setup)
OTHER_DEVICES_KEY = pytest.StashKey[bool]()  # skipped: its marker's devices do not include this one
#: Why a pytest-xdist worker refuses every benchmark test.
XDIST_REFUSAL = (
    "timed benchmark tests must not run under pytest-xdist (side by side they measure each other). "
    "Run them without -n (pytest -p no:xdist, or -n 0), or deselect them with -m 'not llmperf'"
)

#: Gated rows per batch size when a marker does not name its metrics (prefill, decode, throughput).
DEFAULT_ROWS_PER_BATCH = 3


def is_llmperf(item: pytest.Item) -> bool:
    """A benchmark test: it has an llmperf marker or uses the llmperf fixture."""
    return item.get_closest_marker("llmperf") is not None or "llmperf" in getattr(item, "fixturenames", ())


def is_planned(item: pytest.Item) -> bool:
    """A benchmark test the controller measures in worker processes (not one that is skipped or invalid)."""
    return is_llmperf(item) and INVALID_MARKER_KEY not in item.stash and not skipped_by_marks(item)


def skipped_by_marks(item: pytest.Item) -> bool:
    """Whether its `skip` or `skipif` marks skip it, as pytest decides at setup (where it reports the skip): a string
    condition is evaluated with os, sys, platform, config, pytest_markeval_namespace and the test module's globals.
    A condition that cannot be evaluated counts as skipping: the test stays pytest's, whose setup reports the error."""
    if item.get_closest_marker("skip") is not None:
        return True
    for mark in item.iter_markers("skipif"):
        conditions = (mark.kwargs["condition"],) if "condition" in mark.kwargs else mark.args
        try:
            if not conditions or any(_holds(item, condition) for condition in conditions):
                return True
        except Exception:
            return True
    return False


def _holds(item: pytest.Item, condition: object) -> bool:
    if not isinstance(condition, str):
        return bool(condition)
    namespace: dict[str, object] = {"os": os, "sys": sys, "platform": platform, "config": item.config}
    for extra in reversed(item.ihook.pytest_markeval_namespace(config=item.config)):
        namespace.update(extra)
    namespace.update(getattr(getattr(item, "obj", None), "__globals__", {}))
    return bool(eval(compile(condition, f"<{item.nodeid} skipif condition>", "eval"), namespace))


def measured_elsewhere(item: pytest.Item) -> bool:
    """Its body ran in worker processes (controller.DeferredBenchmark)."""
    return bool(getattr(item, "measured_elsewhere", False))


class BenchmarkItems:
    """Counts, checks and marks the session's benchmark tests; `refusal`: every one of them fails with it."""

    def __init__(self, perf_session: LLMPerfSession, refusal: str | None = None) -> None:
        self.perf_session = perf_session
        self.refusal = refusal

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        perf_session = self.perf_session
        selected = [item for item in items if is_llmperf(item)]
        perf_session.selected = len(selected)
        if self.refusal is not None:
            for item in selected:
                item.stash[INVALID_MARKER_KEY] = self.refusal
            return
        if selected:  # before any fixture loads a model
            from ..measure.memory import steady_malloc

            perf_session.malloc = (
                steady_malloc() if perf_session.settings.malloc == "steady" else "system (llmperf_malloc)"
            )
        for item in selected:
            problem = self._marker_problem(item)
            if problem is not None:
                item.stash[INVALID_MARKER_KEY] = problem
                continue
            wanted = marker_kwargs(item).get("processes")
            if wanted not in (None, 1) and perf_session.in_process:  # the option wins here: say so, not in silence
                item.warn(
                    PytestLLMPerfWarning(
                        f"llmperf: the marker's processes={wanted} is not used: --llmperf-processes=1 measures every "
                        "benchmark in this pytest process (its runs are the gate's units)"
                    )
                )
            devices = marker_devices(item)
            if devices is not None and perf_session.device not in devices:
                item.stash[OTHER_DEVICES_KEY] = True
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"llmperf: runs on {', '.join(devices)}; the current device is {perf_session.device}"
                    )
                )

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Count the benchmarks this session runs once -k, -m and the like have deselected theirs (`pytest -m 'not
        llmperf'` must not fail as a session that judged nothing)."""
        final = [item for item in session.items if is_llmperf(item) or measured_elsewhere(item)]
        self.perf_session.selected = len(final)
        self.perf_session.invalid_here = sum(INVALID_MARKER_KEY in item.stash for item in final)
        self.perf_session.skipped_here = sum(OTHER_DEVICES_KEY in item.stash for item in final)

    def _marker_problem(self, item: pytest.Item) -> str | None:
        """Why a test's llmperf marker cannot work (a bad keyword, a schedule that could never fail), or None."""
        try:
            check_test_settings(self.perf_session, item, marker_kwargs(item))
        except ScenarioError as exc:
            return str(exc)
        return None

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if INVALID_MARKER_KEY in item.stash:
            pytest.fail(f"{item.nodeid}: {item.stash[INVALID_MARKER_KEY]}", pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """A benchmark test that passed without calling llmperf.measure() measured and judged nothing: it fails."""
        report = yield
        if (
            call.when == "call"
            and report.passed
            and is_llmperf(item)
            and MEASURED_KEY not in item.stash
            and not measured_elsewhere(item)
        ):
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid}: an llmperf benchmark test (its llmperf marker or fixture) that never "
                "called llmperf.measure(backend): nothing was measured or judged. Call it in the test, or "
                "drop the marker and the fixture"
            )
        return report


def runs_tests(config: pytest.Config) -> bool:
    """The session runs test bodies (not --collect-only, --setup-only or --setup-plan)."""
    option = config.option
    return not (option.collectonly or getattr(option, "setuponly", False) or getattr(option, "setupplan", False))


def check_test_settings(perf_session: LLMPerfSession, item: pytest.Item, kwargs: Mapping[str, Any]) -> None:
    """Raise ScenarioError naming the keyword and the fix when a test's settings cannot work."""
    processes = kwargs.get("processes")
    if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int) or processes < 1):
        raise ScenarioError(
            f"@pytest.mark.llmperf: processes={processes!r} is not valid: expected an integer >= 1 "
            "(worker processes per side at the first look); leave it out for --llmperf-processes"
        )
    settings = {k: v for k, v in perf_session.settings.for_test(kwargs).items() if k not in ("devices", "processes")}
    scenario = build_scenario(settings)
    if perf_session.in_process:
        load_judge()
    if not perf_session.in_process or perf_session.mode != "gate":
        return
    from ..judge.procedure import Schedule, SettingError, check_can_fail

    rows = len(scenario.batch_sizes) * len(scenario.metrics or range(DEFAULT_ROWS_PER_BATCH))
    schedule = Schedule.doubling(scenario.runs, scenario.max_runs, scenario.alpha, rows)
    try:
        check_can_fail(
            schedule,
            scenario.rtol,
            reference=scenario.runs,  # an update records the first look's runs
            what=f"runs={scenario.runs}, max_runs={scenario.max_runs}",
        )
    except SettingError as exc:
        raise ScenarioError(str(exc)) from None


def load_judge() -> None:
    """Import the judge (scipy.stats, some 60 MiB resident) before anything is measured in the process that judges,
    in every mode. peak_rss_mib is the measuring process's peak: the judge loaded up front for a gate (the schedule
    checks above) and not for the recording read as the backend's memory doubling on unchanged code (issue 39).
    Worker processes never load it (orchestrate/benchmark.py), whatever the mode, so theirs compare as they are."""
    from . import judging  # noqa: F401
