"""The bisection's goals (issue 49), measured: `pytest-llmperf bisect` over seeded 32-commit histories of a user's
project whose simulated engine got 10% slower at one commit (tests/bisect_projects.py).

Per bisection: the case, the seed, the commit of the step, what the bisection named, its A/B jobs and seconds; then
per case how many were found and how many wrong, the most steps and the median and slowest time. Cases:

- `step`: one +10% decode step at a seeded commit;
- `step+3%`: the same, and a 3% step at another commit (the 10% one must be named, the 3% one never);
- `broken`: the same as `step`, and a commit elsewhere that does not collect (skipped, the result still found).

Each step runs the user's pytest with the plugin's defaults (the processes as the gate plans them), unless options
are given after --. Run it under the shared lock and say the load (`uptime`):

    flock /tmp/llmperf-heavy.lock python scripts/bisect_check.py --bisections 3 --case step
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.bisect_projects import PYTEST_ARGS, make_history  # noqa: E402

COMMITS = 32
CASES = ("step", "step+3%", "broken")


def history(case: str, seed: int, root: Path) -> tuple[list[str], int, int | None]:
    """(the shas, the commit of the 10% step, the commit of the other: the 3% step or the broken one)."""
    rng = np.random.default_rng(seed)
    at, other = (int(x) for x in rng.choice(np.arange(1, COMMITS), size=2, replace=False))
    steps = {at: 1.10}
    if case == "step+3%":
        steps[other] = 1.03
    broken = {other} if case == "broken" and other != COMMITS - 1 else set()
    shas = make_history(root, COMMITS, steps, broken=broken, seed=seed)
    return shas, at, other if case != "step" else None


def one(case: str, seed: int, extra: list[str]) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bisect-check-"))
    try:
        shas, at, other = history(case, seed, root / "project")
        began = time.monotonic()
        command = [sys.executable, "-m", "pytest_llmperf", "bisect", shas[0], shas[-1], "--", *PYTEST_ARGS, *extra]
        bisection = subprocess.Popen(command, cwd=root / "project", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)  # fmt: skip
        try:
            out, err = bisection.communicate()
        except BaseException:  # stopped (SIGTERM, ^C): the bisection stops its step's pytest and removes its worktrees
            bisection.terminate()
            bisection.wait(60)
            raise
        done = subprocess.CompletedProcess(command, bisection.returncode, out, err)
        seconds = time.monotonic() - began
        try:
            report = json.loads((root / "project" / "reports" / "bisect" / "bisect.json").read_text())
        except (OSError, ValueError):
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            raise
        named = report["first_bad"]
        found = named == shas[at] and report["status"] == "found"
        # a skipped commit just before the step leaves two suspects, as git bisect's would: named, not wrong
        among = report["status"] == "ambiguous" and shas[at] in report["suspects"]
        return {
            "case": case, "seed": seed, "step_at": at, "other_at": other, "exit": done.returncode,
            "named_at": shas.index(named) if named in shas else None, "status": report["status"],
            "verdict": "found" if found else "ambiguous" if among else "WRONG", "steps": len(report["steps"]),
            "skipped": sum(s["outcome"] == "skip" for s in report["steps"]), "seconds": seconds,
        }  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    own, extra = (sys.argv[1:], []) if "--" not in sys.argv else (
        sys.argv[1 : sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1 :])  # fmt: skip
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bisections", type=int, default=3, help="per case")
    parser.add_argument("--case", action="append", choices=CASES, help="(repeatable; default: all)")
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args(own)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through one()'s finally: the bisection stopped, removed
    results = []
    for case in args.case or CASES:
        for seed in range(args.first_seed, args.first_seed + args.bisections):
            r = one(case, seed, extra)
            results.append(r)
            print(f"{case:8} seed {seed:3}: 10% step at commit {r['step_at']:2}, other at {r['other_at']}; named "
                  f"{r['named_at']} ({r['status']}: {r['verdict']}), {r['steps']} A/B jobs "
                  f"({r['skipped']} skipped), {r['seconds']:.0f} s", flush=True)  # fmt: skip
    for case in args.case or CASES:
        mine = [r for r in results if r["case"] == case]
        seconds = [r["seconds"] for r in mine]
        tally = {v: sum(r["verdict"] == v for r in mine) for v in ("found", "ambiguous", "WRONG")}
        print(f"{case}: {tally['found']} of {len(mine)} found, {tally['ambiguous']} ambiguous, {tally['WRONG']} "
              f"wrong; A/B jobs at most {max(r['steps'] for r in mine)}; seconds median {statistics.median(seconds):.0f}, "
              f"slowest {max(seconds):.0f}")  # fmt: skip
    return 0 if all(r["verdict"] != "WRONG" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
