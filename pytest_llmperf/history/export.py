"""A store's series as files for other tools: Apache Otava's CSV tests (`otava analyze`), or JSON lines.

Otava reads one CSV per test and a YAML config naming each file, its time column, its attributes and its metrics
with their direction (+1: higher is better). The time column keeps the series' first-parent order (Otava orders by
it): one minute apart per commit from 2000-01-01, the commit and its real time are attributes. Otava analyses the
last 365 days unless told otherwise: `OTAVA_CONFIG=otava.yaml otava analyze --since 2000-01-01 KEY`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ..files import write_text_atomic
from .series import Series

EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def otava(series: Sequence[Series], out: Path) -> list[Path]:
    """`<out>/<series key>.csv` per series and `<out>/otava.yaml`; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written, tests = [], []
    for s in series:
        path = out / f"{s.key}.csv"
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["time", "commit", "commit_time", s.id.metric])
            for i, p in enumerate(s.points):
                stamp = (EPOCH + timedelta(minutes=i)).strftime("%Y-%m-%d %H:%M:%S +0000")
                writer.writerow([stamp, p.commit_sha, p.commit_time or "", repr(p.value)])
        written.append(path)
        tests.append(
            f"  {s.key}:  # {s.id.label()}\n    type: csv\n    file: {path.resolve()}\n    time_column: time\n"
            f"    attributes: [commit, commit_time]\n    metrics:\n      {s.id.metric}:\n"
            f"        column: {s.id.metric}\n        direction: {s.direction}\n"
        )
    config = out / "otava.yaml"
    write_text_atomic(
        config,
        "# written by pytest-llmperf history export --format otava; run: "
        f"OTAVA_CONFIG={config.name} otava analyze --since 2000-01-01 TEST\ntests:\n" + "".join(tests),
    )
    return [*written, config]


def jsonl(series: Sequence[Series], out: Path) -> list[Path]:
    """`<out>/series.jsonl`: one line per series with its points."""
    lines = [
        json.dumps(
            {
                "key": s.key,
                "series": s.id.label(),
                "unit": s.unit,
                "direction": s.direction,
                "points": [{"commit": p.commit_sha, "value": p.value, "low": p.low, "high": p.high} for p in s.points],
            },
            sort_keys=True,
        )
        for s in series
    ]
    path = out / "series.jsonl"
    write_text_atomic(path, "".join(line + "\n" for line in lines))
    return [path]
