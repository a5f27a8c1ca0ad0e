"""What a session judged, and which outcomes fail it (`--llmperf-fail-on`).

A benchmark is judged when it was compared with its baseline and at least one batch size got a verdict;
refused comparisons (another CPU or GPU, a busy machine, a busy baseline), missing baselines and
recordings (--llmperf-update) judged nothing, and the summary's first line says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

REGRESSED, MISSING, REFUSED, INCONCLUSIVE = "regressed", "missing", "refused", "inconclusive"
UNGATED = "ungated"  # judge/verdicts.py: a gated metric that could not be tested
JUDGED, RECORDED = "judged", "recorded"


def kind_of(outcome: Any) -> str:
    """One word per benchmark: regressed, missing, refused, inconclusive, judged (passed or improved) or
    recorded (created/updated)."""
    if outcome.status in ("created", "updated"):
        return RECORDED
    if outcome.status in (MISSING, REFUSED):
        return outcome.status
    verdicts = {r.verdict for r in outcome.rows}
    if verdicts and verdicts <= {REFUSED, UNGATED}:  # nothing was tested: never counted as judged
        return REFUSED
    if REGRESSED in verdicts:
        return REGRESSED
    if INCONCLUSIVE in verdicts:
        return INCONCLUSIVE
    return JUDGED


def reason_of(outcome: Any) -> str:
    """Why a benchmark was not judged, in a few words."""
    if getattr(outcome, "reason", ""):
        return outcome.reason
    kind = kind_of(outcome)
    if kind == MISSING:
        return "no baseline"
    if kind == RECORDED:
        return "baseline written"
    if kind == REFUSED:
        notes = {r.note for r in outcome.rows if r.verdict == REFUSED}
        if any(n.startswith("machine busy") for n in notes):
            return "machine busy"
        if not notes:
            return "nothing gated was measured" if any(r.verdict == UNGATED for r in outcome.rows) else "refused"
        return "baseline from a busy machine"
    if kind == INCONCLUSIVE:
        return "inconclusive after two looks"
    return ""


def judged_line(outcomes: Sequence[Any]) -> tuple[str, str]:
    """(`llmperf: judged J of N benchmarks (...)`, markup colour: green, yellow or red)."""
    kinds = [kind_of(o) for o in outcomes]
    judged = sum(k in (JUDGED, REGRESSED, INCONCLUSIVE) for k in kinds)
    parts = []
    for kind in (REFUSED, MISSING, RECORDED):
        reasons = Counter(reason_of(o) for o, k in zip(outcomes, kinds) if k == kind)
        if reasons:
            detail = ", ".join(f"{n} {r}" if len(reasons) > 1 else r for r, n in reasons.most_common())
            parts.append(f"{sum(reasons.values())} {kind}: {detail}")
    if kinds.count(INCONCLUSIVE):
        parts.append(f"{kinds.count(INCONCLUSIVE)} of the judged inconclusive")
    line = f"llmperf: judged {judged} of {len(outcomes)} benchmarks" + (f" ({'; '.join(parts)})" if parts else "")
    if judged == len(outcomes) and not kinds.count(INCONCLUSIVE):
        colour = "green"
    elif judged == 0 and any(k in (REFUSED, MISSING) for k in kinds):
        colour = "red"
    else:
        colour = "yellow"
    return line, colour


def failing(outcomes: Iterable[Any], fail_on: Sequence[str]) -> Counter[str]:
    """How many benchmarks ended in each outcome listed in fail_on."""
    return Counter(k for k in map(kind_of, outcomes) if k in fail_on)


def failing_line(counts: Counter[str], fail_on: Sequence[str]) -> str:
    listed = ",".join(fail_on) or "none"
    return ("llmperf: the run fails: " + ", ".join(f"{n} {k}" for k, n in counts.items())
            + f" (--llmperf-fail-on={listed})")
