"""The statistics of one comparison: how much worse (or better) one metric is now, and how sure we are.

Units are worker processes (one median each) or, measured in one process, runs. Per metric and batch size:

- **Scale.** Times and throughputs are compared as ratios, on the log scale. A counter a backend adds may be
  0, so where either side holds a value <= 0 it is compared as a difference relative to the reference's
  median (0 on both sides is equal; a reference median of 0 has no scale: `NoScale`, the row is ungated).
- **Disturbed units are set aside.** A unit more than `OUTLIER_Z` robust standard deviations (1.4826 x the
  median absolute deviation) from the median of its sample is a process hit by a burst on a shared machine,
  not the code's speed: it is dropped (from `SCREEN_MIN` units on, at most a quarter of them), and the caller
  measures more units while a row stays undecided. A/B pairs are screened on their per-pair effects (a
  disturbed side makes its pair an outlier), stored comparisons per side.
- **A robust interval.** The location is the 20%-trimmed mean and its standard error the winsorized one
  (Yuen's trimmed t; two samples: scipy.stats.ttest_ind(trim=0.2, equal_var=False) computes the same t),
  which tolerates the disturbed units the screen lets through (up to 20% per tail). Its bounds decide "within"
  or "beyond" the tolerance (judge/procedure.py).
- **The p of "worse at all" uses every unit.** Setting units aside by their distance from the sample's median
  favours the median's side: on normal A/A pairs the screen fired in 5-17% of rows (a median absolute deviation
  of few units is often small) and the screened p fell below 1e-4 four to ten times as often as it should. The
  family-wise level is tiny, so that tail is what decides a false "regressed" (docs/gate.md). A/B pairs: Yuen's
  one-sample trimmed t on every pair (trimming cuts both tails alike; robust to disturbed pairs; 1.5-2 times too
  often at those levels on normal pairs). Against a stored baseline: Mann-Whitney's U, exact (scipy.stats): the
  two-sample trimmed t with a baseline of few units went red for unchanged code in 3-7% of simulated jobs at
  alpha 1%, and caught less.

**A/B pairs with their runs** (`nested`, what the gate tests in worker processes): a round's two processes are
summarised by the mean of their runs (`RUN_TRIM` trimmed) and its standard error, so every run counts and more runs
make a pair more precise where the runs scatter; the rounds are combined as a random-effects model, the two levels
of a shared machine's noise: each pair weighted by 1 / (tau^2 + its runs' variance), tau^2 the scatter between
pairs beyond what their runs explain (DerSimonian-Laird), each pair's runs' variance shrunk toward the row's pooled
one (`PRIOR_DF` degrees of freedom: three runs say little about their own spread); the interval is Hartung and
Knapp's, a t with (pairs - 1) degrees of freedom on the weighted residuals. So a pair whose runs agree tells more
than one whose runs scatter, and processes that differ widen the interval as they should. Measured on synthetic
pairs (docs/notes/gate-runs.md, "Which interval"): misses at 95% and 99.5% within 0.87-1.34 times nominal where the
processes are alike, fewer where some are disturbed; pooling the runs' degrees of freedom instead (a mixed model's
REML with Satterthwaite's df) missed up to 2.8 times as often at 99.5%.

`Estimate` holds the effect in the *bad* direction (positive = worse: a latency up, a throughput down) with
its standard error and degrees of freedom; `judge/procedure.py` turns it into a verdict. Every function
works on arrays whose last axis holds the units (the plugin passes one row; the simulator, thousands).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from .trim import TRIM

#: Robust z-score beyond which a unit counts as disturbed (synthetic processes slowed 1.2-2x among ones with
#: 3% noise are 6-23 robust SDs out; a clean normal unit passes 4 SDs once in 16,000).
OUTLIER_Z = 4.0
#: Units needed before any is set aside (a median absolute deviation of fewer is not a scale).
SCREEN_MIN = 5
#: Fraction of each tail of a process's runs left out of its mean (from 10 runs on: one a tail). The mean, not the
#: median: on this project's runner the runs of a busy machine scatter by delays that add up (a preempted decode
#: step), and the pairs' effects of means scattered 1.2-1.3 times less than those of medians
#: (docs/notes/gate-runs.md, "Summarising a process's runs").
RUN_TRIM = 0.1
#: Degrees of freedom of the prior that each pair's within-process variance is shrunk toward (the row's mean one):
#: with 2, weights from three runs' own variance made the interval miss 1.3-1.7 times as often as it says at 99.5%
#: (docs/notes/gate-runs.md, "Which interval").
PRIOR_DF = 8.0

Array = NDArray[np.float64]


class NoScale(ValueError):
    """A counter whose reference median is 0 while some value is not: no relative tolerance applies."""


@dataclass(frozen=True)
class Spread:
    """The two levels of a nested comparison's noise, per row, on its scale (log: relative): how much a pair's effect
    scatters beyond what its runs explain (`between`, tau), and how much one run scatters within its process
    (`within`, pooled over both sides); what judge/procedure.py chooses runs and processes from."""

    between: Array
    within: Array


@dataclass(frozen=True)
class Estimate:
    """How much worse a metric is now than its reference, per row (arrays; 0-d for one row)."""

    bad: Array  # log(now / reference) in the bad direction, or the relative difference on the linear scale
    se: Array  # its standard error (0 when both sides are constant, inf with too few units)
    df: Array  # degrees of freedom of the t distribution it follows
    n_reference: NDArray[np.int64]  # units kept per side
    n_current: NDArray[np.int64]
    dropped: NDArray[np.int64]  # units set aside as disturbed, both sides
    scale: str  # "log" | "linear"
    better: str  # "lower" | "higher"
    paired: bool
    worse_p: Array  # one-sided p of "no worse than the reference", over every unit (module docstring)
    better_p: Array  # ... of "no better"
    spread: Spread | None = None  # nested pairs: the two levels of the noise, for choosing runs and processes

    def t(self, level: float) -> Array:
        """The t quantile at `level` for each row's degrees of freedom."""
        return np.asarray(stats.t.ppf(level, self.df), dtype=float)

    def p_worse(self) -> Array:
        """One-sided p of 'no worse than the reference'; where both sides are constant, 0 if worse, else 1."""
        return self.worse_p

    def p_better(self) -> Array:
        """One-sided p of 'no better than the reference'."""
        return self.better_p

    def ratio(self, bad: ArrayLike | None = None) -> Array:
        """now / reference for an effect on the bad scale (this estimate's when None)."""
        value = self.bad if bad is None else np.asarray(bad, dtype=float)
        signed = value if self.better == "lower" else -value
        return np.exp(signed) if self.scale == "log" else 1.0 + signed

    def interval(self, confidence: float = 0.95) -> tuple[Array, Array]:
        """Two-sided interval of now / reference."""
        half = np.where(self.se > 0, self.t(0.5 + confidence / 2) * self.se, 0.0)
        ends = np.sort(np.stack([self.ratio(self.bad - half), self.ratio(self.bad + half)]), axis=0)
        return ends[0], ends[1]


