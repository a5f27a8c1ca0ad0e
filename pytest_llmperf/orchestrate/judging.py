"""From a measured benchmark to its outcome: record it (update modes) or judge it against its baseline,
and the messages that fail its test (`--llmperf-fail-on`, `--llmperf-outputs`, failed batches and requests).

Both the in-process path (`session.Benchmark.measure`) and the controller of worker processes
(`controller.py`) end here, so a benchmark is judged and worded the same way whichever measured it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..judge import gate
from ..judge import verdicts as judge
from ..judge.baselines import BaselineEntry, BaselineError, now_iso
from ..judge.environment import hardware_mismatch, software_drift
from ..judge.outputs import outputs_by_batch, unchecked
from ..judge.quality import request_failures
from ..judged import INCONCLUSIVE, MISSING, REFUSED, REGRESSED, kind_of, reason_of
from ..measure.metrics import values_by_process
from ..measure.records import BenchmarkResult
from ..measure.scenario import Scenario
from ..report import throughput_log

if TYPE_CHECKING:
    from .session import LLMPerfSession


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
