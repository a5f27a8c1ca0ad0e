"""The `llmperf: <device>` section of pytest's terminal summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .markdown import table

COUNT_ORDER = ("passed", "regressed", "improved", "created", "updated", "new", "refused", "missing", "inconclusive")


def counts_line(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{counts.get(name, 0)} {name}" for name in COUNT_ORDER)


def summary_lines(session: Any) -> list[str]:
    rows = []
    for outcome in session.outcomes:
        if not outcome.rows:
            rows.append([outcome.result.key, "", "", "", "", "", "", outcome.status])
        for r in outcome.rows:
            ratio = "" if r.ratio is None else f"{r.ratio:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]"
            p = "" if r.p_adjusted is None else f"{r.p_adjusted:.2g}"
            rows.append([r.key, r.metric, str(r.batch_size), "" if r.baseline is None else f"{r.baseline:.4g}",
                         "" if r.now is None else f"{r.now:.4g}", ratio, p, r.verdict])
    lines = table(("test", "metric", "batch", "baseline", "now", "ratio [95% CI]", "p (BH)", "verdict"),
                  rows).splitlines() if rows else []
    counts = session.counts()
    lines.append(counts_line(counts))
    drift = {k: v for o in session.outcomes for k, v in o.drift.items()}
    if drift:
        lines.append("software drift since the baselines: " +
                     "; ".join(f"{k} {was} -> {now}" for k, (was, now) in sorted(drift.items())))
    compared_to = getattr(session, "compared_to", None)
    if compared_to and counts.get("regressed"):
        lines.append(f"compared with {compared_to}: re-run the same command to measure again; a slowdown the "
                     "change intends is accepted by merging it (the next comparison starts from it)")
    elif counts.get("regressed") or counts.get("missing"):
        rerun = session.rerun() if hasattr(session, "rerun") else f"pytest --llmperf-device={session.device}"
        lines.append(f"re-run: {rerun} (add --llmperf-update if the change is "
                     "intended, then commit the changed baselines/ files)")
    return lines
