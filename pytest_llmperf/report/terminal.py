"""What the terminal shows at the end: the `llmperf: <device>` section of the summary (the header lines are
orchestrate/session.py).

The section opens with the judged line (a run that judged nothing says so first, in red), then what fails the
run, the verdict table, one count per kind (each benchmark counted once), run quality and the hints.
It reads a `SessionSummary` (report/summary.py); whether the run fails is the judge's (verdicts.run_failures).
"""

from __future__ import annotations

import shlex
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from ..judge.quality import admitting, quality_notes
from ..judge.verdicts import JUDGED, NOT_JUDGED, Kind, Outcome, Verdict, counts, reason_of, run_failures
from .markdown import json_document
from .summary import SessionSummary, Written
from .tables import table
from .verdict_table import table_rows


def counts_line(found: Mapping[Kind, int]) -> str:
    """`2 passed, 1 regressed, ...`: every kind that occurred, judged kinds first, each benchmark once."""
    order = [*JUDGED, *NOT_JUDGED]
    return ", ".join(f"{found[k]} {k}" for k in order if found.get(k)) or "no benchmark measured"


def judged_line(session: SessionSummary) -> tuple[str, str]:
    """(`llmperf: judged J of N benchmarks (...)`, markup colour: green, yellow or red)."""
    outcomes: Sequence[Outcome] = session.outcomes
    kinds = [o.kind for o in outcomes]
    judged = sum(k in JUDGED for k in kinds)
    parts = []
    for kind in NOT_JUDGED:
        reasons = Counter(reason_of(o) for o, k in zip(outcomes, kinds) if k == kind)
        if reasons:
            detail = ", ".join(f"{n} {r}" if len(reasons) > 1 else r for r, n in reasons.most_common())
            parts.append(f"{sum(reasons.values())} {kind}: {detail}")
    skipped, invalid = session.skipped_here, session.invalid_here
    if skipped:
        parts.append(f"{skipped} skipped: they run on other devices than {session.device}")
    if invalid:
        parts.append(f"{invalid} not run: settings that cannot work")
    if kinds.count(Kind.INCONCLUSIVE):
        parts.append(f"{kinds.count(Kind.INCONCLUSIVE)} of the judged inconclusive: undecided at their last look")
    total = len(outcomes) + skipped + invalid
    line = f"llmperf: judged {judged} of {total} benchmarks" + (f" ({'; '.join(parts)})" if parts else "")
    if not session.gating and all(k in (Kind.CREATED, Kind.UPDATED) for k in kinds):
        return line, "green"  # recording baselines judges nothing, on purpose
    if judged == 0:
        return line + ": nothing was compared", "red"
    return line, "green" if judged == total and not kinds.count(Kind.INCONCLUSIVE) else "yellow"


def failing_line(session: SessionSummary) -> str | None:
    found = run_failures(session.outcomes, session.fail_on, gating=session.gating, selected=session.selected)
    if not found:
        return None
    return f"llmperf: the run fails: {', '.join(found)} (--llmperf-fail-on={','.join(session.fail_on) or 'none'})"


def summary_lines(session: SessionSummary) -> list[str]:
    # the same rows, units, ratio direction and order as the markdown report's verdict table
    document = json_document(
        session.device, "", {}, {}, [o.result for o in session.outcomes], session.outcomes, counts(session.outcomes)
    )
    header, rows = table_rows(document, with_measured=False)
    lines = table(header, rows, markdown=False).splitlines() if rows else []
    found = counts(session.outcomes)
    lines.append(counts_line(found))
    busy = busy_line(session)
    if busy:
        lines.append(busy)
    lines += [f"run quality: {o.result.key}: {note}" for o in session.outcomes for note in quality_notes(o.result)]
    used = session.processes_used
    if used:
        lines.append(f"processes per side: {_spread(used)} over {len(used)} benchmark test(s)")
    unchecked = [o.result.key for o in session.outcomes if o.outputs_unchecked]
    if unchecked:
        lines.append(
            f"outputs not compared for {len(unchecked)} benchmark(s), whose baseline (or compared ref) holds "
            f"no generated tokens (recorded before they were stored; --llmperf-update records them): "
            + ", ".join(unchecked)
        )
    age = baseline_age(session.outcomes)
    if age:
        lines.append(age)
    drift = {k: v for o in session.outcomes for k, v in o.drift.items()}
    if drift:
        lines.append(
            "software drift since the baselines: "
            + "; ".join(f"{k} {was} -> {now}" for k, (was, now) in sorted(drift.items()))
        )
    if session.compared_to and found.get(Kind.REGRESSED):
        lines.append(
            f"compared with {session.compared_to}: re-run the same command to measure again; a slowdown the "
            "change intends is accepted by merging it (the next comparison starts from it)"
        )
        lines += bisect_line(session)
    elif found.get(Kind.REGRESSED) or found.get(Kind.MISSING):
        lines.append(
            f"re-run: {session.rerun()} (add --llmperf-update if the change is intended, then commit the "
            "changed baselines/ files)"
        )
    return lines


