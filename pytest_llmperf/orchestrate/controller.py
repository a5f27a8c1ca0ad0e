"""Worker processes and A/B comparisons: the controlling pytest process (pyperf's manager).

With more than one process per benchmark (`--llmperf-processes`, default on the cpu target) or a
comparison against a git ref (`--llmperf-compare REF`), this pytest process does not run the benchmark
tests itself, so no model is loaded twice. Before the test loop it runs them in worker processes: a
round is one fresh `python -m pytest` of the selected benchmark tests per side, sides alternating in
ABBA order, so slow drifts and a steady neighbour hit both alike. After N rounds each benchmark is
judged on its per-process medians; one still unknown gets more rounds (judge/sequential.py). Then,
in the normal test loop, each benchmark test reports what was decided for it.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import threading
import tempfile
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..judge import gate
from ..judge import verdicts as judge
from ..judge.sequential import Merged, check_attainable, looks_for, merge_processes, reference_entry
from . import worktree
from ..measure.scenario import Scenario, ScenarioError
from .manager import PYTEST, Side, WorkerError, WorkerRun, run_worker
from ..judge.outputs import unchecked
from .judging import Outcome, changed_outputs, fail_on_messages, judge_outcome
from .session import LLMPerfSession

INF = float("inf")


@dataclass
class Decision:
    """What a planned test reports: skipped, failed with a text, or passed; and the warnings to emit."""

    skip: str | None = None
    failure: str | None = None
    warnings: list[warnings.WarningMessage] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)


@dataclass
class Plan:
    nodeid: str
    looks: list[int]
    look: int = 0  # index into looks

    @property
    def target(self) -> int:
        return self.looks[self.look]


class ProcessController:
    """Registered in pytest_configure when benchmarks are measured in worker processes."""

    def __init__(self, config: pytest.Config, llm: LLMPerfSession, planned_filter: Any) -> None:
        self.config = config
        self.llm = llm
        self.is_planned = planned_filter  # item -> bool: a benchmark test this controller measures
        self.decisions: dict[str, Decision] = {}
        self.compare_ref: str | None = llm.settings["compare"]

    # -- the campaign, before pytest's test loop --------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        if not session.config.option.collectonly:
            items = [item for item in session.items if self.is_planned(item)]
            if items:
                self._campaign(items)
        return (yield)

    def _campaign(self, items: list[pytest.Item]) -> None:
        work_dir = Path(tempfile.mkdtemp(prefix="llmperf-workers-"))
        failed = True
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(_sigterm_interrupts())
                sides = [Side("", Path(self.config.rootpath), "the working tree")]
                available: dict[str, set[str]] = {}
                if self.compare_ref:
                    try:
                        ref = stack.enter_context(worktree.checkout(self.compare_ref, Path(self.config.rootpath)))
                    except worktree.RefError as exc:
                        raise pytest.UsageError(f"llmperf: {exc}") from None
                    sides = [Side("A", ref.root, ref.label, ref.pythonpath),
                             Side("B", Path(self.config.rootpath), "the working tree")]
                    self.llm.compared_to = ref.label
                    available["A"] = self._collect(sides[0], items, work_dir)
                failed = not self._rounds(items, sides, available, work_dir)
        finally:
            if not failed:  # a failed worker's log stays where its error message points
                shutil.rmtree(work_dir, ignore_errors=True)

    def _plans(self, items: list[pytest.Item]) -> dict[str, Plan]:
        plans = {}
        cap = self.llm.settings["max_processes"]
        for item in items:
            n = self.llm.processes_for(item)
            looks = [n] if self.llm.mode != "gate" else looks_for(n, max(cap or 2 * n, n))
            plans[item.nodeid] = Plan(item.nodeid, looks)
        return plans

    def _rounds(self, items: list[pytest.Item], sides: list[Side], available: dict[str, set[str]],
                work_dir: Path) -> bool:
        """Run rounds until every planned test is decided; False when a worker failed."""
        plans = self._plans(items)
        runs: dict[str, list[WorkerRun]] = defaultdict(list)
        worker_settings = {**self.llm.settings.values, "processes": 1, "compare": None, "json": None,
                           "update": False, "update_missing": False}
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        done = 0
        while plans:
            done += 1
            due = [nodeid for nodeid, plan in plans.items() if plan.target >= done]
            order = sides if done % 2 else list(reversed(sides))  # ABBA: A B, B A, A B, ...
            for side in order:
                nodeids = [n for n in due if side.name not in available or n in available[side.name]]
                if not nodeids:
                    continue
                try:
                    run = run_worker(side, done, nodeids, settings=worker_settings, work_dir=work_dir,
                                     timeout_s=self.llm.settings["worker_timeout"],
                                     extra_args=self._passthrough_args())
                except WorkerError as exc:
                    for nodeid in list(plans):
                        self.decisions[nodeid] = Decision(failure=f"llmperf: {exc}")
                    return False
                runs[side.name].append(run)
                if reporter is not None:
                    reporter.write_line(f"llmperf: process {done} of {max(p.target for p in plans.values())} on "
                                        f"{side.label}: {len(nodeids)} test(s) in {run.seconds:.1f} s")
            for nodeid in [n for n, plan in plans.items() if plan.target == done]:
                plan = plans[nodeid]
                decision, unknown = self._decide(nodeid, sides, runs, available, plan)
                if unknown and plan.look + 1 < len(plan.looks):
                    plan.look += 1
                    continue
                self.decisions[nodeid] = decision
                self.llm.outcomes.extend(decision.outcomes)
                del plans[nodeid]
        return True

    def _decide(self, nodeid: str, sides: list[Side], runs: dict[str, list[WorkerRun]],
                available: dict[str, set[str]], plan: Plan) -> tuple[Decision, bool]:
        """Judge one test on every process measured so far; say whether a verdict is still unknown."""
        current = sides[-1].name
        for run in runs[current]:
            failures = run.failures(nodeid)
            if failures:
                text = "\n".join(f["text"] for f in failures)
                return Decision(failure=f"in worker process {run.index} ({run.side.label}):\n{text}"), False
            reason = run.skip_reason(nodeid)
            if reason is not None:
                return Decision(skip=reason), False
        measured = _by_key(nodeid, runs[current])
        reference = _by_key(nodeid, runs["A"]) if self.compare_ref else {}
        if self.compare_ref:
            for run in runs["A"]:
                if run.failures(nodeid):
                    text = "\n".join(f["text"] for f in run.failures(nodeid))
                    return Decision(failure=f"cannot compare: the test fails on {run.side.label} (worker process "
                                            f"{run.index}), so there is nothing to compare with:\n{text}"), False
        alpha_look = None
        decision = Decision()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for key, merged in measured.items():
                scenario = Scenario.from_json(merged.result.scenario)
                alpha_look = scenario.alpha / len(plan.looks)
                if self.compare_ref:
                    outcome = self._ab_outcome(merged, reference.get(key), scenario, alpha_look, sides[0],
                                               nodeid in available.get("A", ()))
                else:
                    outcome = judge_outcome(self.llm, merged.result, scenario, _gate_rows(merged, scenario,
                                                                                           alpha_look))
                decision.outcomes.append(outcome)
            messages = [m for o in decision.outcomes for m in fail_on_messages(self.llm, o, o.result)]
        decision.warnings = list(caught)
        if messages:
            decision.failure = "\n".join(messages)
        unknown = any(r.verdict == gate.INCONCLUSIVE for o in decision.outcomes for r in o.rows)
        return decision, unknown

    def _ab_outcome(self, merged: Merged, reference: Merged | None, scenario: Scenario, alpha: float,
                    side_a: Side, on_a: bool) -> Outcome:
        result = merged.result
        if reference is None:
            why = "measured here only" if on_a else f"not in {side_a.label}"
            return Outcome(result, "new", messages=[], baseline_path=f"{side_a.label}: {why}")
        entry = reference_entry(reference.result, side_a.label)
        # A and B processes of one round ran back to back: paired, the machine's state of the moment cancels
        rows = judge.compare(result, entry, scenario, splits_prefill=merged.splits_prefill, alpha=alpha,
                             max_load=INF, counters_better=merged.counters_better, paired=True,
                             reference_label=side_a.label)
        messages = [judge.regression_message(r, alpha) for r in rows if r.verdict == gate.REGRESSED]
        how = f"compared with {side_a.label} in alternating worker processes (--llmperf-compare)"
        if messages:
            messages.append(how)
        changed = changed_outputs(result, rows, scenario.outputs, how)
        return Outcome(result, "compared", rows=rows, messages=messages, baseline_path=side_a.label,
                       reference=reference.result, changed=changed,
                       outputs_unchecked=unchecked(entry.outputs, result.batches))

    def _collect(self, side: Side, items: list[pytest.Item], work_dir: Path) -> set[str]:
        """The planned tests that exist on a side (a test added in the working tree is 'new')."""
        files = sorted({item.nodeid.split("::", 1)[0] for item in items})
        present = [f for f in files if (side.root / f).exists()]
        if not present:
            return set()
        done = subprocess.run([*PYTEST, *present, "--collect-only", "-q", "-p", "no:cacheprovider",
                               *self._passthrough_args()], cwd=side.root, capture_output=True, text=True,
                              env=side.environ(), timeout=self.llm.settings["worker_timeout"])
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

    # -- each planned test's turn in the test loop -------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        decision = self.decisions.get(item.nodeid)
        if decision is None:
            return None
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        setup = self._report(item, "setup", lambda: pytest.skip(decision.skip) if decision.skip else None)
        if setup.passed:
            self._report(item, "call", lambda: _call(decision))
        self._report(item, "teardown", lambda: None)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _report(self, item: pytest.Item, when: str, func: Any) -> pytest.TestReport:
        call = pytest.CallInfo.from_call(func, when=when, reraise=(pytest.exit.Exception, KeyboardInterrupt))
        report: pytest.TestReport = item.ihook.pytest_runtest_makereport(item=item, call=call)
        item.ihook.pytest_runtest_logreport(report=report)
        return report


@contextlib.contextmanager
def _sigterm_interrupts() -> Any:
    """While workers run, SIGTERM (a cancelled CI job) stops like Ctrl-C: workers stopped, worktree removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _call(decision: Decision) -> None:
    __tracebackhide__ = True
    for caught in decision.warnings:
        warnings.warn_explicit(caught.message, caught.category, caught.filename, caught.lineno)
    if decision.failure:
        pytest.fail(decision.failure, pytrace=False)


