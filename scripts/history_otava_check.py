"""The external check: the same synthetic series analysed by this plugin and by Apache Otava's own CLI, installed in
an environment of its own (docs/history.md, "Otava").

    python -m venv /tmp/otava && /tmp/otava/bin/pip install apache-otava
    python scripts/history_otava_check.py --otava /tmp/otava/bin/otava [--seeds 30]

Per case and seed: the series go into a store as a job's rows would, `pytest-llmperf history export --format otava`
writes Otava's CSV and config, and `otava analyze` runs with its defaults (window 50, P 0.001, M 0). Prints, per
case, how many of Otava's change points this plugin's analysis has within 2 commits, and the reverse; and, since the
injected changes are known, how many of each side's change points lie within 2 commits of one, and of Otava's
points ours lacks, how many do (where the two differ, which one is at a change). Totals at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_llmperf.cli import main as cli_main  # noqa: E402
from pytest_llmperf.history.analysis import analyze_series  # noqa: E402
from pytest_llmperf.history.databases import Location  # noqa: E402
from pytest_llmperf.history.series import build  # noqa: E402
from pytest_llmperf.history.store import Store  # noqa: E402
from tests.history_rows import history_rows  # noqa: E402
from tests.history_synthetic import Case, history  # noqa: E402

CASES = {
    "5% step at 30 of 60, CV 1%": Case(60, 0.01, ((30, 0.05),)),
    "5% step at 30 of 60, CV 3%": Case(60, 0.03, ((30, 0.05),)),
    "5% step at 30 of 60, CV 5%": Case(60, 0.05, ((30, 0.05),)),
    "3 x 2% steps, CV 3%": Case(60, 0.03, ((15, 0.02), (30, 0.02), (45, 0.02))),
    "10% and -8% steps, CV 3%": Case(80, 0.03, ((25, 0.10), (55, -0.08))),
    "noise, CV 3%": Case(100, 0.03),
    "+30% outlier at 50, CV 3%": Case(100, 0.03, outliers=((50, 0.30),)),
}


def otava_points(otava: str, out: Path, key: str, shas: list[str]) -> list[int]:
    env = {**os.environ, "OTAVA_CONFIG": str(out / "otava.yaml")}
    done = subprocess.run(
        [otava, "analyze", key, "--since", "2000-01-01", "--output", "json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    text = done.stdout[done.stdout.index("{") :]
    found = []
    for change in json.loads(text)[key]:
        found.append(shas.index(change["attributes"]["commit"]))
    return found


def near(point: int, points: list[int]) -> bool:
    return any(abs(point - p) <= 2 for p in points)


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--otava", required=True)
    args.add_argument("--seeds", type=int, default=30)
    a = args.parse_args()
    totals = dict.fromkeys(("theirs", "matched", "theirs_true", "matched_true", "ours", "ours_matched"), 0)
    for name, case in CASES.items():
        steps = [at for at, _ in case.steps]
        counts = dict.fromkeys(("theirs", "matched", "theirs_true", "matched_true", "ours", "ours_matched"), 0)
        counts.update(ours_true=0, unmatched_true=0)
        differences = []
        for seed in range(a.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                values = history(case, seed)
                runs, rows = history_rows(values)
                store = Location("sqlite", f"{tmp}/h.sqlite")
                with Store(store) as opened:
                    opened.append(runs, rows)
                    (series,) = build(opened.runs(), opened.results()).values()
                ours = [c.index for c in analyze_series(series).changes]
                out = Path(tmp) / "otava"
                with open(os.devnull, "w") as quiet:
                    sys.stdout, saved = quiet, sys.stdout
                    try:
                        cli_main(["history", "--store", store.target, "export", "--out", str(out), "--repo", tmp])
                    finally:
                        sys.stdout = saved
                theirs = otava_points(a.otava, out, series.key, [r.commit_sha for r in runs])
            counts["theirs"] += len(theirs)
            counts["ours"] += len(ours)
            counts["matched"] += sum(near(t, ours) for t in theirs)
            counts["ours_matched"] += sum(near(o, theirs) for o in ours)
            counts["theirs_true"] += sum(near(t, steps) for t in theirs)
            counts["matched_true"] += sum(near(t, steps) and near(t, ours) for t in theirs)
            counts["unmatched_true"] += sum(near(t, steps) and not near(t, ours) for t in theirs)
            counts["ours_true"] += sum(near(o, steps) for o in ours)
            if sorted(ours) != sorted(theirs):
                differences.append(f"seed {seed}: ours {ours}, Otava {theirs}")
        for key in totals:
            totals[key] += counts[key]
        share = counts["matched"] / counts["theirs"] if counts["theirs"] else float("nan")
        print(
            f"{name}: Otava {counts['theirs']} change points, {counts['matched']} ({share:.0%}) within 2 commits of "
            f"ours; of the {counts['theirs'] - counts['matched']} others, {counts['unmatched_true']} within 2 of an "
            f"injected change; ours {counts['ours']}, {counts['ours_matched']} within 2 of Otava's; within 2 of an "
            f"injected change: Otava's {counts['theirs_true']}, ours {counts['ours_true']}",
            flush=True,
        )
        for line in differences[:6]:
            print(f"    {line}")
    print(
        f"all: Otava {totals['theirs']}, {totals['matched']} ({totals['matched'] / totals['theirs']:.1%}) within 2 "
        f"commits of ours; ours {totals['ours']}, {totals['ours_matched']} within 2 of Otava's; Otava's within 2 of "
        f"an injected change: {totals['theirs_true']}, {totals['matched_true']} of them within 2 of ours"
    )


if __name__ == "__main__":
    main()
