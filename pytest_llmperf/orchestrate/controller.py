"""Worker processes and A/B comparisons: the controlling pytest process (pyperf's manager).

With worker processes (`--llmperf-processes`, the default) or a comparison against a git ref
(`--llmperf-compare REF`), this pytest process does not run the benchmark tests itself, so no model is
loaded twice. Before the test loop it runs a *campaign* of worker processes that measures and judges them
(orchestrate/campaign.py). Each benchmark test is replaced in the test loop by a `DeferredBenchmark` item, whose
turn reports what was decided for it, with pytest's own protocol (setup, call, teardown, reports, JUnit).

At collection it refuses up front what cannot work (`check_settings`): an update against a ref, a schedule that
could never fail, given the whole job's family of rows (a test's own settings are items.py's).

The controller is registered in every session that may hold benchmarks, so it stays light: the campaign, and the
statistics it brings (numpy, scipy), are imported only when a benchmark test is due.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from .items import DEFAULT_ROWS_PER_BATCH
from .options import marker_kwargs
from .session import RECORD_FACTOR, LLMPerfSession

if TYPE_CHECKING:
    from .looks import Decision


class DeferredBenchmark(pytest.Item):
    """A benchmark test that worker processes measured: its turn in the test loop reports the decision."""

    measured_elsewhere = True  # its test body ran in the workers (items.py's check for a measure() call)

    def __init__(self, *, original: pytest.Item, controller: ProcessController, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.original = original
        self.controller = controller
        self.own_markers = list(original.own_markers)
        self.keywords.update(original.keywords)
        self.obj = getattr(original, "obj", None)  # skip and xfail conditions read the test module's globals
        self.user_properties = original.user_properties

    def runtest(self) -> None:
        __tracebackhide__ = True
        decision = self.controller.decisions.get(self.nodeid)
        if decision is None:
            pytest.fail("llmperf: this benchmark was not measured (the campaign stopped before it)", pytrace=False)
        decision.report(self)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.original.reportinfo()


class ProcessController:
    """Registered in pytest_configure when benchmarks are measured in worker processes."""

    def __init__(
        self, config: pytest.Config, perf_session: LLMPerfSession, is_planned: Callable[[pytest.Item], bool]
    ) -> None:
        self.config = config
        self.perf_session = perf_session
        self.is_planned = is_planned  # a benchmark test this controller measures (not skipped, not invalid)
        self.decisions: dict[str, Decision] = {}  # by node id, filled by the campaign

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        planned = [item for item in items if self.is_planned(item)]
        check_settings(self.perf_session, planned)
        for i, item in enumerate(items):
            if self.is_planned(item) and item.parent is not None:
                items[i] = DeferredBenchmark.from_parent(item.parent, name=item.name, original=item, controller=self)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        planned = [item for item in session.items if isinstance(item, DeferredBenchmark)]
        if planned and not session.config.option.collectonly:
            from .campaign import Campaign

            Campaign(self.config, self.perf_session, self.decisions).run([item.original for item in planned])
        return (yield)


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
