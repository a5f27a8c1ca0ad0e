"""Which test of an A/B difference uses the runs honestly: candidate intervals on synthetic pairs with runs, how
often each misses the true ratio (against how often it says it will) and how wide it is.

A pair (one round) has an A and a B process; each process's runs are log-normal around its own offset (sd `between`
per side, the processes' own differences) with the run's scatter (sd `within`), optionally with delays in some runs
(a burst on a busy machine, exponential, in a share of the processes). The truth is a ratio of 1. Candidates:

- `pairs-t`: the paired t on the pairs' mean runs, (pairs - 1) degrees of freedom (the balanced mixed model's exact
  test of the fixed effect);
- `pooled`: the same estimate, its variance the larger of the pairs' scatter and what their runs imply, and the
  degrees of freedom of the runs where the runs' is larger (a mixed model's REML with the between-pair variance at
  its boundary and Satterthwaite's df): it gains where pairs are few;
- `screened`: the shipped estimate with the farthest pairs set aside as judge/stats.py's `screen` does;
- `nested`: what the gate ships (judge/stats.py's `nested`: random-effects weights from each pair's runs,
  Hartung-Knapp's interval).

    python scripts/pair_intervals.py --rows 20000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_llmperf.judge import stats  # noqa: E402

CASES = {  # (between per side, within, burst probability, burst mean, share of processes disturbed)
    "processes differ, runs agree": (0.05, 0.02, 0.0, 0.0, 0.0),
    "runs scatter, processes alike": (0.0, 0.10, 0.0, 0.0, 0.0),
    "both": (0.03, 0.10, 0.0, 0.0, 0.0),
    "bursts in 30% of the processes": (0.02, 0.05, 0.4, 0.3, 0.3),
}


def pairs(rng: np.random.Generator, rows: int, k: int, n: int, case: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    between, within, burst, size, disturbed = case
    shared = rng.normal(0, 0.2, (rows, k, 1))  # the machine's state of the round: both sides
    sides = []
    for _ in range(2):
        values = shared + rng.normal(0, between, (rows, k, 1)) + rng.normal(0, within, (rows, k, n))
        if burst:
            hit = (rng.random((rows, k, 1)) < disturbed) & (rng.random((rows, k, n)) < burst)
            values = values + hit * rng.exponential(size, (rows, k, n))
        sides.append(values)
    return sides[0], sides[1]


def candidates(a: np.ndarray, b: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(estimate, se, df) of each candidate, per row (log scale)."""
    k = a.shape[-2]
    mean_a, var_a, df_a = stats.process_means(a)
    mean_b, var_b, df_b = stats.process_means(b)
    effects = mean_b - mean_a
    scatter, runs = effects.var(axis=-1, ddof=1), (var_a + var_b).mean(axis=-1)
    found = {"pairs-t": (effects.mean(-1), np.sqrt(scatter / k), np.full(scatter.shape, k - 1.0))}
    pooled_df = (df_a + df_b).sum(axis=-1)
    found["pooled"] = (effects.mean(-1), np.sqrt(np.maximum(scatter, runs) / k),
                       np.where(scatter >= runs, k - 1.0, k - 1.0 + pooled_df))
    keep = stats.screen(effects)
    kept = np.where(keep, effects, np.nan)
    count = keep.sum(-1)
    found["screened"] = (np.nanmean(kept, -1), np.sqrt(np.nanvar(kept, -1, ddof=1) / count), count - 1.0)
    shipped = stats.nested(np.exp(a), np.exp(b), better="lower")
    found["nested"] = (shipped.bad, shipped.se, shipped.df)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print("| case | pairs x runs | " + " | ".join(f"{name}: misses at 95% / 99.5% (x nominal), half-width at 95%"
                                                for name in ("pairs-t", "pooled", "screened", "nested")) + " |")
    for label, case in CASES.items():
        for k, n in ((5, 3), (5, 20), (10, 3), (10, 10), (20, 10)):
            a, b = pairs(rng, args.rows, k, n, case)
            cells = []
            for estimate, se, df in candidates(a, b).values():
                misses = []
                for level in (0.95, 0.995):
                    half = scipy_stats.t.ppf(0.5 + level / 2, df) * se
                    misses.append(f"{np.mean(np.abs(estimate) > half) / (1 - level):.2f}")
                cells.append(f"{' / '.join(misses)}, {np.median(scipy_stats.t.ppf(0.975, df) * se):.3f}")
            print(f"| {label} | {k} x {n} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
