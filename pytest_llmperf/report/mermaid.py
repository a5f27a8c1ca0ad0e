"""Charts GitHub renders in a job summary ($GITHUB_STEP_SUMMARY): mermaid `xychart-beta` blocks.

One chart per benchmark that ran two or more batch sizes: the median end-to-end throughput against
batch size (xychart has no legend, so a line per chart reads best). Batch sizes that ran out of memory
are named in the title, since a line cannot hold a gap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .stored import batch_medians

METRIC = "throughput_tokens_per_s"
MAX_CHARTS = 12  # a summary is read on one page


def _quoted(text: str) -> str:
    return '"' + text.replace('"', "'") + '"'


def throughput_charts(document: Mapping[str, Any]) -> str:
    charts = []
    for benchmark in document.get("benchmarks") or []:
        medians = {bs: m[METRIC] for bs, m in batch_medians(benchmark, [METRIC]).items() if METRIC in m}
        if len(medians) < 2:
            continue
        sizes = sorted(medians)
        oom = [str(b.get("batch_size")) for b in benchmark.get("batches") or [] if b.get("status") == "oom"]
        title = f"{benchmark.get('key')}: throughput vs batch size" + (f" (oom at {', '.join(oom)})" if oom else "")
        charts.append(
            "\n".join(
                [
                    "```mermaid",
                    "xychart-beta",
                    f"    title {_quoted(title)}",
                    f"    x-axis {_quoted('batch size')} [{', '.join(str(bs) for bs in sizes)}]",
                    f"    y-axis {_quoted('tokens/s (median)')} 0 --> {max(medians.values()) * 1.1:.4g}",
                    f"    line [{', '.join(f'{medians[bs]:.4g}' for bs in sizes)}]",
                    "```",
                ]
            )
        )
    if not charts:
        return ""
    more = len(charts) - MAX_CHARTS
    return "\n\n".join(charts[:MAX_CHARTS]) + (f"\n\n({more} more in reports/index.html)" if more > 0 else "") + "\n\n"
