"""The campaign: rounds of worker processes, looks, and a decision for every benchmark test.

The controller (orchestrate/controller.py) runs one before the test loop when benchmark tests are due. Each
round starts one fresh `python -m pytest` of the due tests per side (orchestrate/manager.py), sides alternating
in ABBA order, so slow drifts and a steady neighbour hit both alike. A test is judged at each look of its schedule
(judge/procedure.py), every gated row of the job in one family; its batch sizes with undecided rows are measured
in more rounds, up to the cap. Counting workers (orchestrate/counting.py) run before the rounds; a test measured
by its counts alone (--llmperf-instructions-only) is judged on them and has no rounds.

This module brings the statistics (numpy, scipy): it is imported only when a campaign runs, so a session
without benchmarks never loads them.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..judge.procedure import Schedule
from ..judge.rows import Reference, judge_rows, undecided_batches
from ..judge.verdicts import COMPARED, Outcome, Verdict
from ..leftovers import WORKERS_PREFIX, claim, left_behind_line, remove_left_work_dirs
from ..measure.records import BenchmarkResult
from ..measure.scenario import Scenario
from ..processes import sigterm_interrupts
from ..report import campaign_progress
from . import counting, judging, worktree
from .forkserver import ForkServer, ForkServerError, preload_for, server_env
from .manager import PYTEST, RoundWork, Side, WorkerError, WorkerRun, run_round, run_worker
from .markers import marker_kwargs
from .session import LLMPerfSession


@dataclass
class Decision:
    """What a deferred test reports: skipped, failed with a text, or passed; and the warnings it emits."""

    skip: str | None = None
    failure: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """One benchmark test's way through the campaign."""

    item: pytest.Item
    schedule: Schedule
    look: int = 0  # index into schedule.looks
    batch_sizes: list[int] | None = None  # a later look measures only these (None: all)
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # by benchmark key, as judged so far

    @property
    def units(self) -> int:
        return self.schedule.looks[self.look]


