"""The session object (kept in `config.stash`) and the per-test `llmperf` fixture object.

`Benchmark.measure(backend)` is the whole loop for one test: scenario from the marker and options,
measure, compare with the baseline (or write it), settle inconclusive verdicts with more runs, and
fail the test with an actionable message on a regression.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from .judge import gate
from .judge import verdicts as judge
from .measure import runner
from .report import progress, throughput_log
from .backends.base import Backend
from .judge.baselines import BaselineEntry, BaselineError, BaselineStore, now_iso
from .judge.baseline_layout import machine_slug
from .judge.outputs import CHANGED, outputs_by_batch, unchecked
from .judge.quality import request_failures
from .judge.environment import cpu_identity, detect_device, fingerprint, hardware_mismatch, software_drift
from .measure.metrics import values_by_process
from .backends.models import resolve_model
from .hints import rerun_command
from .judge.sequential import smallest_processes
from .judged import INCONCLUSIVE, MISSING, REFUSED, REGRESSED, kind_of, reason_of
from .measure.metrics import METRICS
from .measure.worker import WorkerRecorder
from .options import Settings
from .measure.records import BenchmarkResult
from .measure.scenario import Scenario, ScenarioError, build_scenario, check_marker_kwargs, check_metrics


#: Worker processes per benchmark when --llmperf-processes is auto, per target class (docs/noise.md).
DEFAULT_PROCESSES = {"cpu": 8, "gpu": 5}


class PytestLLMPerfWarning(pytest.PytestWarning):
    """A warning from pytest-llmperf (e.g. a baseline from another CPU model, not compared)."""


@dataclass
class Outcome:
    """What happened to one benchmark: its status and the verdict rows."""

    result: BenchmarkResult
    status: str  # compared | created | updated | refused | missing
    rows: list[judge.Row] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    drift: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    baseline_path: str = ""
    reference: BenchmarkResult | None = None  # the A side of an A/B comparison, every run of it
    reason: str = ""  # why nothing was judged (refused), for the summary's judged line
    changed: list[str] = field(default_factory=list)  # generated tokens that changed, failing (--llmperf-outputs)
    outputs_unchecked: bool = False  # outputs measured, but the baseline (or the ref) holds none to compare with


class LLMPerfSession:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.device_given = settings["device"] is not None
        self.device: str = settings["device"] or detect_device()
        self.store = baseline_store(settings, self.device)
        check_output_paths(settings)
        self.written: list[Path] = []
        self.outcomes: list[Outcome] = []
        self.selected = 0  # llmperf tests selected in this session
        self.malloc = "system (no benchmark selected)"  # what pytest_llmperf.measure.allocator did, for the fingerprint
        self._fingerprint: dict[str, Any] | None = None
        self.recorder: WorkerRecorder | None = None  # set in a worker process: results go to the controller
        self.compared_to: str | None = None  # the git ref of an A/B comparison, once checked out

    @property
    def processes(self) -> int:
        """Worker processes per benchmark: the option, or the measured default for the target class."""
        value = self.settings["processes"]
        if value != "auto":
            return int(value)
        n = DEFAULT_PROCESSES["cpu" if self.device == "cpu" else "gpu"]
        if self.settings["compare"]:  # the paired test needs 2^n > looks / alpha (8 pairs for 0.01 over 2 looks)
            n = max(n, smallest_processes(self.settings["alpha"] / 2, paired=True))
        return n

    @property
    def runs_are_the_unit(self) -> bool:
        """The gate tests runs (measured in this process), not worker processes' medians."""
        return self.recorder is None and not self.settings["compare"] and self.processes == 1

    def processes_for(self, item: pytest.Item) -> int:
        marker = item.get_closest_marker("llmperf")
        if marker is not None and marker.kwargs.get("processes") is not None:
            return int(marker.kwargs["processes"])
        return self.processes

    @property
    def threads(self) -> int | None:
        """torch threads while measuring: the option, or auto = 1 on the cpu target (its timings at 2 threads
        on a shared 2-core machine spread 2-3x wider, docs/noise.md) and torch's default on a GPU target."""
        value = self.settings["threads"]
        if value == "auto":
            return 1 if self.device == "cpu" else None
        return int(value)

    def threads_text(self) -> str:
        given = self.settings["threads"]
        return f"{self.threads if self.threads is not None else 'torch default'}" + (
            f" (auto: {self.device} target)" if given == "auto" else "")

    def rerun(self, nodeid: str | None = None, **kwargs: Any) -> str:
        return rerun_command(self.settings, self.device, nodeid, **kwargs)

    @property
    def mode(self) -> str:
        if self.settings["update"]:
            return "update"
        if self.settings["update_missing"]:
            return "update-missing"
        return "gate"

    @property
    def fingerprint(self) -> dict[str, Any]:
        if self._fingerprint is None:
            self._fingerprint = {**fingerprint(self.settings.rootdir), "malloc": self.malloc,
                                 "threads": self.threads_text()}
        return self._fingerprint

    def counts(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for outcome in self.outcomes:
            if outcome.status == "compared":
                verdicts = {r.verdict for r in outcome.rows}
                if verdicts == {judge.REFUSED}:
                    counts["refused"] += 1
                elif gate.REGRESSED in verdicts:
                    counts["regressed"] += 1
                elif outcome.changed:  # its timings passed, but it fails: the tokens it generates changed
                    pass
                elif gate.IMPROVED in verdicts:
                    counts["improved"] += 1
                else:
                    counts["passed"] += 1
                counts["inconclusive"] += gate.INCONCLUSIVE in verdicts
                counts["outputs changed"] += CHANGED in verdicts
            else:
                counts[outcome.status] += 1
        return counts

    def resolve_model(self, name: str, *, build_device: str = "cpu") -> Path:
        cache = self.settings["cache_dir"]
        return resolve_model(name, local_models=self.settings["model"], cache_dir=Path(cache) if cache else None,
                             build_device=build_device)


class Benchmark:
    """The `llmperf` fixture: measures backends for one test and gates them against baselines."""

    def __init__(self, session: LLMPerfSession, item: pytest.Item) -> None:
        self.session = session
        self.item = item
        marker = item.get_closest_marker("llmperf")
        self.marker_kwargs: dict[str, Any] = check_marker_kwargs(marker.args, marker.kwargs) if marker else {}
        self.results: list[BenchmarkResult] = []

    @property
    def device(self) -> str:
        return self.session.device

    @property
    def on_gpu(self) -> bool:
        return self.session.device != "cpu"

    def measure(self, backend: Backend, *, name: str | None = None, **overrides: Any) -> BenchmarkResult:
        """Run this test's scenario on `backend` and gate it. Keyword overrides beat the marker."""
        __tracebackhide__ = True
        unknown = set(overrides) - {"batch_sizes", "sequence_length", "decode_length", "runs", "warmups",
                                    "max_runs", "alpha", "rtol", "metrics", "knobs", "group", "stop_after_oom",
                                    "max_load", "outputs", "memory_rtol"}
        if unknown:
            raise ScenarioError(f"llmperf.measure() got unknown setting(s) {', '.join(sorted(unknown))}")
        settings = self.session.settings.for_test({**self.marker_kwargs, **overrides})
        settings.pop("devices", None)
        threads = self.session.threads  # --llmperf-threads, unless the marker's knobs set threads
        if threads is not None and "threads" in backend.knob_names and "threads" not in settings.get("knobs", {}):
            settings["knobs"] = {**settings.get("knobs", {}), "threads": threads}
        try:
            scenario = build_scenario(settings, check_runs=self.session.runs_are_the_unit)
            check_metrics(scenario.metrics, [*METRICS, *getattr(backend, "counters_better", {})], backend.kind)
        except ScenarioError as exc:
            pytest.fail(f"{self.item.nodeid}: {exc}", pytrace=False)
        module = self.item.nodeid.split("::", 1)[0]
        key = self.item.nodeid.split("::", 1)[1] if "::" in self.item.nodeid else self.item.name
        if name:
            key = f"{key}::{name}"
        if any(r.key == key for r in self.results):
            raise ScenarioError(f"{key} was measured twice in one test; pass name= to tell the measurements apart")
        with progress.benchmark(self.item.config, self.item.nodeid, key, scenario.batch_sizes) as on_run:
            result = runner.measure(backend, scenario, key=key, nodeid=self.item.nodeid, module=module, on_run=on_run)
        self.results.append(result)
        if self.session.recorder is not None:  # a worker process: the controller judges
            self.session.recorder.record_result(self.item.nodeid, result, splits_prefill=backend.splits_prefill,
                                                counters_better=getattr(backend, "counters_better", None))
            return result
        outcome = self._judge(result, scenario, backend, module)
        self.session.outcomes.append(outcome)
        messages = self._apply_fail_on(outcome, result)
        if messages:
            pytest.fail("\n".join(messages), pytrace=False)
        return result

    def _apply_fail_on(self, outcome: Outcome, result: BenchmarkResult) -> list[str]:
        return fail_on_messages(self.session, outcome, result)

    def _judge(self, result: BenchmarkResult, scenario: Any, backend: Backend, module: str) -> Outcome:
        return judge_outcome(self.session, result, scenario,
                             lambda res, baseline: self._gate(res, baseline, scenario, backend))

    def _gate(self, result: BenchmarkResult, baseline: BaselineEntry, scenario: Any, backend: Backend) -> list[judge.Row]:
        """Two looks: the first runs, then, where a batch size is flagged (regressed or inconclusive), a fresh
        set of runs judged on its own. A regression must show in both; each look uses alpha/2, so a
        transient disturbance (another process compiling) rarely fails a test and the overall false-alarm
        rate stays at or under alpha."""
        extra = min(scenario.runs, scenario.max_runs - scenario.runs)
        alpha = scenario.alpha / 2 if extra > 0 else scenario.alpha
        compare = lambda res: judge.compare(res, baseline, scenario, splits_prefill=backend.splits_prefill,  # noqa: E731
                                            alpha=alpha, max_load=scenario.max_load,
                                            counters_better=getattr(backend, "counters_better", None))
        first = compare(result)
        flagged = judge.flagged_batches(first)
        if not flagged or extra <= 0:
            return first
        fresh_batches = []
        with progress.benchmark(self.item.config, self.item.nodeid, f"{result.key} (second look)", flagged) as on_run:
            for batch_size in flagged:
                fresh = runner.fresh_runs(backend, scenario, batch_size, extra, on_run=on_run)
                result.batch(batch_size).samples.extend(fresh.samples)  # the report shows every run taken
                fresh_batches.append(fresh)
        second = compare(replace(result, batches=fresh_batches))
        return judge.confirm(first, second, flagged)

    def model(self, name: str) -> Path:
        """The local directory of a model name (embedded, mapped with --llmperf-model, or a path)."""
        return self.session.resolve_model(name)


Gate = Callable[[BenchmarkResult, BaselineEntry], "list[judge.Row]"]


def judge_outcome(session: LLMPerfSession, result: BenchmarkResult, scenario: Scenario, gate_rows: Gate) -> Outcome:
    """Record (update modes) or judge one measured benchmark against the stored baseline. `gate_rows`
    compares it with its baseline: in-process with a second look of fresh runs, or on the per-process
    values that worker processes reported."""
    errors = batch_errors(result)
    module = result.module
    try:
        baseline = session.store.get(module, result.key)
        path = str(session.store.path_for(module))
        if session.mode == "update" or (session.mode == "update-missing" and baseline is None):
            status = "updated" if baseline is not None else "created"
            max_load = scenario.max_load
            busy = [f"batch size {b.batch_size}: other processes used {b.foreign_load:.2f} cores while it was "
                    f"measured (limit {max_load:g}, --llmperf-max-load)" for b in result.batches
                    if b.foreign_load is not None and b.foreign_load > max_load]
            if busy:
                errors = [busy_update_message(session, result.nodeid, busy, result), *errors]
            if not errors:  # never store a broken or disturbed measurement as the new normal
                session.store.write(module, baseline_entry(session, result))
                if result.backend.get("backend") == "jetstream":  # seed 002's dated log gains its rows
                    throughput_log.append_rows(Path(session.settings["report_dir"]), session.device,
                                               str(result.backend.get("model")),
                                               throughput_log.rows_from_result(result, now_iso()[:10]))
            return Outcome(result, status if not errors else "refused", messages=errors, baseline_path=path,
                           reason="machine busy, baseline not written" if busy else "")
    except BaselineError as exc:
        return Outcome(result, "refused", messages=[str(exc), *errors], reason="baseline file unusable")
    if baseline is None:
        note = session.store.missing_note(module)
        hint = (f"no baseline for {result.key} in {path} (device {session.device}). {note + ' ' if note else ''}"
                f"Create it with:\n  {session.rerun(result.nodeid, update=True)}")
        if session.store.recorded_elsewhere(module):  # measured, but on other hardware: as a CPU mismatch
            warnings.warn(PytestLLMPerfWarning(hint), stacklevel=2)
            return Outcome(result, "refused", messages=errors, baseline_path=path,
                           reason="recorded on other machines only")
        return Outcome(result, "missing", messages=[hint, *errors], baseline_path=path)
    mismatch = hardware_mismatch(baseline.fingerprint, session.fingerprint)
    drift = software_drift(baseline.fingerprint, session.fingerprint)
    if mismatch is not None:
        kind, was, now = mismatch
        # The hint names a set of this hardware's own: an update under the same name would replace the other
        # machine's baselines, and gating under it again gives this same refusal.
        own = {"device": f"{session.device}-{_slug(now)}"} if kind == "gpu" else {"machine": _slug(now)}
        text = (f"{result.key}: baseline {path} was measured on {kind.upper()} {was!r}, this machine has "
                f"{now!r}; not compared. Record baselines of this hardware as a set of its own:\n"
                f"  {session.rerun(result.nodeid, update=True, replace=own)}\n"
                f"then gate with {' '.join(f'--llmperf-{k}={v}' for k, v in own.items())}")
        reason = f"baseline from another {kind.upper()}"
        if kind == "gpu":
            return Outcome(result, "refused", messages=[text, *errors], drift=drift, baseline_path=path,
                           reason=reason)
        warnings.warn(PytestLLMPerfWarning(text), stacklevel=2)
        return Outcome(result, "refused", messages=errors, drift=drift, baseline_path=path, reason=reason)
    rows = gate_rows(result, baseline)
    refused = [r for r in rows if r.verdict == judge.REFUSED]
    if refused:
        warnings.warn(PytestLLMPerfWarning(f"{result.key}: " + "; ".join(
            f"batch size {r.batch_size}: {r.note}" for r in refused)), stacklevel=2)
    messages = [judge.regression_message(r, scenario.alpha) for r in rows if r.verdict == gate.REGRESSED]
    if messages:
        messages.append(f"If the slowdown is intended, update the baseline: "
                        f"{session.rerun(result.nodeid, update=True)}")
    changed = changed_outputs(result, rows, scenario.outputs,
                              f"If the new outputs are intended, update the baseline: "
                              f"{session.rerun(result.nodeid, update=True)}")
    return Outcome(result, "compared", rows=rows, messages=[*messages, *errors], drift=drift, baseline_path=path,
                   changed=changed, outputs_unchecked=unchecked(baseline.outputs, result.batches))


def changed_outputs(result: BenchmarkResult, rows: list[judge.Row], mode: str, hint: str) -> list[str]:
    """Generated tokens that changed: the messages that fail the test (outputs=fail), or a warning (warn, or a
    server not declared deterministic: its batching can change its numerics, base/backends/base.py)."""
    found = judge.outputs_messages(rows, mode)
    if not found:
        return []
    text = f"{result.key}: " + "\n".join(found)
    if mode == "warn" or not result.backend.get("deterministic_outputs", True):
        why = ("outputs=warn" if mode == "warn" else "the server is not declared deterministic; pass "
               "deterministic=True to its fixture to fail on changed outputs")
        warnings.warn(PytestLLMPerfWarning(f"{text} (not failing: {why})"), stacklevel=2)
        return []
    return [text, f"{hint}; or let it pass with --llmperf-outputs=warn (a marker's outputs=)"]


def fail_on_messages(session: LLMPerfSession, outcome: Outcome, result: BenchmarkResult) -> list[str]:
    """The messages that fail this test: a regression or missing baseline not listed in --llmperf-fail-on
    only warns; a refused or inconclusive outcome listed there fails with its reason. Changed outputs fail
    by --llmperf-outputs, whatever the timings did."""
    messages = _fail_on_messages(session, outcome, result)
    return [*messages, *(e for e in batch_errors(result) if e not in messages), *outcome.changed]


def batch_errors(result: BenchmarkResult) -> list[str]:
    """What fails a test whatever its verdicts: a batch size that failed (not out of memory), and server requests
    that failed while the others of their run completed (never stored as a baseline either)."""
    return [*(f"batch size {b.batch_size} failed: {b.error}" for b in result.batches
              if b.error is not None and not b.oom), *request_failures(result)]


def _fail_on_messages(session: LLMPerfSession, outcome: Outcome, result: BenchmarkResult) -> list[str]:
    fail_on = session.settings["fail_on"]
    kind = kind_of(outcome)
    errors = batch_errors(result)
    if kind in (REGRESSED, MISSING) and kind not in fail_on:
        verdict = [m for m in outcome.messages if m not in errors]
        if verdict:
            warnings.warn(PytestLLMPerfWarning(f"{result.key}: {kind}, not failing ({kind} is not in "
                                               f"--llmperf-fail-on): " + "\n".join(verdict)), stacklevel=2)
        return errors
    if kind in (REFUSED, INCONCLUSIVE) and kind in fail_on and not outcome.messages:
        rows = [f"batch size {r.batch_size} {r.metric}: {r.note}" for r in outcome.rows if r.verdict == kind]
        detail = "; ".join(rows) or reason_of(outcome)
        return [f"{result.key}: {kind} ({reason_of(outcome)}), and --llmperf-fail-on lists {kind}: nothing was "
                f"judged. {detail}", *errors]
    return outcome.messages


def baseline_entry(session: LLMPerfSession, result: BenchmarkResult) -> BaselineEntry:
    fp = session.fingerprint
    return BaselineEntry(
        key=result.key,
        runs={b.batch_size: values_by_process(b.samples) for b in result.batches if b.ok},
        unit=unit_of_result(result),
        outputs=outputs_by_batch(result.batches),
        errors={b.batch_size: f"{b.status}: {b.error}" for b in result.batches if not b.ok},
        foreign_load={b.batch_size: b.foreign_load for b in result.batches if b.foreign_load is not None},
        fingerprint=fp,
        scenario=result.scenario,
        backend={k: v for k, v in result.backend.items() if k != "model_path"},
        git_commit=fp["git"]["commit"],
        created=now_iso(),
    )


def unit_of_result(result: BenchmarkResult) -> str:
    """"process" when the runs came from several worker processes, else "run"."""
    return "process" if any(len(b.processes) > 1 for b in result.batches if b.ok) else "run"


def baseline_store(settings: Settings, device: str) -> BaselineStore:
    """This machine's baselines: on the cpu target (or with --llmperf-machine) a set of its own."""
    machine = settings["machine"] or (machine_slug(cpu_identity()) if device == "cpu" else None)
    rerun = f"--llmperf-device={device}" + (f" --llmperf-machine={machine}" if settings["machine"] else "")
    return BaselineStore(Path(settings["baseline_dir"]), device, machine, rerun=rerun,
                         updating=bool(settings["update"] or settings["update_missing"]))


def check_output_paths(settings: Settings) -> None:
    """Refuse up front (not after an hour of benchmarks) a report path that is a directory."""
    for name, option in (("json", "--llmperf-json"), ("report_dir", "--llmperf-report-dir")):
        path = settings[name]
        if path and (Path(path).is_dir() if name == "json" else Path(path).exists() and not Path(path).is_dir()):
            what = "a directory; give a file path" if name == "json" else "a file; give a directory"
            raise pytest.UsageError(f"llmperf: {option}={path} is {what}")


def _slug(text: Any) -> str:
    """A short device-name suffix from a CPU or GPU name: 'Intel(R) Xeon(R) Gold 6338' -> 'intel-xeon-gold-6338'."""
    import re

    words = re.sub(r"\((r|tm)\)|cpu|@.*", " ", str(text).lower())
    return "-".join(re.findall(r"[a-z0-9]+", words))[:40] or "this-machine"


def busy_update_message(session: LLMPerfSession, nodeid: str, busy: list[str], result: BenchmarkResult) -> str:
    """Why an update was refused on a busy machine, and what to run instead."""
    worst = max(b.foreign_load or 0.0 for b in result.batches)
    allow = session.rerun(nodeid, update=True, replace={"max_load": float(f"{worst + 0.25:.2g}")})
    fewer = ("" if session.threads == 1 else "; or leave more of the machine to others with fewer torch threads: "
             + session.rerun(nodeid, update=True, replace={"threads": 1}))
    return (f"not written: a baseline measured on a busy machine would gate against noise ({'; '.join(busy)}). "
            f"Instead: re-run when the other work has stopped; or accept this much load (the baseline then "
            f"carries its noise): {allow}{fewer}; or judge a change without stored baselines, base and change "
            f"measured in one session (--llmperf-compare REF)")


def marker_devices(item: pytest.Item) -> list[str] | None:
    marker = item.get_closest_marker("llmperf")
    if marker is None:
        return None
    devices: Mapping[str, Any] | Any = marker.kwargs.get("devices")
    if devices is None:
        return None
    return [devices] if isinstance(devices, str) else list(devices)
