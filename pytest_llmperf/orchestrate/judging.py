"""From a measured benchmark to its outcome: record it (update modes), or find its reference and judge it look
by look, and the messages that fail its test.

The `llmperf` fixture (runs measured in this process) and the controller of worker processes both end here,
so a benchmark is judged and worded the same way however it was measured. The outcome carries its warnings;
the caller emits them at the test's own location.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..judge.baseline_entry import too_few_units
from ..judge.baseline_layout import machine_slug
from ..judge.baselines import BaselineEntry, BaselineError, Lookup, now_iso
from ..judge.fingerprint import hardware_mismatch, software_drift
from ..judge.outputs import unchecked
from ..judge.procedure import Schedule
from ..judge.quality import admitting, request_failures
from ..judge.rows import Reference, instruction_rows, judge_rows, outputs_messages, row_message
from ..judge.verdicts import Kind, Outcome, Row, Status, Verdict, reason_of
from ..measure.records import BenchmarkResult
from ..measure.scenario import Scenario
from .session import LLMPerfSession


def record(perf_session: LLMPerfSession, result: BenchmarkResult, scenario: Scenario, lookup: Lookup) -> Outcome:
    """Write the baseline of a measured benchmark (--llmperf-update, or --llmperf-update-missing without one);
    never a broken or disturbed measurement."""
    errors = batch_errors(result)
    busy = [
        f"batch size {b.batch_size}: other processes used {b.foreign_load:.2f} cores while it was measured "
        f"(limit {scenario.max_load:g}, --llmperf-max-load)"
        for b in result.batches
        if b.foreign_load is not None and b.foreign_load > scenario.max_load
    ]
    if busy:
        errors = [busy_update_message(perf_session, result, busy), *errors]
    if lookup.error:
        return Outcome(
            result,
            Status.REFUSED,
            errors=[lookup.error],
            baseline_path=str(lookup.path),
            reason="baseline file unusable",
        )
    if errors:  # the user asked for a baseline and gets none: that fails the test
        return Outcome(
            result,
            Status.REFUSED,
            errors=errors,
            baseline_path=str(lookup.path),
            reason="machine busy, baseline not written" if busy else "measurement failed, not written",
        )
    entry = BaselineEntry.of_result(result, fingerprint=perf_session.fingerprint, created=now_iso())
    small = too_few_units(entry.key, entry.unit, entry.values)
    if small:  # a baseline that could never decide a verdict
        return Outcome(
            result,
            Status.REFUSED,
            errors=[
                f"not written to {lookup.path}: {small}. Record more runs (runs=, "
                "--llmperf-runs) or worker processes (--llmperf-processes)"
            ],
            baseline_path=str(lookup.path),
            reason="too few runs, baseline not written",
        )
    try:
        perf_session.store.write(result.module, entry)
    except BaselineError as exc:
        return Outcome(
            result, Status.REFUSED, errors=[str(exc)], baseline_path=str(lookup.path), reason="baseline not written"
        )
    status = Status.UPDATED if lookup.entry is not None else Status.CREATED
    return Outcome(result, status, baseline_path=str(lookup.path))


def stored_reference(perf_session: LLMPerfSession, result: BenchmarkResult, lookup: Lookup) -> Reference | Outcome:
    """The stored baseline to judge against, or the outcome when there is none to compare with."""
    path = str(lookup.path)
    if lookup.error:
        return Outcome(
            result, Status.REFUSED, errors=[lookup.error], baseline_path=path, reason="baseline file unusable"
        )
    if lookup.entry is None:
        hint = (
            f"no baseline for {result.key} in {path} (device {perf_session.device}). "
            f"{lookup.note + ' ' if lookup.note else ''}Create it with:\n  "
            f"{perf_session.rerun(result.nodeid, update=True)}"
        )
        if lookup.elsewhere:  # measured, but on other hardware: as a CPU mismatch
            return Outcome(
                result, Status.REFUSED, messages=[hint], baseline_path=path, reason="recorded on other machines only"
            )
        return Outcome(result, Status.MISSING, messages=[hint], baseline_path=path)
    mismatch = hardware_mismatch(lookup.entry.fingerprint, perf_session.fingerprint)
    if mismatch is None:
        small = too_few_units(lookup.entry.key, lookup.entry.unit, lookup.entry.values)
        if small:  # every verdict would be inconclusive: the baseline, not this run, lacks the units
            return Outcome(
                result,
                Status.REFUSED,
                errors=[f"baseline {path}: {small}. Re-record it: {perf_session.rerun(result.nodeid, update=True)}"],
                baseline_path=path,
                reason="baseline too small",
            )
        return Reference(lookup.entry, "the baseline")
    kind, was, now = mismatch
    # The hint names a set of this hardware's own: an update under the same name would replace the other
    # machine's baselines, and gating under it again gives this same refusal.
    # (the same slug as this machine's own set would get; for a GPU, from its name)
    own = {"machine": machine_slug(perf_session.fingerprint if kind == "cpu" else {"cpu_model": now})}
    text = (
        f"{result.key}: baseline {path} was measured on {kind.upper()} {was!r}, this machine has {now!r}; not "
        f"compared. Record baselines of this hardware as a set of its own:\n"
        f"  {perf_session.rerun(result.nodeid, update=True, replace=own)}\n"
        f"then gate with {' '.join(f'--llmperf-{k}={v}' for k, v in own.items())}"
    )
    # A baseline from another GPU is a misconfigured target (--llmperf-device names the GPU model): it fails the
    # test. Another CPU (a set named with --llmperf-machine on other hardware) is refused, as fail_on says.
    return Outcome(
        result,
        Status.REFUSED,
        messages=[] if kind == "gpu" else [text],
        errors=[text] if kind == "gpu" else [],
        baseline_path=path,
        drift=software_drift(lookup.entry.fingerprint, perf_session.fingerprint),
        reason=f"baseline from another {kind.upper()}",
    )


def ab_reference(
    result: BenchmarkResult, side: BenchmarkResult | None, label: str, *, exists_on_a: bool
) -> Reference | Outcome:
    """The A side of an A/B comparison to judge against, or a `new` outcome when it has no such benchmark."""
    if side is None:
        why = "measured here only" if exists_on_a else f"not in {label}"
        return Outcome(
            result,
            Status.NEW,
            baseline_path=f"{label}: {why}",
            reason="new test" if not exists_on_a else "measured in the working tree only",
        )
    return Reference(BaselineEntry.of_result(side, created=label), label, side)


def judge(
    perf_session: LLMPerfSession,
    result: BenchmarkResult,
    reference: Reference,
    scenario: Scenario,
    schedule: Schedule | None,
    *,
    final: bool,
    previous: Outcome | None = None,
    family: int | None = None,
) -> Outcome:
    """One look at a benchmark: every row decided so far, the rest undecided (or, `final`, inconclusive).
    `schedule` None: the benchmark was counted, not timed (--llmperf-instructions-only), its rows are its counts."""
    ab = reference.side is not None
    rows = (
        []
        if schedule is None
        else judge_rows(
            result,
            reference,
            scenario,
            splits_prefill=result.splits_prefill,
            schedule=schedule,
            final=final,
            max_load=float("inf") if ab else scenario.max_load,
            counters_better=result.counters_better,
            previous=previous.rows if previous else (),
            family=family,
        )
    )
    rows += instruction_rows(result, reference.entry, scenario, reference.label)  # counted under callgrind
    if ab:
        how = f"compared with {reference.label} in alternating worker processes (--llmperf-compare)"
        intended = how
    else:
        how = f"If the slowdown is intended, update the baseline: {perf_session.rerun(result.nodeid, update=True)}"
        intended = (
            f"If the new outputs are intended, update the baseline: {perf_session.rerun(result.nodeid, update=True)}"
        )
    refused = [r for r in rows if r.verdict == Verdict.REFUSED]
    warnings = (
        [
            f"{result.key}: "
            + "; ".join(f"batch size {r.batch_size}: {r.note}" for r in refused)
            + busy_hint(perf_session, result, reference.entry, scenario.max_load)
        ]
        if refused
        else []
    )
    changed, changed_warnings = changed_outputs(result, rows, scenario.outputs, intended)
    drift = {} if ab else software_drift(reference.entry.fingerprint, perf_session.fingerprint)
    messages = verdict_messages(rows, how, scenario)
    if drift and any(r.verdict == Verdict.REGRESSED for r in rows):  # the change may be a dependency's
        changes = "; ".join(f"{name} {was} -> {now}" for name, (was, now) in sorted(drift.items()))
        messages.insert(-1, f"Software changed since the baseline was recorded: {changes}")
    envs = perf_session.environments if ab else None
    if envs is not None and envs.changes and any(r.verdict == Verdict.REGRESSED for r in rows):
        where = "each side measured in its own environment" if envs.measured else "not measured: code only"
        changes = "; ".join(map(str, envs.changes))
        messages.insert(-1, f"The sides' dependencies differ ({where}): {changes}")
    if (
        not ab
        and any(r.verdict == Verdict.MISSING for r in rows)
        and not any(r.verdict == Verdict.REGRESSED for r in rows)
    ):
        messages = [
            *(row_message(r) for r in rows if r.verdict == Verdict.MISSING),
            f"Record the baseline again, with every batch size and metric the test gates: "
            f"{perf_session.rerun(result.nodeid, update=True)}",
            *messages,
        ]
    return Outcome(
        result,
        Status.COMPARED,
        rows=rows,
        messages=messages,
        baseline_path=(reference.label if ab else str(perf_session.store.path_for(result.module))),
        reference=reference.side,
        changed=changed,
        outputs_unchecked=unchecked(reference.entry.outputs, result.batches),
        drift=drift,
        warnings=[*warnings, *changed_warnings],
        baseline_created="" if ab else reference.entry.created,
    )


def verdict_messages(rows: Sequence[Row], how: str, scenario: Scenario) -> list[str]:
    """What a regressed or inconclusive benchmark says (its test fails with it where --llmperf-fail-on lists
    its kind); invalid values always fail."""
    regressed = [row_message(r) for r in rows if r.verdict == Verdict.REGRESSED]
    inconclusive = [row_message(r) for r in rows if r.verdict == Verdict.INCONCLUSIVE]
    if regressed:  # the inconclusive rows too: the table's cell holds only the head of their note
        return [*regressed, *inconclusive, how]
    if inconclusive:
        return [
            *inconclusive,
            "Measure more units where a row stays undecided (--llmperf-budget in an A/B job, llmperf_max_processes, "
            "or max_runs in one process), or judge it at a wider tolerance (--llmperf-rtol)",
        ]
    return []


def changed_outputs(result: BenchmarkResult, rows: list[Row], mode: str, hint: str) -> tuple[list[str], list[str]]:
    """Generated tokens that changed: (the messages that fail the test, warnings). They fail with outputs=fail,
    unless the server is not declared deterministic (its batching can change its numerics, measure/backend.py)."""
    found = outputs_messages(rows, mode)
    if not found:
        return [], []
    text = f"{result.key}: " + "\n".join(found)
    if mode == "warn" or not result.backend.get("deterministic_outputs", True):
        why = (
            "outputs=warn"
            if mode == "warn"
            else "the server is not declared deterministic; pass "
            "deterministic=True to its fixture to fail on changed outputs"
        )
        return [], [f"{text} (not failing: {why})"]
    return [text, f"{hint}; or let it pass with --llmperf-outputs=warn (a marker's outputs=)"], []


def batch_errors(result: BenchmarkResult) -> list[str]:
    """What fails a test whatever its verdicts: a batch size that failed (not out of memory), and server requests
    that failed while the others of their run completed (never stored as a baseline either)."""
    return [
        *(f"batch size {b.batch_size} failed: {b.error}" for b in result.batches if b.error is not None and not b.oom),
        *request_failures(result),
    ]


def fail_messages(perf_session: LLMPerfSession, outcome: Outcome) -> tuple[list[str], list[str]]:
    """(the messages that fail this test, the warnings it emits). A kind listed in --llmperf-fail-on fails
    with its messages, any other only warns; batch errors, invalid values and changed outputs always fail."""
    fail_on = perf_session.settings.fail_on
    kind = outcome.kind
    errors = [
        *outcome.errors,
        *(e for e in batch_errors(outcome.result) if e not in outcome.errors),
        *(row_message(r) for r in outcome.rows if r.verdict == Verdict.INVALID),
    ]
    warnings = list(outcome.warnings)
    said = outcome.messages or [
        f"{outcome.result.key}: {kind} ({reason_of(outcome)}), and --llmperf-fail-on lists {kind}"
    ]
    if kind in (Kind.REGRESSED, Kind.MISSING, Kind.INCONCLUSIVE, Kind.REFUSED):
        if kind in fail_on:
            return [*said, *(e for e in errors if e not in said), *outcome.changed], warnings
        if outcome.messages:
            warnings.append(
                f"{outcome.result.key}: {kind}, not failing ({kind} is not in --llmperf-fail-on): "
                + "\n".join(outcome.messages)
            )
    return [*errors, *outcome.changed], warnings


def busy_hint(perf_session: LLMPerfSession, result: BenchmarkResult, entry: BaselineEntry, max_load: float) -> str:
    """What to do about batch sizes refused because either side was measured on a busy machine: one
    --llmperf-max-load that admits them all, fewer threads only where they are not already 1."""
    now = [b.foreign_load for b in result.batches if b.foreign_load is not None and b.foreign_load > max_load]
    then = [load for load in entry.foreign_load.values() if load > max_load]
    if now:
        threads = "" if perf_session.threads == 1 else ", use fewer torch threads (-o llmperf_threads=1)"
        return (
            f". Re-run when the other work has stopped, allow it with --llmperf-max-load={admitting(max(now)):g} "
            f"(noisier verdicts){threads}, or measure base and change in one session (--llmperf-compare REF)"
        )
    if then:
        return (
            f". Re-record the baseline with --llmperf-update on a quiet machine, or gate with "
            f"--llmperf-max-load={admitting(max(then)):g} to accept it"
        )
    return ""


def busy_update_message(perf_session: LLMPerfSession, result: BenchmarkResult, busy: list[str]) -> str:
    """Why an update was refused on a busy machine, and what to run instead."""
    worst = max(b.foreign_load or 0.0 for b in result.batches)
    allow = perf_session.rerun(result.nodeid, update=True, replace={"max_load": admitting(worst)})
    fewer = (
        ""
        if perf_session.threads == 1
        else "; or leave more of the machine to others with fewer torch threads: "
        + perf_session.rerun(result.nodeid, update=True, replace={"threads": 1})
    )
    return (
        f"not written: a baseline measured on a busy machine would gate against noise ({'; '.join(busy)}). "
        f"Instead: re-run when the other work has stopped; or accept this much load (the baseline then carries "
        f"its noise): {allow}{fewer}; or judge a change without stored baselines, base and change measured in one "
        f"session (--llmperf-compare REF)"
    )
