"""What the workers of a job measured, by side, and how a test is judged at a look of its schedule.

The campaign (campaign.py) runs the rounds; after each round it hands every test that reached a look to
`Measurements.judge_or_record`, which merges what every worker of a side measured so far per benchmark, finds the
reference (the A side of an A/B job, or the stored baseline) and judges the rows (judge/rows.py, through
judging.py). A test that failed or was skipped in a worker is not judged: `stopped` says what it reports.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from ..judge import procedure
from ..judge.procedure import Costs, Schedule
from ..judge.rows import Reference, judge_rows
from ..judge.verdicts import COMPARED, Outcome, Row, Verdict
from ..measure.metrics import metric_better
from ..measure.records import BenchmarkResult
from ..measure.scenario import Scenario
from ..warning import warn_at
from . import counting, judging
from .protocol import Side, WorkerRun
from .session import LLMPerfSession


@dataclass
class Decision:
    """What a deferred test reports: skipped, failed with a text, or passed; and the warnings it emits."""

    skip: str | None = None
    failure: str | None = None
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, perf_session: LLMPerfSession, outcomes: Sequence[Outcome]) -> Decision:
        """A test's decision from its benchmarks' outcomes, as --llmperf-fail-on says (judging.fail_messages)."""
        messages, said = [], []
        for outcome in outcomes:
            failing, warned = judging.fail_messages(perf_session, outcome)
            messages += failing
            said += warned
        return cls(failure="\n".join(messages) or None, warnings=said)

    def report(self, item: pytest.Item) -> None:
        """As the test: its warnings at the test's line, then skipped or failed (else it passes)."""
        __tracebackhide__ = True
        for text in self.warnings:
            warn_at(text, item.path, (item.location[1] or 0) + 1)
        if self.skip:
            pytest.skip(self.skip)
        if self.failure:
            pytest.fail(self.failure, pytrace=False)


@dataclass
class Plan:
    """One benchmark test's way through the campaign."""

    item: pytest.Item
    schedule: Schedule
    look: int = 0  # index into schedule.looks
    # a later look measures only these batch sizes, each taking this many runs (None: the scenario's) (None: all)
    batch_sizes: dict[int, int | None] | None = None
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # by benchmark key, as judged so far

    @property
    def units(self) -> int:
        return self.schedule.looks[self.look]

    @property
    def final(self) -> bool:
        return self.look + 1 >= len(self.schedule.looks)

    def advance(
        self,
        undecided: Sequence[int],
        costs: Costs,
        *,
        least: int,
        most: int,
        affordable: Callable[[Mapping[int, int]], int],
    ) -> None:
        """Move on to the next look for the `undecided` batch sizes: where its rows' spreads are known (A/B pairs
        with their runs), runs per process and the next look's processes are chosen from them and the costs
        (judge/procedure.py), the processes at most what the budget affords at those runs; else the schedule's
        next look."""
        rows = [r for o in self.outcomes.values() for r in o.rows if r.verdict == Verdict.UNDECIDED]
        needs = [need for r in rows if (need := _need(r, self.outcomes)) is not None]
        runs: dict[int, int | None] = {b: (self.batch_sizes or {}).get(b) for b in undecided}  # as they were
        if needs and len(needs) == len(rows) and self.schedule.shares and not self.schedule.interim(self.units):
            now = max((n for n in (self.batch_sizes or {}).values() if n), default=least)
            self.schedule, chosen = procedure.plan_next(
                needs, costs, self.schedule, look=self.look, runs_now=now, least=least, most=most, affordable=affordable
            )
            runs.update({b: n for b, n in chosen.items() if b in runs})
        self.look += 1
        self.batch_sizes = runs


def _need(row: Row, outcomes: Mapping[str, Outcome]) -> procedure.Need | None:
    """What the next look needs to decide an undecided row, where its spreads are known (log scale)."""
    if row.between_sd is None or row.se is None or row.ratio is None or row.ratio <= 0:
        return None
    outcome = next(o for o in outcomes.values() if row in o.rows)
    scenario = Scenario.from_json(outcome.result.scenario)
    margin = math.log1p(scenario.rtol_for(row.metric))
    bad = math.log(row.ratio) * (1 if metric_better(row.metric, outcome.result.counters_better) == "lower" else -1)
    within = row.within_sd if row.within_sd is not None else math.nan
    return procedure.Need(row.batch_size, row.between_sd, within, abs(margin - bad), margin, row.se)


