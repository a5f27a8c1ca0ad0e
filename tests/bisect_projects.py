"""Shared by tests/test_bisect.py and scripts/bisect_check.py: a user's project with a history of commits, one of
which made its engine slower.

The engine is the plugin's simulated one (as ../shared/tools/user-project-check has it): its timings come from a
cost model times `SLOWDOWN`, with lognormal noise seeded by (SEED, the commit's number, the worker process), so that
the two sides of a step draw different noise and a rerun draws the same. Commit i of the history sets SLOWDOWN to the
product of the steps at or before it; a commit in `broken` has a syntax error in speed.py (it does not collect), and
the next commit mends it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Collection, Mapping
from pathlib import Path

TEST = """\
import os

import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

from speed import COMMIT, NOISE, SEED, SLOWDOWN


@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def test_engine(llmperf):
    process = int(os.environ.get("LLMPERF_WORKER_PROCESS", "0"))
    engine = SimulatedBackend(decode_ms=4.0, noise=NOISE, seed=(SEED, COMMIT, process), decode_slowdown=SLOWDOWN)
    llmperf.measure(engine)
"""

SPEED = "COMMIT = {commit}\nSEED = {seed}\nNOISE = {noise}\nSLOWDOWN = {slowdown!r}\n"
BROKEN = "COMMIT = {commit}\nSLOWDOWN = (  # a commit that does not collect\n"
#: What each step's pytest is given: the test, the cpu target, and few processes (the steps judge fast or not at all).
PYTEST_ARGS = ("tests", "--llmperf-device=cpu", "--llmperf-machine=runner", "--llmperf-max-load=inf",
               "-p", "no:cacheprovider")  # fmt: skip


def git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.email=u@example.com", "-c", "user.name=u", *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def make_history(
    root: Path,
    commits: int,
    steps: Mapping[int, float],
    *,
    broken: Collection[int] = (),
    seed: int = 0,
    noise: float = 0.02,
) -> list[str]:
    """A git repository at `root` of `commits` commits on main, oldest first: commit 0 is GOOD, the last is BAD;
    from commit i on (i in `steps`) the engine's decode takes steps[i] times as long. Their shas, oldest first."""
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_engine.py").write_text(TEST)
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    (root / ".gitignore").write_text("reports/\n.llmperf/\n__pycache__/\n")
    git(root, "init", "-q", "-b", "main")
    shas, slowdown = [], 1.0
    for i in range(commits):
        slowdown *= steps.get(i, 1.0)
        text = BROKEN if i in broken else SPEED
        (root / "speed.py").write_text(text.format(commit=i, seed=seed, noise=noise, slowdown=round(slowdown, 6)))
        git(root, "add", "-A")
        git(root, "commit", "-qm", f"commit {i}" + (f" (x{steps[i]} decode)" if i in steps else ""))
        shas.append(git(root, "rev-parse", "HEAD"))
    return shas
