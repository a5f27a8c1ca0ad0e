"""The statistical gate: is a metric worse than its baseline beyond noise?

Per metric and batch size, on per-run values (the run is the unit of replication):
- a one-sided Mann-Whitney U test (scipy) in the bad direction (latency up, throughput down);
- the Hodges-Lehmann ratio new/baseline, exp(median of pairwise log differences), with a 95%
  bootstrap confidence interval (scipy.stats.bootstrap);
- across the metrics and batch sizes of one test, Benjamini-Hochberg adjusted p-values
  (scipy.stats.false_discovery_control).
A regression is adjusted p < alpha AND the ratio beyond 1 + rtol in the bad direction (for a
higher-is-better metric: below 1 / (1 + rtol), so a latency and the matching throughput trip
together). Improvements are reported, never failed. A result in between is inconclusive: the caller
may take more runs, splitting alpha between the two looks (alpha/2 each) so the false-alarm rate
stays at or under alpha.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

PASS, REGRESSED, IMPROVED, INCONCLUSIVE = "pass", "regressed", "improved", "inconclusive"
#: Above this adjusted p, more runs are not worth taking (Pinpoint's "same" band).
INCONCLUSIVE_P = 0.2
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class Comparison:
    metric: str
    batch_size: int
    better: str  # "lower" | "higher"
    rtol: float
    n_baseline: int
    n_current: int
    baseline_median: float
    current_median: float
    ratio: float  # Hodges-Lehmann estimate of current / baseline
    ci_low: float
    ci_high: float
    p_worse: float  # one-sided, raw
    p_better: float
    p_adjusted: float | None = None
    verdict: str = PASS

    @property
    def beyond_tolerance(self) -> bool:
        if self.better == "lower":
            return self.ratio > 1 + self.rtol
        return self.ratio < 1 / (1 + self.rtol)

    @property
    def beyond_tolerance_improving(self) -> bool:
        if self.better == "lower":
            return self.ratio < 1 / (1 + self.rtol)
        return self.ratio > 1 + self.rtol


def _hl_shift(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Hodges-Lehmann shift: median of all pairwise differences x_i - y_j (vectorized)."""
    x = np.moveaxis(x, axis, -1)
    y = np.moveaxis(y, axis, -1)
    diffs = x[..., :, None] - y[..., None, :]
    return np.median(diffs.reshape(*diffs.shape[:-2], -1), axis=-1)


def hodges_lehmann_ratio(baseline: Sequence[float], current: Sequence[float], *, confidence: float = 0.95,
                         seed: int = 0, with_ci: bool = True) -> tuple[float, float, float]:
    """(ratio, ci_low, ci_high) of current over baseline, on the log scale."""
    log_b = np.log(np.asarray(baseline, dtype=float))
    log_c = np.log(np.asarray(current, dtype=float))
    ratio = float(np.exp(_hl_shift(log_c, log_b)))
    if not with_ci or min(len(log_b), len(log_c)) < 2 or (np.ptp(log_b) == 0 and np.ptp(log_c) == 0):
        return ratio, ratio, ratio
    res = stats.bootstrap((log_c, log_b), _hl_shift, vectorized=True, paired=False, confidence_level=confidence,
                          n_resamples=BOOTSTRAP_RESAMPLES, method="percentile", rng=np.random.default_rng(seed))
    return ratio, float(np.exp(res.confidence_interval.low)), float(np.exp(res.confidence_interval.high))


def compare(metric: str, batch_size: int, baseline: Sequence[float], current: Sequence[float], *,
            better: str, rtol: float, with_ci: bool = True) -> Comparison:
    """Test one metric at one batch size; the verdict is set later by `decide` (it needs all p-values)."""
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', got {better!r}")
    base = np.asarray(baseline, dtype=float)
    cur = np.asarray(current, dtype=float)
    worse_alt, better_alt = ("greater", "less") if better == "lower" else ("less", "greater")
    p_worse = float(stats.mannwhitneyu(cur, base, alternative=worse_alt).pvalue)
    p_better = float(stats.mannwhitneyu(cur, base, alternative=better_alt).pvalue)
    ratio, low, high = hodges_lehmann_ratio(base, cur, with_ci=with_ci)
    return Comparison(metric, batch_size, better, rtol, len(base), len(cur), float(np.median(base)),
                      float(np.median(cur)), ratio, low, high, p_worse, p_better)


