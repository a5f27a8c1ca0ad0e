"""Seeded synthetic histories: one value per commit (the median of a job's per-process medians), multiplicative
Gaussian noise at a given coefficient of variation, steps and outlier jobs placed where a case says.

The same histories drive the goals' tests (tests/test_history_goals.py), the method's measurement
(scripts/history_methods.py) and the Otava check (scripts/history_otava_check.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 100.0  # ms: the series' level before any step


@dataclass(frozen=True)
class Case:
    commits: int
    cv: float
    steps: tuple[tuple[int, float], ...] = ()  # (first commit of the new level, relative size)
    outliers: tuple[tuple[int, float], ...] = ()  # (commit, relative size) of single slow jobs


def history(case: Case, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    level = np.full(case.commits, LEVEL)
    for at, size in case.steps:
        level[at:] *= 1 + size
    values = level * (1 + rng.normal(0.0, case.cv, case.commits))
    for at, size in case.outliers:
        values[at] *= 1 + size
    return values


def histories(case: Case, seeds: Sequence[int]) -> list[np.ndarray]:
    return [history(case, seed) for seed in seeds]