def _gate_rows(merged: Merged, scenario: Scenario, alpha: float) -> Any:
    return lambda result, baseline: judge.compare(result, baseline, scenario, splits_prefill=merged.splits_prefill,
                                                  alpha=alpha, max_load=scenario.max_load,
                                                  counters_better=merged.counters_better)


def _by_key(nodeid: str, runs: list[WorkerRun]) -> dict[str, Merged]:
    parts: dict[str, list[Any]] = defaultdict(list)
    for run in runs:
        for m in run.measured:
            if m.nodeid == nodeid:
                parts[m.result.key].append((m.result, m.splits_prefill, m.counters_better))
    return {key: merge_processes(found) for key, found in parts.items()}


def check_settings(llm: LLMPerfSession) -> None:
    """Refuse up front what cannot work: an update against a ref, too few processes for alpha."""
    settings = llm.settings
    if settings["compare"] and (settings["update"] or settings["update_missing"]):
        raise pytest.UsageError("llmperf: --llmperf-compare measures against a git ref and writes no baselines; "
                                "drop --llmperf-update / --llmperf-update-missing")
    n = llm.processes
    if n > 1 and llm.mode == "gate":
        cap = settings["max_processes"] or 2 * n
        try:
            check_attainable(n, settings["alpha"] / len(looks_for(n, max(cap, n))), "--llmperf-processes",
                             paired=bool(settings["compare"]))
        except ScenarioError as exc:
            raise pytest.UsageError(f"llmperf: {exc}") from None
    elif settings["compare"]:
        raise pytest.UsageError("llmperf: --llmperf-compare needs worker processes: leave --llmperf-processes "
                                "at auto or set at least 8")
