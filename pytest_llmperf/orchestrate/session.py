"""The session object (kept in `config.stash`) and the per-test `llmperf` fixture object.

`Benchmark.measure(backend)` is the whole loop for one test: scenario from the marker and options,
measure, compare with the baseline (or write it), settle inconclusive verdicts with more runs, and
fail the test with an actionable message on a regression.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ..judge import gate
from ..judge import verdicts as judge
from ..measure import runner
from ..report import progress
from ..measure.backend import Backend
from ..judge.baselines import BaselineEntry, BaselineStore
from ..judge.baseline_layout import machine_slug
from ..judge.outputs import CHANGED
from ..judge.environment import cpu_identity, detect_device, fingerprint
from ..backends.models import resolve_model
from .hints import rerun_command
from ..judge.sequential import smallest_processes
from ..measure.metrics import METRICS
from .worker import WorkerRecorder
from .options import Settings
from ..measure.records import BenchmarkResult
from ..measure.scenario import ScenarioError, build_scenario, check_marker_kwargs, check_metrics
from .judging import Outcome, fail_on_messages, judge_outcome


#: Worker processes per benchmark when --llmperf-processes is auto, per target class (docs/noise.md).
DEFAULT_PROCESSES = {"cpu": 8, "gpu": 5}


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
                if verdicts and verdicts <= {judge.REFUSED, judge.UNGATED}:  # nothing tested (judged.kind_of)
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
