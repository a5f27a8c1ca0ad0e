"""The `llmperf: <device>` section of pytest's terminal summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..judge.quality import quality_notes
from .markdown import json_document, table
from .verdict_table import table_rows

COUNT_ORDER = ("passed", "regressed", "improved", "created", "updated", "new", "refused", "missing", "inconclusive")


#: Counted beside the verdicts, shown only when some benchmark has them.
COUNT_EXTRA = ("outputs changed",)


def counts_line(counts: Mapping[str, int]) -> str:
    return ", ".join([f"{counts.get(name, 0)} {name}" for name in COUNT_ORDER]
                     + [f"{counts[name]} {name}" for name in COUNT_EXTRA if counts.get(name)])


def summary_lines(session: Any) -> list[str]:
    # the same rows, units, ratio direction and order as the markdown report's verdict table
    document = json_document(session.device, "", {}, {}, [o.result for o in session.outcomes], session.outcomes,
                             session.counts())
    header, rows = table_rows(document, with_measured=False)
    lines = table(header, rows).splitlines() if rows else []
    counts = session.counts()
    lines.append(counts_line(counts))
    lines += [f"run quality: {o.result.key}: {note}" for o in session.outcomes for note in quality_notes(o.result)]
    unchecked = [o.result.key for o in session.outcomes if getattr(o, "outputs_unchecked", False)]
    if unchecked:
        lines.append(f"outputs not compared for {len(unchecked)} benchmark(s), whose baseline (or compared ref) holds "
                     f"no generated tokens (recorded before they were stored; --llmperf-update records them): "
                     + ", ".join(unchecked))
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
