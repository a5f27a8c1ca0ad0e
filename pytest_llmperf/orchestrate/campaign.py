"""The campaign: one job's worker processes, from its sides to a decision for every benchmark test.

The controller (controller.py) runs one before the test loop when benchmark tests are due. `Campaign.run` reads as
what it does: prepare the sides (the working tree; for an A/B job also the ref, checked out into a git worktree and
collected), count instructions where tests ask for them (counting.py), then rounds until every test is decided.
Each round starts one worker per side on the tests still due (pool.py), sides alternating in ABBA order, so slow
drifts and a steady neighbour hit both alike. A test is judged at each look of its schedule (judge/procedure.py;
looks.py), every gated row of the job in one family; its batch sizes with undecided rows are measured in more
rounds, up to the cap. A test measured by its counts alone (--llmperf-instructions-only) has no rounds.

This module brings the statistics (numpy, scipy): it is imported only when a campaign runs, so a session
without benchmarks never loads them.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..files import WORKERS_PREFIX, claim, left_behind_line, remove_left_work_dirs
from ..judge import procedure
from ..judge.procedure import capped_at
from ..judge.rows import undecided_batches
from ..judge.verdicts import Kind, Outcome
from ..measure.memory import steady_malloc_env
from ..processes import sigterm_interrupts, stop_inheriting
from . import counting, sides
from .forkserver import ForkServer, ForkServerError, preload_for, server_env
from .looks import Decision, Measurements, Plan
from .options import marker_kwargs
from .pool import WorkerPool
from .progress import campaign_estimate, for_terminal
from .protocol import ENV_IMPORTS, ENV_OUT, Record, Side, WorkerError, WorkerRun, WorkerSpec
from .session import LLMPerfSession

#: --llmperf-budget when auto: this many times the first look's time (the cap of processes is 5 times the first look's),
#: and at most BUDGET_MOST_MORE_S more than it: a suite of many tests (the shipped one's first look took 5-10 min on a
#: 2-core runner) would otherwise grant its few undecided rows an hour, where a small project's job gets a minute or 2.
BUDGET_FACTOR = 5.0
BUDGET_MOST_MORE_S = 300.0


def auto_budget(first_look_s: float) -> float:
    """--llmperf-budget=auto: the seconds a job's rounds may take, from its first look's."""
    return min(BUDGET_FACTOR * first_look_s, first_look_s + BUDGET_MOST_MORE_S)


def _timed_seconds(runs: list[WorkerRun]) -> float:
    """Seconds the runs of a round's workers were timed for (their generate calls), all sides."""
    return sum(s.end_to_end_ns for run in runs for m in run.measured for b in m.result.batches for s in b.samples) / 1e9


