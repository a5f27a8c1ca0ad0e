"""Creep: how far a series has drifted since an anchor (a release tag's commit, or the oldest commit analysed).

Small steps of a few percent each merge into one or two change points, or none, yet add up. So the drift is
measured apart from where change points fall: the level at the anchor is the mean (of the logarithms) of the
`WINDOW` commits from the anchor on, the level now that of the newest `WINDOW` commits, outlier jobs set aside. It
is flagged when Mann-Whitney's test of the two windows gives p < the method's p_value and the drift is at least
`min_drift`: half the smallest change that matters (llmperf_history_min_effect), since the drift is read from 15
commits a side and scatters by about +-2% at 3% noise (a 6% drift read against a 5% line would be missed one time
in four; docs/history.md).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from .detect import two_sample_p

WINDOW = 15  # commits at each end


@dataclass(frozen=True)
class Creep:
    anchor: int  # index of the anchor commit
    first: tuple[int, int]  # [start, end) of the anchor's window
    last: tuple[int, int]  # [start, end) of the newest window
    drift: float  # relative: level now / level at the anchor - 1
    p_value: float
    flagged: bool


def creep(
    values: Sequence[float],
    *,
    anchor: int = 0,
    min_drift: float,
    p_value: float,
    set_aside: Collection[int] = (),
    window: int = WINDOW,
) -> Creep | None:
    """The drift since `anchor`, or None when the series since it is too short for two windows."""
    n = len(values)
    if n - anchor < 2 * window:
        return None
    logs = np.log(np.asarray(values, dtype=float))
    first_span, last_span = (anchor, anchor + window), (n - window, n)
    first = np.array([logs[i] for i in range(*first_span) if i not in set_aside])
    last = np.array([logs[i] for i in range(*last_span) if i not in set_aside])
    drift = math.exp(float(np.mean(last) - np.mean(first))) - 1
    p = two_sample_p(first, last)
    return Creep(anchor, first_span, last_span, drift, p, abs(drift) >= min_drift and p < p_value)