def screen(values: Array) -> NDArray[np.bool_]:
    """Mask of the units to keep along the last axis: all but those more than OUTLIER_Z robust SDs from the
    median, at most a quarter of them (more would call the noise itself disturbed), none below SCREEN_MIN."""
    n = values.shape[-1]
    if n < SCREEN_MIN:
        return np.ones(values.shape, dtype=bool)
    centre = np.median(values, axis=-1, keepdims=True)
    mad = stats.median_abs_deviation(values, axis=-1, scale="normal")[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(mad > 0, np.abs(values - centre) / np.where(mad > 0, mad, 1.0), 0.0)
    rank = np.argsort(np.argsort(-z, axis=-1, kind="stable"), axis=-1)  # 0 = the most extreme unit
    return ~((z > OUTLIER_Z) & (rank < n // 4))


def trimmed(values: Array, keep: NDArray[np.bool_]) -> tuple[Array, Array, NDArray[np.int64]]:
    """Per row, over the kept units: (20%-trimmed mean, Yuen's variance term (k-1) s_w^2 / (h (h-1)), h).
    Rows with fewer than 2 units left after trimming get an infinite variance term (nothing is known)."""
    mean = np.empty(values.shape[:-1])
    var = np.empty(values.shape[:-1])
    h = np.empty(values.shape[:-1], dtype=np.int64)
    counts = keep.sum(axis=-1)
    ordered_all = np.sort(np.where(keep, values, np.inf), axis=-1)  # kept units first, in order
    for k in np.unique(counts):
        rows = counts == k
        ordered = ordered_all[rows][:, :k]
        g = math.floor(TRIM * k)
        kept_h = k - 2 * g
        h[rows] = kept_h
        mean[rows] = ordered[:, g : k - g].mean(axis=-1)
        if kept_h < 2:
            var[rows] = np.inf
            continue
        winsorized = np.clip(ordered, ordered[:, g : g + 1], ordered[:, k - g - 1 : k - g])
        var[rows] = (k - 1) * winsorized.var(axis=-1, ddof=1) / (kept_h * (kept_h - 1))
    return mean, var, h


def _scale(reference: Array, current: Array) -> tuple[str, Array]:
    """("log", 1) when every value is positive, else ("linear", |median of the reference| per row)."""
    if np.all(reference > 0) and np.all(current > 0):
        return "log", np.ones((*reference.shape[:-1], 1))
    unit = np.abs(np.median(reference, axis=-1, keepdims=True))
    all_zero = np.all(reference == 0, axis=-1, keepdims=True) & np.all(current == 0, axis=-1, keepdims=True)
    if np.any((unit == 0) & ~all_zero):
        raise NoScale("its reference median is 0: a relative tolerance has no scale")
    return "linear", np.where(unit == 0, 1.0, unit)


def _on_scale(values: Array, scale: str, unit: Array) -> Array:
    return np.log(values) if scale == "log" else values / unit


def _one_sided(effect: Array, se: Array, df: Array) -> tuple[Array, Array]:
    """(p of 'no worse', p of 'no better') of a t for an effect in the bad direction; where it has no spread
    (every pair the same), 0 for the direction it went, else 1."""
    spread = se > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = effect / np.where(spread, se, 1.0)
        worse, improved = stats.t.sf(t, df), stats.t.cdf(t, df)
    return (
        np.asarray(np.where(spread, worse, np.where(effect > 0, 0.0, 1.0)), dtype=float),
        np.asarray(np.where(spread, improved, np.where(effect < 0, 0.0, 1.0)), dtype=float),
    )


def _two_sample(x: Array, keep_x: NDArray[np.bool_], y: Array, keep_y: NDArray[np.bool_]) -> tuple[Array, Array, Array]:
    """Yuen's two-sample trimmed t over the kept units: (difference of trimmed means y - x, its se, Welch df)."""
    (mx, dx, hx), (my, dy, hy) = trimmed(x, keep_x), trimmed(y, keep_y)
    total = dx + dy
    with np.errstate(divide="ignore", invalid="ignore"):
        welch = total**2 / (
            np.where(dx > 0, dx**2 / np.maximum(hx - 1, 1), 0.0) + np.where(dy > 0, dy**2 / np.maximum(hy - 1, 1), 0.0)
        )
    finite = np.isfinite(total) & (total > 0)
    return my - mx, np.sqrt(total), np.where(finite, welch, np.where(total == 0, np.inf, 1.0))


def _one_sample(effects: Array, keep: NDArray[np.bool_]) -> tuple[Array, Array, Array]:
    """Yuen's one-sample trimmed t over the kept units: (trimmed mean, its se, df)."""
    mean, var, h = trimmed(effects, keep)
    return mean, np.sqrt(var), np.where(np.isfinite(var) & (var > 0), h - 1.0, np.where(var == 0, np.inf, 1.0))


def _rank_sum(x: Array, y: Array, better: str) -> tuple[Array, Array]:
    """Mann-Whitney's exact one-sided p of y against x, every unit: (worse, better); where both sides are
    constant, 0 for the direction y went, else 1."""
    with np.errstate(all="ignore"):
        greater = stats.mannwhitneyu(y, x, alternative="greater", axis=-1, method="exact").pvalue
        less = stats.mannwhitneyu(y, x, alternative="less", axis=-1, method="exact").pvalue
    worse, improved = (greater, less) if better == "lower" else (less, greater)
    constant = (np.ptp(x, axis=-1) == 0) & (np.ptp(y, axis=-1) == 0)
    went = (y[..., 0] - x[..., 0]) * (1.0 if better == "lower" else -1.0)
    return (
        np.asarray(np.where(constant, np.where(went > 0, 0.0, 1.0), worse), dtype=float),
        np.asarray(np.where(constant, np.where(went < 0, 0.0, 1.0), improved), dtype=float),
    )


def unpaired(reference: ArrayLike, current: ArrayLike, *, better: str) -> Estimate:
    """Current against a stored reference: each side screened, then Yuen's two-sample trimmed t (Welch df); the
    p is Mann-Whitney's on every unit."""
    ref, cur = np.asarray(reference, dtype=float), np.asarray(current, dtype=float)
    scale, unit = _scale(ref, cur)
    x, y = _on_scale(ref, scale, unit), _on_scale(cur, scale, unit)
    keep_x, keep_y = screen(x), screen(y)
    sign = 1.0 if better == "lower" else -1.0
    diff, se, df = _two_sample(x, keep_x, y, keep_y)
    return Estimate(
        sign * diff,
        se,
        df,
        keep_x.sum(-1),
        keep_y.sum(-1),
        (~keep_x).sum(-1) + (~keep_y).sum(-1),
        scale,
        better,
        False,
        *_rank_sum(x, y, better),
    )


def paired(reference: ArrayLike, current: ArrayLike, *, better: str) -> Estimate:
    """Current against a reference measured beside it, unit by unit (an A/B round: one process per side,
    back to back, so the machine's state of the moment cancels in their ratio): the per-pair effects are
    screened, then Yuen's one-sample trimmed t; the p of every pair's."""
    ref, cur = np.asarray(reference, dtype=float), np.asarray(current, dtype=float)
    if ref.shape != cur.shape:
        raise ValueError(
            f"a paired comparison needs as many reference as current values ({ref.shape[-1]} vs {cur.shape[-1]})"
        )
    scale, unit = _scale(ref, cur)
    effects = _on_scale(cur, scale, unit) - _on_scale(ref, scale, unit)
    keep = screen(effects)
    sign = 1.0 if better == "lower" else -1.0
    mean, se, df = _one_sample(effects, keep)
    every_mean, every_se, every_df = _one_sample(effects, np.ones(effects.shape, dtype=bool))
    kept = keep.sum(-1)
    return Estimate(
        sign * mean,
        se,
        df,
        kept,
        kept,
        (~keep).sum(-1) * 2,
        scale,
        better,
        True,
        *_one_sided(sign * every_mean, every_se, every_df),
    )


def process_means(runs: Array) -> tuple[Array, Array, Array]:
    """Per process (the last axis: its runs, NaN where it took fewer): the RUN_TRIM-trimmed mean, the square of its
    standard error (the winsorized variance, Yuen; NaN with fewer than 2 runs left) and its degrees of freedom."""
    counts = np.sum(~np.isnan(runs), axis=-1)
    ordered_all = np.sort(runs, axis=-1)  # NaN last
    mean, var, df = (np.full(runs.shape[:-1], np.nan) for _ in range(3))
    for k in np.unique(counts):
        if k == 0:
            continue
        rows = counts == k
        ordered = ordered_all[rows][:, :k]
        g = math.floor(RUN_TRIM * k)
        h = k - 2 * g
        mean[rows] = ordered[:, g : k - g].mean(axis=-1)
        if h >= 2:
            winsorized = np.clip(ordered, ordered[:, g : g + 1], ordered[:, k - g - 1 : k - g])
            var[rows] = (k - 1) * winsorized.var(axis=-1, ddof=1) / (h * (h - 1))
            df[rows] = h - 1
    return mean, var, df


def _random_effects(effects: Array, within: Array, within_df: Array) -> tuple[Array, Array, Array, Array]:
    """Per row over its pairs (the last axis): (weighted effect, its Hartung-Knapp se, df = pairs - 1, tau).
    `within` is each pair's variance from its runs, NaN where a process took one run: then every pair weighs alike
    and the interval is the paired t on the pairs' means, tau the pairs' whole scatter."""
    k = effects.shape[-1]
    finite = np.isfinite(within)
    known = np.asarray(finite.all(axis=-1, keepdims=True))
    pooled = np.sum(np.where(finite, within, 0.0), axis=-1, keepdims=True) / np.maximum(
        finite.sum(axis=-1, keepdims=True), 1
    )
    dof = np.where(np.isfinite(within_df), within_df, 0.0)
    shrunk = np.where(known, (dof * np.where(finite, within, 0.0) + PRIOR_DF * pooled) / (dof + PRIOR_DF), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        fixed = np.where(shrunk > 0, 1.0 / shrunk, 0.0)  # constant runs everywhere: no spread to weigh by
        weighed = fixed.sum(axis=-1) > 0
        centre = np.sum(fixed * effects, axis=-1, keepdims=True) / fixed.sum(axis=-1, keepdims=True)
        q = np.sum(fixed * (effects - centre) ** 2, axis=-1)
        c = fixed.sum(axis=-1) - np.sum(fixed**2, axis=-1) / fixed.sum(axis=-1)
        tau2 = np.where(weighed, np.maximum(0.0, (q - (k - 1)) / np.where(c > 0, c, 1.0)), 0.0)
        weights = np.where(weighed[..., None], 1.0 / (shrunk + tau2[..., None]), 1.0)
        total = weights.sum(axis=-1)
        estimate = np.sum(weights * effects, axis=-1) / total
        var = np.sum(weights * (effects - estimate[..., None]) ** 2, axis=-1) / (max(k - 1, 1) * total)
    se = np.sqrt(var) if k >= 2 else np.full(estimate.shape, np.inf)
    tau2 = np.where(known[..., 0], tau2, var * k if k >= 2 else np.nan)
    return estimate, se, np.full(estimate.shape, float(max(k - 1, 1))), np.sqrt(tau2)


def nested(reference: ArrayLike, current: ArrayLike, *, better: str) -> Estimate:
    """A/B pairs with every run of both processes of each pair: arrays (..., pairs, runs), NaN where a process
    took fewer runs than the longest. Each process is summarised by its runs' mean (process_means), the pairs'
    effects combined as a random-effects model (module docstring). No pair is set aside: without a trimmed mean
    over the pairs, setting the farthest aside made 95% intervals miss 1.6 times as often as they say."""
    ref, cur = np.asarray(reference, dtype=float), np.asarray(current, dtype=float)
    if ref.shape[:-1] != cur.shape[:-1]:
        raise ValueError(
            f"a nested comparison needs as many reference as current processes ({ref.shape[-2]} vs {cur.shape[-2]})"
        )
    flat_ref, flat_cur = ref.reshape(*ref.shape[:-2], -1), cur.reshape(*cur.shape[:-2], -1)
    if np.all(np.nan_to_num(flat_ref, nan=1.0) > 0) and np.all(np.nan_to_num(flat_cur, nan=1.0) > 0):
        scale, unit = "log", np.ones((*ref.shape[:-2], 1, 1))
    else:  # NaN-padded runs: the rows' medians over every run, as _scale does over units
        scale, unit = _scale(
            np.where(np.isnan(flat_ref), np.nanmedian(flat_ref, axis=-1, keepdims=True), flat_ref),
            np.where(np.isnan(flat_cur), np.nanmedian(flat_cur, axis=-1, keepdims=True), flat_cur),
        )
        unit = unit[..., None]
    ref_mean, ref_var, ref_df = process_means(_on_scale(ref, scale, unit))
    cur_mean, cur_var, cur_df = process_means(_on_scale(cur, scale, unit))
    sign = 1.0 if better == "lower" else -1.0
    effects = sign * (cur_mean - ref_mean)
    within, within_df = ref_var + cur_var, ref_df + cur_df
    mean, se, df, tau = _random_effects(effects, within, within_df)
    runs = np.concatenate([_runs(ref), _runs(cur)], axis=-1)
    per_run = np.concatenate([ref_var, cur_var], axis=-1) * runs  # a process mean's variance x its runs
    measured = np.isfinite(per_run)
    within_run = np.sum(np.where(measured, per_run, 0.0), axis=-1) / np.maximum(measured.sum(axis=-1), 1)
    spread = Spread(between=tau, within=np.where(measured.any(axis=-1), np.sqrt(within_run), np.nan))
    pairs = np.full(mean.shape, effects.shape[-1])
    return Estimate(
        mean,
        se,
        df,
        pairs,
        pairs,
        np.zeros(mean.shape, int),
        scale,
        better,
        True,
        *_one_sided(mean, se, df),
        spread=spread,
    )


def _runs(values: Array) -> Array:
    """Runs per process (the last axis), NaN-padded."""
    return np.sum(~np.isnan(values), axis=-1).astype(float)
