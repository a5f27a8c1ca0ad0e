"""Settings checked at collection, before anything is measured: a test's marker over the session's options.

Every keyword is checked by type and range (measure/scenario.py); `processes` must be an integer >= 1; and a
test measured in this process must be able to fail: its runs' schedule (runs, doubling to max_runs) has to
let a slowdown to twice its tolerance be called regressed (judge/procedure.py). Worker schedules are checked by
the controller, which knows the whole job's family of rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from ..measure.keywords import build_scenario
from ..measure.scenario import ScenarioError
from .options import marker_kwargs
from .session import RECORD_FACTOR, LLMPerfSession

#: Gated rows per batch size when a marker does not name its metrics (prefill, decode, throughput).
DEFAULT_ROWS_PER_BATCH = 3


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


def rows_expected(item: pytest.Item) -> int:
    """Gated rows a test will have, as its marker says (DEFAULT_ROWS_PER_BATCH unless it names its metrics)."""
    kwargs = marker_kwargs(item)
    return len(kwargs.get("batch_sizes") or [1]) * len(kwargs.get("metrics") or range(DEFAULT_ROWS_PER_BATCH))


def check_settings(perf_session: LLMPerfSession, items: list[pytest.Item]) -> None:
    """Refuse up front what cannot work: an update against a ref, a schedule that could never fail."""
    settings = perf_session.settings
    if settings.compare and (settings.update or settings.update_missing):
        raise pytest.UsageError(
            "llmperf: --llmperf-compare measures against a git ref and writes no baselines; "
            "drop --llmperf-update / --llmperf-update-missing"
        )
    cap = settings.max_processes
    if cap is not None and cap < perf_session.processes:  # the schedule would start above its cap, the header say both
        raise pytest.UsageError(
            f"llmperf: llmperf_max_processes={cap} is below --llmperf-processes={perf_session.processes}"
            f"{' (auto)' if settings.processes == 'auto' else ''}, the processes of the first look: raise "
            f"the ini key llmperf_max_processes to at least {perf_session.processes}, or lower --llmperf-processes"
        )
    if perf_session.mode != "gate" or not items:
        return
    from ..judge.procedure import SettingError, check_can_fail  # scipy.stats: loaded where a schedule is checked

    family = sum(rows_expected(item) for item in items)
    for item in items:
        first = perf_session.processes_for(item)
        if cap is not None and cap < first:
            raise pytest.UsageError(
                f"llmperf: {item.nodeid}: its marker's processes={first} is above llmperf_max_processes={cap}: "
                f"raise the ini key llmperf_max_processes to at least {first}, or lower the marker's processes"
            )
        what = (
            f"{item.nodeid}: marker processes={first}"
            if "processes" in marker_kwargs(item)
            else f"--llmperf-processes={first} (llmperf_max_processes={perf_session.max_processes})"
        )
        try:
            check_can_fail(
                perf_session.worker_schedule(first, settings.alpha, family),
                perf_session.rtol,
                reference=None if settings.compare else RECORD_FACTOR * first,
                what=what,
            )
        except SettingError as exc:
            raise pytest.UsageError(f"llmperf: {exc}") from None