class Campaign:
    """One job's measuring and judging; `decisions` (the controller's, by node id) receives what each test reports."""

    def __init__(self, config: pytest.Config, perf_session: LLMPerfSession, decisions: dict[str, Any]) -> None:
        self.config = config
        self.perf_session = perf_session
        self.decisions: dict[str, Decision] = decisions
        self.progress = for_terminal(config)  # live progress of the workers
        self.measurements = Measurements(perf_session, [Side("", Path(config.rootpath), "the working tree")])
        self.plans: dict[str, Plan] = {}  # the timed tests still undecided, by node id
        self.family: int | None = None  # gated rows of the whole job, judged as one family
        self.started: float | None = None  # when the first round started (the budget counts from then)
        self.budget: float | None = None  # seconds the rounds may take (--llmperf-budget; auto: set at the first look)
        self.fixed: list[float] = []  # per round: its seconds not spent in a timed run (start-up, warmups)
        self.foreign: set[tuple[str, str]] = set()  # (side, module) said to come from outside its checkout

    def run(self, items: list[pytest.Item]) -> None:
        """Measure and judge `items`, each decision into `decisions` (a test without one was not reached)."""
        with contextlib.ExitStack() as stack:
            pool = self._pool(stack)
            self.measurements.sides = self._sides(stack)
            starting = self._fork_servers(stack, pool, items)  # they import while the ref is collected and counted
            items = self._collect_ref(items, pool.work_dir)
            if not items or not self._count(items, pool):
                return
            self._judge_counts(items)
            timed = [item for item in items if item.nodeid not in self.decisions]
            if timed:
                pool.servers = self._ready(starting)
                self._rounds(timed, pool)

    # -- the job's set-up ---------------------------------------------------------------------------

    def _pool(self, stack: contextlib.ExitStack) -> WorkerPool:
        """The job's pool: its work directory (removed at the end; a failed worker's log is kept in the report
        directory), and SIGTERM as Ctrl-C while it runs."""
        left = remove_left_work_dirs()
        self._say(left_behind_line("worker directories", left), left)
        work_dir = Path(tempfile.mkdtemp(prefix=WORKERS_PREFIX))
        stack.callback(shutil.rmtree, work_dir, ignore_errors=True)
        stack.callback(self.progress.clear)
        claim(work_dir)
        stack.callback(self._sweep, work_dir)
        stack.enter_context(sigterm_interrupts())
        settings = self.perf_session.settings
        return WorkerPool(
            work_dir,
            settings=settings.for_worker(),
            timeout_s=settings.worker_timeout,
            logs_dir=self.perf_session.report_dir.resolve() / "worker-logs",
            environ=steady_malloc_env() if settings.malloc == "steady" else {},
            listener=self._heard,
        )

    def _sweep(self, work_dir: Path) -> None:
        """Stop what the benchmarks started and left running (a child in a session of its own outlives its worker's
        tree): each inherited its worker's records path, which lies in the job's work directory."""
        left = stop_inheriting(ENV_OUT, str(work_dir))
        if left:
            self._say(f"llmperf: stopped {len(left)} process(es) the benchmarks left running: {', '.join(left)}", True)

    def _sides(self, stack: contextlib.ExitStack) -> list[Side]:
        return sides.prepare(self.config, self.perf_session, stack, self.progress)

    def _heard(self, side: Side, records: list[Record]) -> None:
        self.progress.records(records, side=side.label)

    def _collect_ref(self, items: list[pytest.Item], work_dir: Path) -> list[pytest.Item]:
        """The tests still to measure once an A/B job's ref is collected: a test whose module (or a conftest above
        it) cannot be collected there fails now, saying why; one the ref lacks is `new`. [] when nothing can be
        compared (its collection failed as a whole: each test says so)."""
        ref = self.measurements.sides[0]
        if ref.name != "A":
            return items
        try:
            found = sides.collect(ref, items, work_dir, self.perf_session.settings.worker_timeout)
        except WorkerError as exc:
            self._fail_all(items, f"llmperf: {exc}")
            return []
        self.measurements.available["A"] = found.nodeids
        for item in items:
            error = found.error_for(item.nodeid)
            if item.nodeid in found.deselected:  # not `new`: the ref has it, and measures nothing to compare with
                self.decisions[item.nodeid] = Decision(
                    failure=f"cannot compare: deselected on {ref.label} by its own options (the ini's addopts, such "
                    "as -m or -k, apply there)"
                )
            elif error is not None:
                where, text = error
                self.decisions[item.nodeid] = Decision(
                    failure=f"cannot compare: collecting {where} on {ref.label} failed, so what the test measures "
                    f"there is not known:\n{text}"
                )
        return [item for item in items if item.nodeid not in self.decisions]

    def _fork_servers(
        self, stack: contextlib.ExitStack, pool: WorkerPool, items: list[pytest.Item]
    ) -> dict[str, ForkServer]:
        """A server per environment the workers run (one, unless the sides have environments of their own), each
        importing; none with -o llmperf_worker_start=exec or --llmperf-instructions-only (counting workers start
        under valgrind), or where one cannot start (its workers start from scratch, as a line says)."""
        if self.perf_session.settings.worker_start != "fork" or self.perf_session.settings.instructions_only:
            return {}
        root = Path(self.config.rootpath)
        defined = [  # the test modules and the conftests among the plugins
            m
            for m in {*(getattr(item, "module", None) for item in items), *self.config.pluginmanager.get_plugins()}
            if isinstance(m, ModuleType) and root in Path(getattr(m, "__file__", None) or "/").parents
        ]
        modules = preload_for([getattr(item, "fixturenames", ()) for item in items], defined, sys.modules)
        servers = {}
        for side in {side.python: side for side in self.measurements.sides}.values():
            # the side's environment, without its checkout on PYTHONPATH: the server imports what both sides share
            env = server_env(self.perf_session.settings.malloc, replace(side, pythonpath=()).environ())
            try:
                servers[side.python] = ForkServer.start(pool.work_dir, env, modules, side.python)
            except OSError as exc:
                self._say(f"llmperf: workers start from scratch (as llmperf_worker_start=exec): the fork server did "
                          f"not start ({exc})", True)  # fmt: skip
                continue
            stack.callback(servers[side.python].close)
        return servers

    def _ready(self, servers: dict[str, ForkServer]) -> dict[str, ForkServer]:
        """The servers once they have imported, less any that failed (its workers start from scratch, as a line
        says)."""
        ready = {}
        for python, server in servers.items():
            try:
                ready[python] = server.ready()
            except ForkServerError as exc:
                self._say(f"llmperf: workers start from scratch (as llmperf_worker_start=exec): {exc}", True)
        return ready

    # -- counting -----------------------------------------------------------------------------------

    def _count(self, items: list[pytest.Item], pool: WorkerPool) -> bool:
        """Count instructions of the tests that ask for them (counting.py); False when a counting worker failed
        (each test says so; its log is kept)."""
        progress = self.progress

        def waiting(seconds: float, done: int) -> None:  # a CI log is never silent for long
            progress.note(f"counting instructions under callgrind: {done} of {len(specs)} process(es) done, "
                          f"{seconds:.0f} s")  # fmt: skip

        started = time.monotonic()
        try:
            specs = counting.specs_for(self.perf_session, items, self.measurements.sides, pool)
            envs = self.perf_session.environments
            if envs is not None and envs.per_side:  # a count, like a timing, is of its own side's environment
                specs = [replace(spec, environ={**spec.environ, ENV_IMPORTS: "1"}) for spec in specs]
            if specs:  # said when it starts, whatever it takes: a CI log hears of callgrind before it waits on it
                progress.say(f"counting instructions under callgrind: {len(specs)} process(es), up to two at a time")
                self.measurements.counted = counting.count(pool, specs, on_wait=waiting)
                for run in (run for runs in self.measurements.counted.values() for run in runs):
                    self._check_imports(run)
        except WorkerError as exc:
            self._fail_all(items, f"llmperf: counting instructions: {exc}")
            return False
        if specs:
            where = " and ".join(side.label for side in self.measurements.sides)
            per_side = len(specs) // len(self.measurements.sides)
            progress.say(f"counted instructions under callgrind, {per_side} process(es) on {where}: "
                         f"{len(specs[0].nodeids)} test(s) in {time.monotonic() - started:.0f} s")  # fmt: skip
        return True

    def _judge_counts(self, items: list[pytest.Item]) -> None:
        """The tests measured by their counts alone (--llmperf-instructions-only): one look at what the counting
        workers counted, since a count is the same in every process."""
        if not self.perf_session.settings.instructions_only:
            return
        measured = self.measurements
        for item in [i for i in items if counting.wants_instructions(i, True)]:
            stopped = measured.stopped(item.nodeid, measured.counted)
            counted = [] if stopped else measured.current_results(item.nodeid, counted=True)
            outcomes = [measured.judge_or_record(None, merged, self.family) for merged in counted]
            self.decisions[item.nodeid] = stopped or Decision.of(self.perf_session, outcomes)
            self.perf_session.outcomes.extend(outcomes)

    # -- rounds and looks ---------------------------------------------------------------------------

    def _rounds(self, items: list[pytest.Item], pool: WorkerPool) -> None:
        """Run rounds until every planned test is decided; a worker that failed fails the tests still due."""
        perf_session = self.perf_session
        self.plans = {
            item.nodeid: Plan(item, perf_session.worker_schedule(perf_session.processes_for(item), self._alpha(item)))
            for item in items
        }
        index = 0
        self.started = time.monotonic()
        budget = self.perf_session.settings.budget  # an A/B job's: against stored baselines the cap alone bounds a test
        self.budget = float(budget) if self.perf_session.settings.compare and budget != "auto" else None
        while self.plans:
            index += 1
            due = {nodeid: plan for nodeid, plan in self.plans.items() if plan.units >= index}
            try:
                began = time.monotonic()
                done = self._round(self._specs(due, index), pool)
                for run in done:
                    self._check_imports(run)
                    self.measurements.runs[run.side.name].append(run)
                self.fixed.append(max(time.monotonic() - began - _timed_seconds(done), 0.0))
            except WorkerError as exc:
                self._fail_all([plan.item for plan in self.plans.values()], f"llmperf: {exc}")
                return
            if index == 1:  # a long campaign says how long, once the first round is timed (its wall time: the two
                self._estimate(time.monotonic() - began)  # sides of a round take turns or run one after the other)
            looking = [n for n, plan in due.items() if plan.units == index]
            if (
                looking
                and self.perf_session.settings.compare
                and self.perf_session.settings.budget == "auto"
                and self.budget is None
            ):
                self.budget = auto_budget(time.monotonic() - self.started)
            for nodeid, plan in due.items():  # past the first look, a budget spent makes this round's look the last
                if nodeid not in looking and plan.look > 0 and self._spent(plan):
                    plan.schedule = capped_at(plan.schedule, index)
                    looking.append(nodeid)
            for nodeid in looking:
                self._look(self.plans[nodeid])

    def _check_imports(self, run: WorkerRun) -> None:
        """What a worker imported: never the other side's environment (WorkerError: that round measured nothing it
        can judge); its side's own modules from outside its checkout are said, once each; and the working tree's
        distributions go into the stored baselines' fingerprint."""
        imports = run.imports
        if imports is None:
            return
        envs = self.perf_session.environments
        if envs is not None and envs.per_side:
            from ..environments.installed import check_imported

            problems = check_imported(imports.distributions, envs.base if run.side.name == "A" else envs.head)
            if problems:
                raise WorkerError(
                    f"worker process {run.index} on {run.side.label} did not run its side's environment, so the "
                    f"round measured one side in the other's environment and nothing of it is judged: "
                    f"{'; '.join(problems)}"
                )
        for name, origin in sorted(imports.foreign.items()):
            if (run.side.label, name) not in self.foreign:
                self.foreign.add((run.side.label, name))
                self.progress.say(
                    f"warning: {run.side.label} imported {name} from {origin}, not from its checkout: that copy is "
                    "what its workers measure (install the project editable, pip install -e ., or drop that copy)"
                )
        self.perf_session.imported_anywhere.update(imports.distributions)  # a dependency change none imports is said
        if run.side == self.measurements.current:
            self.perf_session.imported.update(imports.distributions)

    def _specs(self, due: dict[str, Plan], index: int) -> list[WorkerSpec]:
        """Round `index`'s workers: one per side that has tests due, in ABBA order (A B, B A, A B, ...)."""
        order = self.measurements.sides if index % 2 else list(reversed(self.measurements.sides))
        envs = self.perf_session.environments
        # what a worker imported: checked in every round where the sides have environments of their own, else the
        # first round's are enough for the baselines' fingerprint
        environ = {ENV_IMPORTS: "1"} if index == 1 or (envs is not None and envs.per_side) else {}
        specs = []
        for side in order:
            nodeids = self.measurements.on_side(side, list(due))
            if nodeids:
                later = {n: sizes for n in nodeids if (sizes := due[n].batch_sizes) is not None}
                specs.append(WorkerSpec(side, index, tuple(nodeids), later or None, environ=environ))
        return specs

    def _round(self, specs: list[WorkerSpec], pool: WorkerPool) -> list[WorkerRun]:
        """One round: the sides' workers taking turns at every run or batch size (-o llmperf_interleave=run, batch),
        or one after the other."""
        # past the first look a test gets one more process a round while rows stay open, up to its cap
        at_most = any(plan.look > 0 for plan in self.plans.values())
        total = max(plan.schedule.cap if at_most else plan.units for plan in self.plans.values())

        def started(spec: WorkerSpec) -> None:
            self.progress.started(spec.side.label, spec.index, total, len(spec.nodeids), at_most=at_most)

        if len(specs) > 1 and self.perf_session.settings.interleave != "process":  # together, taking turns
            for spec in specs:
                started(spec)
            done = pool.run_round(specs)
            for run in done:
                self.progress.done(run.seconds, side=run.side.label)
            return done
        done = []
        for spec in specs:  # one after the other
            started(spec)
            done.append(pool.run(spec))
            self.progress.done(done[-1].seconds, side=spec.side.label)
        return done

    def _estimate(self, round_s: float) -> None:
        schedules = [plan.schedule for plan in self.plans.values()]
        budget = self.budget
        if self.perf_session.settings.compare and self.perf_session.settings.budget == "auto" and schedules:
            budget = auto_budget(round_s * max(schedule.looks[0] for schedule in schedules))
        said = campaign_estimate(round_s, schedules, budget)
        if said:
            self.progress.say(said)

    def _look(self, plan: Plan) -> None:
        """Judge one test at its look: decided, or more rounds for its undecided batch sizes."""
        nodeid = plan.item.nodeid
        stopped = self.measurements.stopped(nodeid)
        if stopped is not None:
            self._finish(plan, stopped)
            return
        if self.family is None and self.perf_session.mode != "update":
            self.family = self.measurements.count_family(list(self.plans.values()))
        final = plan.final or self._spent(plan)
        outcomes = self._judged(plan, final)
        undecided = sorted({b for o in outcomes for b in undecided_batches(o.rows)})
        if undecided and not final and any(o.kind == Kind.REGRESSED for o in outcomes):
            # the test fails whatever its other rows say: this look is its last (it spends what is left)
            outcomes = self._judged(plan, final=True)
            undecided = []
        if undecided and not final:
            least = int(self.perf_session.settings.runs)
            costs = self.measurements.costs(nodeid, statistics.median(self.fixed[-5:]) / max(len(self.plans), 1))
            plan.advance(undecided, costs, least=least, most=max(self.perf_session.settings.max_runs, least),
                         affordable=lambda runs: self._affordable(plan, costs, runs))  # fmt: skip
            return
        self._finish(plan, Decision.of(self.perf_session, outcomes))

    def _judged(self, plan: Plan, final: bool) -> list[Outcome]:
        """The test's benchmarks judged at its current look (`final`: its last)."""
        current = self.measurements.current_results(plan.item.nodeid)
        outcomes = [self.measurements.judge_or_record(plan, m, self.family, final) for m in current]
        plan.outcomes = {o.result.key: o for o in outcomes}
        return outcomes

    def _spent(self, plan: Plan) -> bool:
        """Whether the budget cannot pay this test's next round (its look is then the last)."""
        if self.budget is None or self.started is None or not self.fixed:
            return False
        costs = self.measurements.costs(plan.item.nodeid, statistics.median(self.fixed[-5:]))
        sizes = plan.batch_sizes or dict.fromkeys(costs.run)
        next_round = procedure.round_seconds(
            costs, {b: n or int(self.perf_session.settings.runs) for b, n in sizes.items()}
        )
        return time.monotonic() - self.started + next_round > self.budget

    def _affordable(self, plan: Plan, costs: procedure.Costs, runs: Mapping[int, int]) -> int:
        """The most processes per side this test can reach within the budget at `runs` runs per process (the
        schedule's cap without one)."""
        cap = plan.schedule.cap
        if self.budget is None or self.started is None:
            return cap
        left = self.budget - (time.monotonic() - self.started)
        per_round = procedure.round_seconds(costs, runs)
        return min(cap, plan.units + max(int(left // max(per_round, 1e-3)), 0))

    def _finish(self, plan: Plan, decision: Decision) -> None:
        self.decisions[plan.item.nodeid] = decision
        self.perf_session.outcomes.extend(plan.outcomes.values())
        if plan.outcomes:
            self.perf_session.processes_used.append(plan.units)
        del self.plans[plan.item.nodeid]

    # -- helpers ------------------------------------------------------------------------------------

    def _say(self, line: str, when: Any) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if when and reporter is not None:
            reporter.write_line(line, yellow=True)

    def _fail_all(self, items: list[pytest.Item], text: str) -> None:
        for item in items:
            self.decisions[item.nodeid] = Decision(failure=text)

    def _alpha(self, item: pytest.Item) -> float:
        return float(marker_kwargs(item).get("alpha", self.perf_session.settings.alpha))