def _walsh_median(d: np.ndarray, axis: int = -1) -> np.ndarray:
    """One-sample Hodges-Lehmann: the median of all pairwise averages (d_i + d_j) / 2, i <= j (vectorized)."""
    d = np.moveaxis(d, axis, -1)
    i, j = np.triu_indices(d.shape[-1])
    return np.median((d[..., i] + d[..., j]) / 2, axis=-1)


def compare_paired(metric: str, batch_size: int, reference: Sequence[float], current: Sequence[float], *,
                   better: str, rtol: float, with_ci: bool = True, seed: int = 0) -> Comparison:
    """Test one metric on pairs: reference[i] and current[i] were measured side by side (an A/B round, one
    worker process each, back to back), so the machine's state at that moment cancels in their ratio.
    One-sided Wilcoxon signed-rank test of the log ratios in the bad direction; the ratio is
    exp(one-sample Hodges-Lehmann of the log ratios) with a 95% bootstrap interval."""
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', got {better!r}")
    base = np.asarray(reference, dtype=float)
    cur = np.asarray(current, dtype=float)
    if base.shape != cur.shape:
        raise ValueError(f"paired comparison needs as many reference as current values ({len(base)} vs {len(cur)})")
    d = np.log(cur) - np.log(base)
    worse_alt, better_alt = ("greater", "less") if better == "lower" else ("less", "greater")
    if np.all(d == 0):
        p_worse = p_better = 1.0
    else:
        p_worse = float(stats.wilcoxon(d, alternative=worse_alt).pvalue)
        p_better = float(stats.wilcoxon(d, alternative=better_alt).pvalue)
    ratio = low = high = float(np.exp(_walsh_median(d)))
    if with_ci and len(d) >= 2 and np.ptp(d) > 0:
        res = stats.bootstrap((d,), _walsh_median, vectorized=True, confidence_level=0.95,
                              n_resamples=BOOTSTRAP_RESAMPLES, method="percentile", rng=np.random.default_rng(seed))
        low, high = float(np.exp(res.confidence_interval.low)), float(np.exp(res.confidence_interval.high))
    return Comparison(metric, batch_size, better, rtol, len(base), len(cur), float(np.median(base)),
                      float(np.median(cur)), ratio, low, high, p_worse, p_better)


def min_attainable_p_paired(pairs: int) -> float:
    """The smallest one-sided Wilcoxon signed-rank p with this many pairs: every difference the same sign."""
    return 0.5 ** pairs


def decide(comparisons: Sequence[Comparison], alpha: float) -> list[Comparison]:
    """Adjust the p-values of one test together (Benjamini-Hochberg) and give each its verdict."""
    if not comparisons:
        return []
    adjusted = stats.false_discovery_control([c.p_worse for c in comparisons], method="bh")
    decided = []
    for c, p_adj in zip(comparisons, adjusted):
        p_adj = float(p_adj)
        if c.beyond_tolerance and p_adj < alpha:
            verdict = REGRESSED
        elif c.beyond_tolerance and p_adj < INCONCLUSIVE_P:
            verdict = INCONCLUSIVE
        elif c.beyond_tolerance_improving and c.p_better < alpha:
            verdict = IMPROVED
        else:
            verdict = PASS
        decided.append(replace(c, p_adjusted=p_adj, verdict=verdict))
    return decided


def min_attainable_p(n_baseline: int, n_current: int) -> float:
    """The smallest one-sided Mann-Whitney p these sample sizes can give (complete separation)."""
    return float(stats.mannwhitneyu(np.arange(n_current) + n_baseline, np.arange(n_baseline),
                                    alternative="greater", method="exact").pvalue)
