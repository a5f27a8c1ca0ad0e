"""Measure change-point methods on the seeded synthetic histories of the issue's goals (docs/history.md).

    python scripts/history_methods.py [--seeds 100] [--penalties 2,3,4] [--kernels linear,rbf] [--min-sizes 2,3]

For each method: confirmed false alarms per 100 commits in pure noise (the series replayed as analysed after every
commit), a 5% step at commit 30 of 60 found within 2 commits and exactly, three 2% steps flagged as creep and the
drift reported, confirmed alarms at a +30% outlier job, and the delay until a 5% step is confirmed. Prints one
table row per method. Needs the `history` extra (ruptures) and numpy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_llmperf.history.alarms import Analyses, first_confirmations  # noqa: E402
from pytest_llmperf.history.creep import creep  # noqa: E402
from pytest_llmperf.history.detect import Method  # noqa: E402
from tests.history_synthetic import Case, history  # noqa: E402

MIN_EFFECT = 0.025  # half the default --llmperf-history-min-effect (creep.py)


def noise_rate(method: Method, cv: float, seeds: range) -> tuple[float, float]:
    """Confirmed alarms per 100 commits in pure noise: in the analysis of all 100 commits, and replayed as analysed
    after every commit (each alarm counted once, however long it lasted)."""
    final = streamed = 0
    for s in seeds:
        values = history(Case(100, cv), s)
        final += sum(f.confirmed for f in Analyses(values, method).found())
        streamed += len(first_confirmations(values, method))
    return 100 * final / (len(seeds) * 100), 100 * streamed / (len(seeds) * 100)


def step(method: Method, seeds: range, cv: float = 0.03) -> tuple[float, float]:
    near = exact = 0
    for s in seeds:
        points = Analyses(history(Case(60, cv, ((30, 0.05),)), s), method).at(60)
        best = min(points, key=lambda i: abs(i - 30), default=None)
        near += best is not None and abs(best - 30) <= 2
        exact += best == 30
    return near / len(seeds), exact / len(seeds)


def creep_case(method: Method, seeds: range) -> tuple[float, float, float]:
    flagged, drifts = 0, []
    for s in seeds:
        values = history(Case(60, 0.03, ((15, 0.02), (30, 0.02), (45, 0.02))), s)
        c = creep(values, min_drift=MIN_EFFECT, p_value=method.p_value)
        if c is not None and c.flagged:
            flagged += 1
            drifts.append(c.drift)
    lo, hi = (np.percentile(drifts, [5, 95]) if drifts else (float("nan"),) * 2)
    return flagged / len(seeds), float(lo), float(hi)


def outliers(method: Method, seeds: range) -> int:
    """Histories with a confirmed alarm within 2 commits of a +30% job, in the analyses made while that job was
    the newest commit and in the 8 after it."""
    bad = 0
    for at in (10, 50, 90, 99):
        for s in seeds:
            analyses = Analyses(history(Case(100, 0.03, outliers=((at, 0.30),)), s), method)
            bad += any(
                f.confirmed and abs(f.index - at) <= 2 for n in range(at + 1, min(at + 10, 101)) for f in analyses.found(n)
            )
    return bad


def delay(method: Method, seeds: range) -> tuple[float, float]:
    delays = []
    for s in seeds:
        values = history(Case(60, 0.03, ((40, 0.05),)), s)
        hit = [length - 40 for length, i in first_confirmations(values, method, start=41) if abs(i - 40) <= 2]
        delays.append(hit[0] if hit else 99)
    return float(np.mean(np.array(delays) <= 8)), float(np.median(delays))


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--seeds", type=int, default=100)
    args.add_argument("--penalties", default="2,2.5,3")
    args.add_argument("--kernels", default="linear")
    args.add_argument("--min-sizes", default="3")
    args.add_argument("--p-values", default="0.005")
    args.add_argument("--looks", default="2")
    a = args.parse_args()
    seeds = range(a.seeds)
    print("| method | noise CV 1/3/5/10% (confirmed per 100 commits) | 5% step ±2 / exact | creep flagged, "
          "drift 5-95% | outlier alarms | confirmed <= 8 after, median delay | s |")
    print("|---|---|---|---|---|---|---|")
    for kernel in a.kernels.split(","):
        for penalty in map(float, a.penalties.split(",")):
            for min_size in map(int, a.min_sizes.split(",")):
                for p, looks in [(p, k) for p in map(float, a.p_values.split(",")) for k in map(int, a.looks.split(","))]:
                    method = Method(kernel, penalty, min_size, p, confirm_looks=looks)
                    t = time.perf_counter()
                    found = [noise_rate(method, cv, seeds) for cv in (0.01, 0.03, 0.05, 0.10)]
                    rates = "/".join(f"{f:.2f}" for f, _ in found) + " (replayed: " + "/".join(
                        f"{r:.2f}" for _, r in found) + ")"
                    near, exact = step(method, seeds)
                    flagged, lo, hi = creep_case(method, seeds)
                    soon, median = delay(method, seeds)
                    print(f"| {kernel} pen {penalty:g} min {min_size} p {p:g} looks {looks} | {rates} | {near:.0%} / {exact:.0%} | "
                          f"{flagged:.0%}, {lo:+.1%}..{hi:+.1%} | {outliers(method, seeds)} | {soon:.0%}, "
                          f"{median:g} | {time.perf_counter() - t:.0f} |", flush=True)


if __name__ == "__main__":
    main()