class Campaign:
    """One job's measuring and judging; `decisions` (the controller's, by node id) receives what each test reports."""

    def __init__(self, config: pytest.Config, llm: LLMPerfSession, decisions: dict[str, Decision]) -> None:
        self.config = config
        self.llm = llm
        self.decisions = decisions
        self.plans: dict[str, Plan] = {}
        self.family: int | None = None  # gated rows of the whole job, judged as one family
        self.progress: campaign_progress.CampaignProgress | None = None  # live progress of the workers
        self.counted: dict[str, list[WorkerRun]] = {}  # counting workers by side (orchestrate/counting.py)
        self.server: ForkServer | None = None  # forks the workers of the rounds (--llmperf-worker-start=fork)

    def run(self, items: list[pytest.Item]) -> None:
        """Measure and judge `items`, each decision into `decisions` (a test without one was not reached)."""
        self.progress = campaign_progress.campaign(self.config)
        left = remove_left_work_dirs()
        self._say(left_behind_line("worker directories", left), left)
        work_dir = Path(tempfile.mkdtemp(prefix=WORKERS_PREFIX))
        try:  # removed whatever happens; a failed worker's log was kept in the report directory (manager.py)
            claim(work_dir)
            with contextlib.ExitStack() as stack:
                stack.enter_context(sigterm_interrupts())
                # it imports while the A side is checked out and collected, and instructions are counted
                server = self._fork_server(work_dir, items)
                if server is not None:
                    stack.callback(server.close)
                root = Path(self.config.rootpath)
                sides, available = [Side("", root, "the working tree")], {}
                if self.llm.settings["compare"]:
                    if self.progress is not None:  # a checkout and a collection can take seconds: say so first
                        self.progress.say(f"checking out {self.llm.settings['compare']} into a git worktree and "
                                          "collecting its tests (the A side)")
                    try:
                        ref = stack.enter_context(worktree.checkout(self.llm.settings["compare"], root))
                    except worktree.RefError as exc:
                        raise pytest.UsageError(f"llmperf: {exc}") from None
                    self._say(left_behind_line("comparison worktrees", list(ref.cleared)), ref.cleared)
                    sides = [Side("A", ref.root, ref.label, ref.pythonpath), Side("B", root, "the working tree")]
                    self.llm.compared_to = ref.label
                    try:
                        available["A"] = self._collect(sides[0], items)
                    except WorkerError as exc:
                        self._fail_all(items, f"llmperf: {exc}")
                        return
                if self._count(items, sides, work_dir):  # False: a counting worker failed, each test says so
                    only = self.llm.settings["instructions_only"]  # these tests are counted, not timed
                    self._judge_counts([i for i in items if only and counting.wants_instructions(i, True)], sides,
                                       available)
                    if timed := [i for i in items if i.nodeid not in self.decisions]:
                        self.server = self._ready(server)
                        self._rounds(timed, sides, available, work_dir)
        finally:
            if self.progress is not None:
                self.progress.clear()
            shutil.rmtree(work_dir, ignore_errors=True)

    def _fork_server(self, work_dir: Path, items: list[pytest.Item]) -> ForkServer | None:
        """The server the rounds' workers are forked from, importing; None with --llmperf-worker-start=exec or
        --llmperf-instructions-only (counting workers start under valgrind), or when it cannot start."""
        if self.llm.settings["worker_start"] != "fork" or self.llm.settings["instructions_only"]:
            return None
        root = Path(self.config.rootpath)
        defined = [m for m in {*(getattr(item, "module", None) for item in items),
                               *self.config.pluginmanager.get_plugins()}  # the conftests among them
                   if isinstance(m, ModuleType) and root in Path(getattr(m, "__file__", None) or "/").parents]
        modules = preload_for([getattr(item, "fixturenames", ()) for item in items], defined, sys.modules)
        try:
            return ForkServer.start(work_dir, server_env(self.llm.settings["malloc"]), modules)
        except OSError as exc:
            self._say(f"llmperf: workers start from scratch (as --llmperf-worker-start=exec): the fork server did "
                      f"not start ({exc})", True)
            return None

    def _ready(self, server: ForkServer | None) -> ForkServer | None:
        """`server` once it has imported; None (every worker starts from scratch, as the line says) if it failed."""
        if server is None:
            return None
        try:
            return server.ready()
        except ForkServerError as exc:
            self._say(f"llmperf: workers start from scratch (as --llmperf-worker-start=exec): {exc}", True)
            return None

    def _say(self, line: str, when: Any) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if when and reporter is not None:
            reporter.write_line(line, yellow=True)

    def _rounds(self, items: list[pytest.Item], sides: list[Side], available: dict[str, set[str]],
                work_dir: Path) -> bool:
        """Run rounds until every planned test is decided; False when a worker failed (its log is kept)."""
        self.plans = {item.nodeid: Plan(item, self.llm.worker_schedule(self.llm.processes_for(item),
                                                                      self._alpha(item))) for item in items}
        runs: dict[str, list[WorkerRun]] = defaultdict(list)
        settings = {**self.llm.settings.values, "processes": 1, "compare": None, "json": None, "update": False,
                    "update_missing": False}
        progress = self.progress
        done = 0
        while self.plans:
            done += 1
            due = {nodeid: plan for nodeid, plan in self.plans.items() if plan.units >= done}
            order = sides if done % 2 else list(reversed(sides))  # ABBA: A B, B A, A B, ...
            work = [RoundWork(side, nodeids, {n: due[n].batch_sizes for n in nodeids if due[n].batch_sizes is not None},
                              partial(progress.records, side=side.label) if progress is not None else None)
                    for side in order
                    if (nodeids := [n for n in due if side.name not in available or n in available[side.name]])]
            try:
                for run in self._round(work, done, settings, work_dir):
                    runs[run.side.name].append(run)
            except WorkerError as exc:
                for nodeid in list(self.plans):
                    self.decisions[nodeid] = Decision(failure=f"llmperf: {exc}")
                return False
            if done == 1 and progress is not None:  # a long campaign says how long, once the first round is timed
                said = campaign_progress.campaign_estimate(sum(r[0].seconds for r in runs.values() if r),
                                                           [p.schedule for p in self.plans.values()])
                if said:
                    progress.say(said)
            for nodeid in [n for n, plan in due.items() if plan.units == done]:
                self._look(self.plans[nodeid], sides, runs, available)
        return True

    def _round(self, work: list[RoundWork], index: int, settings: dict[str, Any], work_dir: Path) -> list[WorkerRun]:
        """One round: the sides' workers taking turns at every run or batch size (--llmperf-interleave=run, batch),
        or one after the other."""
        progress = self.progress
        # past the first look a test gets one more process a round while rows stay open, up to its cap
        at_most = any(plan.look > 0 for plan in self.plans.values())
        total = max(plan.schedule.cap if at_most else plan.units for plan in self.plans.values())
        timeout, args = self.llm.settings["worker_timeout"], self._passthrough_args()
        if len(work) > 1 and self.llm.settings["interleave"] != "process":
            for item in work:
                if progress is not None:
                    progress.started(item.side.label, index, total, len(item.nodeids), at_most=at_most)
            done = run_round(work, index, settings=settings, work_dir=work_dir, timeout_s=timeout, extra_args=args,
                             server=self.server)
            for run in done:
                if progress is not None:
                    progress.done(run.seconds, side=run.side.label)
            return done
        done = []
        for item in work:
            if progress is not None:
                progress.started(item.side.label, index, total, len(item.nodeids), at_most=at_most)
            done.append(run_worker(item.side, index, item.nodeids, settings=settings, work_dir=work_dir,
                                   timeout_s=timeout, extra_args=args, batch_sizes=item.batch_sizes,
                                   on_records=item.on_records, server=self.server))
            if progress is not None:
                progress.done(done[-1].seconds, side=item.side.label)
        return done

    def _count(self, items: list[pytest.Item], sides: list[Side], work_dir: Path) -> bool:
        """Count instructions of the tests that ask for them (orchestrate/counting.py); False when a counting worker
        failed (its log is kept)."""
        try:
            self.counted = counting.campaign(self.llm, items, sides, work_dir, self._passthrough_args(), self.progress)
        except WorkerError as exc:
            self._fail_all(items, f"llmperf: counting instructions: {exc}")
            return False
        return True

    def _judge_counts(self, items: list[pytest.Item], sides: list[Side], available: dict[str, set[str]]) -> None:
        """The tests measured by their counts alone (--llmperf-instructions-only): one look at what the counting
        workers counted, since a count is the same in every process."""
        for item in items:
            stopped = self._stopped(item.nodeid, sides, self.counted)
            outcomes = [] if stopped else [self._outcome(None, merged, sides, self.counted, available, True) for merged
                                           in _by_key(item.nodeid, self.counted.get(sides[-1].name, [])).values()]
            self.decisions[item.nodeid] = stopped or _decision(self.llm, outcomes)
            self.llm.outcomes.extend(outcomes)

    def _fail_all(self, items: list[pytest.Item], text: str) -> None:
        for item in items:
            self.decisions[item.nodeid] = Decision(failure=text)

    def _look(self, plan: Plan, sides: list[Side], runs: dict[str, list[WorkerRun]],
              available: dict[str, set[str]]) -> None:
        """Judge one test at its look: decided, or more rounds for its undecided batch sizes."""
        nodeid = plan.item.nodeid
        stopped = self._stopped(nodeid, sides, runs)
        if stopped is not None:
            self._finish(plan, stopped)
            return
        final = plan.look + 1 >= len(plan.schedule.looks)
        if self.family is None and self.llm.mode != "update":
            self.family = self._family(sides, runs, available)
        outcomes = [self._outcome(plan, merged, sides, runs, available, final)
                    for merged in _by_key(nodeid, runs[sides[-1].name]).values()]
        plan.outcomes = {o.result.key: o for o in outcomes}
        undecided = sorted({b for o in outcomes for b in undecided_batches(o.rows)})
        if undecided and not final:
            plan.look += 1
            plan.batch_sizes = undecided
            return
        self._finish(plan, _decision(self.llm, outcomes))

    def _finish(self, plan: Plan, decision: Decision) -> None:
        self.decisions[plan.item.nodeid] = decision
        self.llm.outcomes.extend(plan.outcomes.values())
        if plan.outcomes:
            self.llm.processes_used.append(plan.units)
        del self.plans[plan.item.nodeid]

    def _stopped(self, nodeid: str, sides: list[Side], runs: dict[str, list[WorkerRun]]) -> Decision | None:
        """A test that failed or was skipped in a worker is not judged: it reports that."""
        for side in reversed(sides):  # the working tree first
            for run in runs[side.name]:
                failures = run.failures(nodeid)
                if failures:
                    text = "\n".join(f["text"] for f in failures)
                    if side.name == "A":
                        return Decision(failure=f"cannot compare: the test fails on {side.label} (worker process "
                                                f"{run.index}), so there is nothing to compare with:\n{text}")
                    return Decision(failure=f"in worker process {run.index} ({side.label}):\n{text}")
                reason = run.skip_reason(nodeid)
                if reason is not None and side.name != "A":
                    return Decision(skip=reason)
        return None

    def _reference(self, result: BenchmarkResult, sides: list[Side], runs: dict[str, list[WorkerRun]],
                   available: dict[str, set[str]]) -> Reference | Outcome:
        if not self.llm.settings["compare"]:
            return judging.stored_reference(self.llm, result, self.llm.store.lookup(result.module, result.key))
        side = _by_key(result.nodeid, runs["A"]).get(result.key)
        if side is not None:
            side = counting.attach(side, self.counted.get("A", []), sides[0].label)
        return judging.ab_reference(result, side, sides[0].label, exists_on_a=result.nodeid in available.get("A", ()))

    def _outcome(self, plan: Plan | None, merged: BenchmarkResult, sides: list[Side],
                 runs: dict[str, list[WorkerRun]], available: dict[str, set[str]], final: bool) -> Outcome:
        """Record the benchmark (update modes), or judge it at this look (no plan: on its counts alone)."""
        merged = counting.attach(merged, self.counted.get(sides[-1].name, []), sides[-1].label)
        scenario = Scenario.from_json(merged.scenario)
        if self.llm.mode != "gate" and not self.llm.settings["compare"]:
            lookup = self.llm.store.lookup(merged.module, merged.key)
            if self.llm.mode == "update" or lookup.entry is None:
                return judging.record(self.llm, merged, scenario, lookup)
        reference = self._reference(merged, sides, runs, available)
        if isinstance(reference, Outcome):
            return reference
        return judging.judge(self.llm, merged, reference, scenario, plan.schedule if plan else None, final=final,
                             previous=plan.outcomes.get(merged.key) if plan else None, family=self.family)

    def _family(self, sides: list[Side], runs: dict[str, list[WorkerRun]], available: dict[str, set[str]]) -> int:
        """Gated rows of every planned test, counted on what the first rounds measured: one family."""
        count = 0
        for nodeid, plan in self.plans.items():
            for merged in _by_key(nodeid, runs[sides[-1].name]).values():
                reference = self._reference(merged, sides, runs, available)
                if isinstance(reference, Outcome):
                    continue
                rows = judge_rows(merged, reference, Scenario.from_json(merged.scenario),
                                  splits_prefill=merged.splits_prefill, schedule=plan.schedule, final=False,
                                  max_load=float("inf"), counters_better=merged.counters_better)
                count += sum(r.verdict in COMPARED or r.verdict == Verdict.UNDECIDED for r in rows)
        return max(count, 1)

    def _alpha(self, item: pytest.Item) -> float:
        return float(marker_kwargs(item).get("alpha", self.llm.settings["alpha"]))

    def _collect(self, side: Side, items: list[pytest.Item]) -> set[str]:
        """The planned tests that exist on a side (a test added in the working tree is 'new')."""
        files = sorted({item.nodeid.split("::", 1)[0] for item in items})
        present = [f for f in files if (side.root / f).exists()]
        if not present:
            return set()
        timeout = self.llm.settings["worker_timeout"]
        try:
            done = subprocess.run([*PYTEST, *present, "--collect-only", "-q", "-p", "no:cacheprovider",
                                   *self._passthrough_args()], cwd=side.root, capture_output=True, text=True,
                                  env=side.environ(), timeout=timeout)
        except subprocess.TimeoutExpired:
            raise WorkerError(f"collecting the tests on {side.label} did not finish within {timeout:g} s "
                              f"(--llmperf-worker-timeout)") from None
        return {line.strip() for line in done.stdout.splitlines() if "::" in line}

    def _passthrough_args(self) -> list[str]:
        """The invocation's options that change what a worker loads: -p plugins and -o ini overrides."""
        args = list(self.config.invocation_params.args)
        keep: list[str] = []
        for i, arg in enumerate(args):
            if arg in ("-p", "-o", "--override-ini") and i + 1 < len(args):
                keep += [arg, args[i + 1]]
            elif arg.startswith(("-p", "--override-ini=", "--import-mode")) and len(arg) > 2:
                keep.append(arg)
        return keep


def _decision(llm: LLMPerfSession, outcomes: list[Outcome]) -> Decision:
    messages, said = [], []
    for outcome in outcomes:
        failing, warned = judging.fail_messages(llm, outcome)
        messages += failing
        said += warned
    return Decision(failure="\n".join(messages) or None, warnings=said)


def _by_key(nodeid: str, runs: list[WorkerRun]) -> dict[str, BenchmarkResult]:
    """The test's benchmarks as measured by every worker of one side so far, merged per key."""
    parts: dict[str, list[BenchmarkResult]] = defaultdict(list)
    for run in runs:
        for measured in run.measured:
            if measured.nodeid == nodeid:
                parts[measured.result.key].append(measured.result)
    return {key: BenchmarkResult.merge(found) for key, found in parts.items()}