@dataclass
class Measurements:
    """The sides of a job and what their workers reported so far."""

    perf_session: LLMPerfSession
    sides: list[Side]  # the working tree last; an A/B job's ref first
    runs: dict[str, list[WorkerRun]] = field(default_factory=lambda: defaultdict(list))  # timing workers by side
    counted: dict[str, list[WorkerRun]] = field(default_factory=dict)  # counting workers by side (counting.py)
    available: dict[str, set[str]] = field(default_factory=dict)  # the tests a side has, where it was collected

    @property
    def current(self) -> Side:
        return self.sides[-1]

    def on_side(self, side: Side, nodeids: Sequence[str]) -> list[str]:
        """Those of `nodeids` that exist on `side` (all, where it was not collected)."""
        return [n for n in nodeids if side.name not in self.available or n in self.available[side.name]]

    def stopped(self, nodeid: str, runs: dict[str, list[WorkerRun]] | None = None) -> Decision | None:
        """A test that failed or was skipped in a worker is not judged: what it reports instead."""
        runs = self.runs if runs is None else runs
        for side in reversed(self.sides):  # the working tree first
            for run in runs.get(side.name, []):
                failures = run.failures(nodeid)
                if failures:
                    text = "\n".join(f.text for f in failures)
                    if side.name == "A":
                        return Decision(
                            failure=f"cannot compare: the test fails on {side.label} (worker process {run.index}), "
                            f"so there is nothing to compare with:\n{text}"
                        )
                    return Decision(failure=f"in worker process {run.index} ({side.label}):\n{text}")
                reason = run.skip_reason(nodeid)
                if reason is not None and side.name == "A":  # measured in the working tree: not `new`, no reference
                    return Decision(failure=f"cannot compare: the test is skipped on {side.label} (worker process "
                                    f"{run.index}: {reason}), so there is nothing to compare with")  # fmt: skip
                if reason is not None:
                    return Decision(skip=reason)
        for side in reversed(self.sides):  # the ref's side too, where it has the test: else it would read as `new`
            done = runs.get(side.name, [])
            if (
                done
                and self.on_side(side, [nodeid])
                and not any(r.nodeid == nodeid for run in done for r in run.reports)
            ):
                why = "cannot compare: " if side != self.current else ""
                return Decision(  # it measured nothing, so judging it would find nothing to fail on: a green nothing
                    failure=f"{why}not run in any worker process on {side.label}: deselected there? (the ini's "
                    "addopts, such as -m or -k, apply in the workers; the command line's do not reach them)"
                )
        return None

    def merged(self, nodeid: str, runs: Sequence[WorkerRun]) -> dict[str, BenchmarkResult]:
        """The test's benchmarks as every worker of `runs` (one side's) measured them, merged per key."""
        parts: dict[str, list[BenchmarkResult]] = defaultdict(list)
        for run in runs:
            for measured in run.measured:
                if measured.nodeid == nodeid:
                    parts[measured.result.key].append(measured.result)
        return {key: BenchmarkResult.merge(found) for key, found in parts.items()}

    def current_results(self, nodeid: str, counted: bool = False) -> list[BenchmarkResult]:
        """The working tree's benchmarks of a test: as timed, or (counted) as its counting workers counted them."""
        runs = self.counted if counted else self.runs
        return list(self.merged(nodeid, runs.get(self.current.name, [])).values())

    def reference(self, result: BenchmarkResult, counted: bool = False) -> Reference | Outcome:
        """What `result` is judged against: side A's benchmark of the same key (A/B; `counted`: as its counting
        workers counted it), or its stored baseline."""
        perf_session = self.perf_session
        if not perf_session.settings.compare:
            return judging.stored_reference(perf_session, result, perf_session.store.lookup(result.module, result.key))
        ref, label = self.sides[0], self.sides[0].label
        side = self.merged(result.nodeid, (self.counted if counted else self.runs).get(ref.name, [])).get(result.key)
        if side is not None:
            side = counting.attach(side, self.counted.get(ref.name, []), label)
        exists = result.nodeid in self.available.get(ref.name, ())
        return judging.ab_reference(result, side, label, exists_on_a=exists)

    def judge_or_record(
        self, plan: Plan | None, merged: BenchmarkResult, family: int | None, final: bool | None = None
    ) -> Outcome:
        """Record the benchmark (update modes), or judge it at this look (no plan: on its counts alone, against
        what side A's counting workers counted); `final`: the last look, where not its schedule's (a budget spent)."""
        perf_session = self.perf_session
        merged = counting.attach(merged, self.counted.get(self.current.name, []), self.current.label)
        scenario = Scenario.from_json(merged.scenario)
        if perf_session.mode != "gate" and not perf_session.settings.compare:
            lookup = perf_session.store.lookup(merged.module, merged.key)
            if perf_session.mode == "update" or lookup.entry is None:
                return judging.record(perf_session, merged, scenario, lookup)
        reference = self.reference(merged, counted=plan is None)
        if isinstance(reference, Outcome):
            return reference
        return judging.judge(
            perf_session,
            merged,
            reference,
            scenario,
            plan.schedule if plan else None,
            final=(plan.final if final is None else final) if plan else True,
            previous=plan.outcomes.get(merged.key) if plan else None,
            family=family,
        )

    def costs(self, nodeid: str, fixed: float) -> Costs:
        """What a round of a test costs: `fixed` seconds, and one run of each batch size on every side (the mean of
        the runs taken so far)."""
        per_run: dict[int, float] = defaultdict(float)
        for side in self.sides:
            for result in self.merged(nodeid, self.runs.get(side.name, [])).values():
                for batch in result.batches:
                    if batch.samples:
                        per_run[batch.batch_size] += statistics.fmean(s.end_to_end_ns for s in batch.samples) / 1e9
        return Costs(fixed, dict(per_run))

    def count_family(self, plans: Sequence[Plan]) -> int:
        """Gated rows of every planned test, counted on what the first rounds measured: one family."""
        count = 0
        for plan in plans:
            for merged in self.current_results(plan.item.nodeid):
                reference = self.reference(merged)
                if isinstance(reference, Outcome):
                    continue
                rows = judge_rows(
                    merged,
                    reference,
                    Scenario.from_json(merged.scenario),
                    splits_prefill=merged.splits_prefill,
                    schedule=plan.schedule,
                    final=False,
                    max_load=float("inf"),
                    counters_better=merged.counters_better,
                )
                count += sum(r.verdict in COMPARED or r.verdict == Verdict.UNDECIDED for r in rows)
        return max(count, 1)
