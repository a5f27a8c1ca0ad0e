"""How far from the level a commit or a change must be: Page's decision interval for the cumulative sum, a commit's
distance as an N(0, 1) draw, and the smallest change a series' noise resolves between two segments. The statistics
alarms.py reads against; each a formula with its source, each computed once for its arguments.
"""

from __future__ import annotations

import math
from functools import lru_cache

SIEGMUND_SHIFT = 1.166  # Siegmund's correction of a CUSUM's decision interval for its overshoot (in sigmas)
_EXACT_TAIL = 1e-12  # beyond this tail probability a commit's distance is taken as it is (the quantile saturates)


@lru_cache(maxsize=65536)
def decision_interval(reference: float, run_length: float) -> float:
    """Page's CUSUM decision interval h, in sigmas, for a reference of `reference` sigmas a commit and an average
    run length of `run_length` commits between false alarms (one side), by Siegmund's approximation
    ARL = (exp(2 k b) - 2 k b - 1) / (2 k^2), b = h + 1.166 (Siegmund, "Sequential Analysis", 1985), solved in
    logarithms, which are monotone in b. Beyond a reference of a few sigmas h is 0; the bounds keep floats finite."""
    from scipy.optimize import brentq

    k = min(max(reference, 1e-3), 1e3)

    def excess(b: float) -> float:
        x = 2 * k * b
        return math.log(math.expm1(x) - x) - math.log(2 * k * k * run_length)

    high = min(math.sqrt(run_length) + 1, 700 / (2 * k))  # ARL >= b^2; exp(700) is still a float
    return max(0.0, float(brentq(excess, 1e-3 / k, high)) - SIEGMUND_SHIFT)


def resolution(noise: float, before: int, after: int, p_value: float) -> float:
    """The smallest difference of two means, of `before` and `after` commits with a deviation of `noise` each (in
    logs), that a one-sided test at `p_value` tells from noise: z sigma sqrt(1/before + 1/after). A change smaller
    than this at the commits seen is not confirmed, and does not fail a job (`analysis.Change.fails`): in a series
    whose noise is twice the smallest change that matters, a 5% change needs some 100 commits a side."""
    from scipy.special import ndtri

    if before <= 0 or after <= 0:
        return math.inf
    return -float(ndtri(p_value)) * noise * math.sqrt(1 / before + 1 / after)


def standard_normal(distance: float, freedom: int) -> float:
    """Student's t `distance` with `freedom` degrees of freedom as the N(0, 1) quantile of the same tail."""
    return math.copysign(_quantile_of(abs(distance), freedom), distance)


@lru_cache(maxsize=1024)
def _quantile_of(distance: float, freedom: int) -> float:
    """For a distance >= 0 (each commit asks once a side, with the same distance: cached)."""
    from scipy.special import ndtri, stdtr

    tail = float(stdtr(freedom, -distance))
    return -float(ndtri(tail)) if tail > _EXACT_TAIL else distance