def bisect_line(session: SessionSummary) -> list[str]:
    """The command that finds which commit between the A/B job's two did it (docs/bisect.md): a clean working tree
    on another commit than the one compared with; where the sides' environments differed, also the one that finds
    which of the changed packages did it (`--packages`)."""
    git = session.fingerprint.get("git") or {}
    head, base = git.get("commit"), session.compared_commit
    if not head or not base or head == base or git.get("dirty"):
        return []
    tests = sorted({o.result.nodeid for o in session.outcomes if o.kind == Kind.REGRESSED})
    options = shlex.split(session.rerun())[1:]  # the options given, less pytest; bisect sets --llmperf-compare
    options = [o for o in options if o.partition("=")[0] != "--llmperf-compare"]
    commits = f"pytest-llmperf bisect {base[:12]} {head[:12]}"
    lines = [f"find the commit that did it: {commits} -- {shlex.join([*tests, *options])}"]
    if session.changed_packages:  # --packages builds GOOD's environment itself: a prepared base interpreter is refused
        own = [o for o in options if o.partition("=")[0] != "--llmperf-base-python"]
        lines.append(
            f"find the package that did it ({len(session.changed_packages)} changed): {commits} --packages -- "
            + shlex.join([*tests, *own])
        )
    return lines


def baseline_age(outcomes: Sequence[Outcome], now: datetime | None = None) -> str | None:
    """How old the stored baselines judged against are: drift between sessions reads exactly like a slowdown, and a
    baseline aged past its tolerance within hours on a shared runner, so its age is said (docs/notes/noise.md, "What
    shipped, and what is not met"); pull requests are better judged A/B (--llmperf-compare)."""
    found = []
    for outcome in outcomes:
        try:
            found.append((datetime.fromisoformat(outcome.baseline_created), outcome.result.key))
        except ValueError:  # A/B, recorded, or a baseline without a date
            continue
    if not found:
        return None
    now = now or datetime.now(timezone.utc)
    oldest, key = min(found)
    newest = max(found)[0]
    span = _ago(now - newest) + ("" if _ago(now - newest) == _ago(now - oldest) else f" to {_ago(now - oldest)}")
    return (
        f"stored baselines recorded {span} ago (oldest: {key}, {oldest.date().isoformat()}); a baseline ages "
        "by the runner's drift between sessions: judge pull requests A/B (--llmperf-compare)"
    )


def _ago(delta: timedelta) -> str:
    seconds = max(delta.total_seconds(), 0)
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return "seconds"


def busy_line(session: SessionSummary) -> str | None:
    """One --llmperf-max-load that admits every batch size refused because the machine is busy now (each test's
    warning names its own), so a re-run needs one value."""
    loads = [
        batch.foreign_load
        for o in session.outcomes
        for r in o.rows
        if r.verdict == Verdict.REFUSED
        and r.note.startswith("machine busy")
        and (batch := o.result.batch(r.batch_size)) is not None
        and batch.foreign_load is not None
    ]
    if not loads:
        return None
    return (
        f"machine busy: {len(loads)} batch size(s) refused, other processes used up to {max(loads):.2f} cores. "
        f"Re-run when the other work has stopped, or accept the load for all of them (noisier verdicts): "
        f"{session.rerun(replace={'max_load': admitting(max(loads))})}"
    )


def _spread(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return f"median {statistics.median(values):g}" + (f", {low}-{high}" if low != high else "")


def write_summary(terminalreporter: Any, session: SessionSummary, written: Written) -> None:
    """The `llmperf: <device>` section of pytest's terminal summary."""
    terminalreporter.write_sep("=", f"llmperf: {session.device}")
    line, colour = judged_line(session)  # first: a run that judged nothing must say so
    terminalreporter.write_line(line, **{colour: True, "bold": colour != "green"})
    for text in session.environment_lines:  # "DEPENDENCY CHANGES NOT MEASURED" in red
        terminalreporter.write_line(text, red="NOT MEASURED" in text)
    fails = failing_line(session)
    if fails:
        terminalreporter.write_line(fails, red=True, bold=True)
    if session.outcomes:
        for text in summary_lines(session):
            terminalreporter.write_line(text)
    for path in written.paths:
        terminalreporter.write_line(f"report: {path}")
    for text in [*written.errors, *written.warnings]:
        terminalreporter.write_line(text, red=True)
