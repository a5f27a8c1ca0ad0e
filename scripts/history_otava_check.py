"""The external check: the same synthetic series analysed by this plugin and by Apache Otava's own CLI, installed in
an environment of its own (docs/history.md, "Otava").

    python -m venv /tmp/otava && /tmp/otava/bin/pip install apache-otava
    python scripts/history_otava_check.py --otava /tmp/otava/bin/otava [--seeds 30]

Per case and seed: the series go into a store as a job's rows would, `pytest-llmperf history export --format otava`
writes Otava's CSV and config, and `otava analyze` runs with its defaults (window 50, P 0.001, M 0). Prints, per
case, how many of Otava's change points this plugin's analysis has within 2 commits, and the reverse.
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
from pytest_llmperf.history.backends import Location  # noqa: E402
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
        [otava, "analyze", key, "--since", "2000-01-01", "--output", "json"], capture_output=True, text=True, env=env, check=True, timeout=300
    )
    text = done.stdout[done.stdout.index("{") :]
    found = []
    for change in json.loads(text)[key]:
        found.append(shas.index(change["attributes"]["commit"]))
    return found


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--otava", required=True)
    args.add_argument("--seeds", type=int, default=30)
    a = args.parse_args()
    for name, case in CASES.items():
        ours_matched = theirs_matched = ours_total = theirs_total = 0
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
            ours_total, theirs_total = ours_total + len(ours), theirs_total + len(theirs)
            theirs_matched += sum(any(abs(t - o) <= 2 for o in ours) for t in theirs)
            ours_matched += sum(any(abs(t - o) <= 2 for t in theirs) for o in ours)
            if sorted(ours) != sorted(theirs):
                differences.append(f"seed {seed}: ours {ours}, Otava {theirs}")
        share = theirs_matched / theirs_total if theirs_total else float("nan")
        print(
            f"{name}: Otava {theirs_total} change points, {theirs_matched} ({share:.0%}) within 2 commits of ours; "
            f"ours {ours_total}, {ours_matched} within 2 of Otava's",
            flush=True,
        )
        for line in differences[:6]:
            print(f"    {line}")


if __name__ == "__main__":
    main()
