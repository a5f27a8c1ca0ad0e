"""The package bisection's goals (issue 49, item 2), measured: `pytest-llmperf bisect GOOD BAD --packages` over a
dependency bump of 12 packages of a user's project (tests/bisect_package_projects.py: local wheels, real uv offline,
each step the plugin's A/B job of GOOD's code with some packages at BAD's versions).

Per bisection: the case, the seed, the slow package(s), what the bisection named, its steps, A/B jobs, builds by uv
(GOOD's and BAD's included) and seconds, and the load before and after; then per case how many were named right.
Cases (the slow packages drawn by the seed):

- `one`: one package's 2.0 is 25% slower;
- `together`: one package's 2.0 is 30% slower beside another's 2.0 only (both must be named);
- `requires`: `one`, and another package's 2.0 requires a third's 2.0, so some subsets cannot be built.

Each bisection gets an environments' cache of its own (GOOD's and BAD's environments are built, as a first
bisection's would be); uv's own cache is shared by the bisections of a run (warm after the first, as a CI runner's
is). Each step runs the user's pytest with 4 processes a side, unless options are given after --. Run it under the
shared lock and say the load:

    flock /tmp/llmperf-heavy.lock python scripts/bisect_packages_check.py --case one --case together
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_llmperf.bisection_run import split_argv  # noqa: E402
from tests.bisect_package_projects import PACKAGES, make_bump, run_check  # noqa: E402
from tests.bisect_projects import PYTEST_ARGS  # noqa: E402

CASES = ("one", "together", "requires")
PROCESSES = ("--llmperf-processes=4", "-o", "llmperf_max_processes=4")


def project(case: str, seed: int, root: Path) -> tuple[str, str, list[str]]:
    """(GOOD, BAD, the packages that should be named)."""
    rng = np.random.default_rng(seed)
    a, b, c, d = (PACKAGES[int(i)] for i in rng.choice(len(PACKAGES), size=4, replace=False))
    if case == "together":
        good, bad = make_bump(root, together=(a, b, 1.3), seed=seed)
        return good, bad, sorted((a, b))
    good, bad = make_bump(root, slow={a: 1.25}, requires={c: d} if case == "requires" else None, seed=seed)
    return good, bad, [a]


def one(case: str, seed: int, extra: list[str], uv_cache: Path) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bisect-packages-check-"))
    try:
        good, bad, slow = project(case, seed, root / "project")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMPERF_") and k != "PYTEST_ADDOPTS"}
        env.update(UV_OFFLINE="1", UV_CACHE_DIR=str(uv_cache), PYTEST_ADDOPTS=f"-o llmperf_env_dir={root / 'envs'}")
        load, began = os.getloadavg()[0], time.monotonic()
        done = run_check(root / "project", good, bad, "--packages", "--", *PYTEST_ARGS, *(extra or PROCESSES),
                         env=env, timeout=3600)  # fmt: skip
        seconds = time.monotonic() - began
        try:
            report = json.loads((root / "project" / "reports" / "bisect" / "bisect.json").read_text())
        except (OSError, ValueError):
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            raise
        named = [c["name"] for c in report["culprits"]]
        return {
            "case": case, "seed": seed, "slow": slow, "named": named, "status": report["status"],
            "verdict": "named" if named == slow else "WRONG", "steps": len(report["steps"]), "jobs": report["jobs"],
            "unresolved": sum(s["outcome"] == "unresolved" for s in report["steps"]), "builds": report["builds"],
            "seconds": seconds, "load": (load, os.getloadavg()[0]), "exit": done.returncode,
        }  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    own, extra = split_argv(sys.argv[1:])  # what follows -- goes to each step's pytest
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=CASES, help="(repeatable; default: all)")
    parser.add_argument("--seeds", type=int, default=1, help="bisections per case, seeded 0, 1, ...")
    args = parser.parse_args(own)
    results = []
    with tempfile.TemporaryDirectory(prefix="bisect-packages-uv-") as uv_cache:
        for case in args.case or CASES:
            for seed in range(args.seeds):
                r = one(case, seed, extra, Path(uv_cache))
                results.append(r)
                print(f"{case:8} seed {seed:3}: slow {' '.join(r['slow'])}; named {' '.join(r['named']) or '-'} "
                      f"({r['status']}: {r['verdict']}); {r['steps']} steps: {r['jobs']} A/B jobs, {r['unresolved']} "
                      f"unresolved, {r['builds']} builds by uv; {r['seconds']:.0f} s; load {r['load'][0]:.1f} -> "
                      f"{r['load'][1]:.1f}", flush=True)  # fmt: skip
    for case in args.case or CASES:
        mine = [r for r in results if r["case"] == case]
        print(f"{case}: {sum(r['verdict'] == 'named' for r in mine)} of {len(mine)} named; steps at most "
              f"{max(r['steps'] for r in mine)}, A/B jobs at most {max(r['jobs'] for r in mine)}, builds at most "
              f"{max(r['builds'] for r in mine)}; slowest {max(r['seconds'] for r in mine):.0f} s")  # fmt: skip
    return 0 if all(r["verdict"] == "named" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
