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
from .judge.environment import cpu_identity, detect_device, fingerprint, hardware_mismatch, software_drift
from .measure.metrics import values_by_process
from .backends.models import resolve_model
from .judge.sequential import smallest_processes
from .measure.worker import WorkerRecorder
from .options import Settings
from .measure.records import BatchResult, BenchmarkResult
from .measure.scenario import Scenario, ScenarioError, build_scenario, check_marker_kwargs


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

    def processes_for(self, item: pytest.Item) -> int:
        marker = item.get_closest_marker("llmperf")
        if marker is not None and marker.kwargs.get("processes") is not None:
            return int(marker.kwargs["processes"])
        return self.processes

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
            self._fingerprint = {**fingerprint(self.settings.rootdir), "malloc": self.malloc}
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
                elif gate.IMPROVED in verdicts:
                    counts["improved"] += 1
                else:
                    counts["passed"] += 1
                counts["inconclusive"] += gate.INCONCLUSIVE in verdicts
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
                                    "max_load"}
        if unknown:
            raise ScenarioError(f"llmperf.measure() got unknown setting(s) {', '.join(sorted(unknown))}")
        settings = self.session.settings.for_test({**self.marker_kwargs, **overrides})
        settings.pop("devices", None)
        scenario = build_scenario(settings)
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
        if outcome.messages:
            pytest.fail("\n".join(outcome.messages), pytrace=False)
        return result

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
    failed_batches = [b for b in result.batches if b.error is not None and not b.oom]
    errors = [f"batch size {b.batch_size} failed: {b.error}" for b in failed_batches]
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
                errors = [f"not written: a baseline measured on a busy machine would gate against noise. "
                          f"Re-run the update when the machine is quiet. {'; '.join(busy)}", *errors]
            if not errors:  # never store a broken or disturbed measurement as the new normal
                session.store.write(module, baseline_entry(session, result))
                if result.backend.get("backend") == "jetstream":  # seed 002's dated log gains its rows
                    throughput_log.append_rows(Path(session.settings["report_dir"]), session.device,
                                               str(result.backend.get("model")),
                                               throughput_log.rows_from_result(result, now_iso()[:10]))
            return Outcome(result, status if not errors else "refused", messages=errors, baseline_path=path)
    except BaselineError as exc:
        return Outcome(result, "refused", messages=[str(exc), *errors])
    if baseline is None:
        note = session.store.missing_note(module)
        hint = (f"no baseline for {result.key} in {path} (device {session.device}). {note + ' ' if note else ''}"
                f"Create it with:\n  pytest '{result.nodeid}' {session.store.rerun} --llmperf-update")
        if session.store.recorded_elsewhere(module):  # measured, but on other hardware: as a CPU mismatch
            warnings.warn(PytestLLMPerfWarning(hint), stacklevel=2)
            return Outcome(result, "refused", messages=errors, baseline_path=path)
        return Outcome(result, "missing", messages=[hint, *errors], baseline_path=path)
    mismatch = hardware_mismatch(baseline.fingerprint, session.fingerprint)
    drift = software_drift(baseline.fingerprint, session.fingerprint)
    if mismatch is not None:
        kind, was, now = mismatch
        text = (f"{result.key}: baseline {path} was measured on {kind.upper()} {was!r}, this machine has "
                f"{now!r}; not compared. Re-create it here with --llmperf-update, or give this hardware a "
                f"set of its own (--llmperf-machine NAME; --llmperf-device NAME for another GPU)")
        if kind == "gpu":
            return Outcome(result, "refused", messages=[text, *errors], drift=drift, baseline_path=path)
        warnings.warn(PytestLLMPerfWarning(text), stacklevel=2)
        return Outcome(result, "refused", messages=errors, drift=drift, baseline_path=path)
    rows = gate_rows(result, baseline)
    refused = [r for r in rows if r.verdict == judge.REFUSED]
    if refused:
        warnings.warn(PytestLLMPerfWarning(f"{result.key}: " + "; ".join(
            f"batch size {r.batch_size}: {r.note}" for r in refused)), stacklevel=2)
    messages = [judge.regression_message(r, scenario.alpha) for r in rows if r.verdict == gate.REGRESSED]
    if messages:
        messages.append(f"If the slowdown is intended, update the baseline: pytest '{result.nodeid}' "
                        f"--llmperf-device={session.device} --llmperf-update")
    return Outcome(result, "compared", rows=rows, messages=[*messages, *errors], drift=drift, baseline_path=path)


def baseline_entry(session: LLMPerfSession, result: BenchmarkResult) -> BaselineEntry:
    fp = session.fingerprint
    return BaselineEntry(
        key=result.key,
        runs={b.batch_size: values_by_process(b.samples) for b in result.batches if b.ok},
        unit=unit_of_result(result),
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


def marker_devices(item: pytest.Item) -> list[str] | None:
    marker = item.get_closest_marker("llmperf")
    if marker is None:
        return None
    devices: Mapping[str, Any] | Any = marker.kwargs.get("devices")
    if devices is None:
        return None
    return [devices] if isinstance(devices, str) else list(devices)
