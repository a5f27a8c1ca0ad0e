"""A machine kept busy by other processes while a side was measured: which comparisons that refuses, and the
--llmperf-max-load that would admit them."""

from __future__ import annotations

import math


def admitting(load: float) -> float:
    """A --llmperf-max-load that admits `load` cores: 0.25 more, rounded up to 2 significant digits (rounding to
    nearest could land below the load: 10.24 + 0.25 -> 10)."""
    value = load + 0.25
    scale = 10.0 ** (1 - math.floor(math.log10(value)))
    return math.ceil(round(value * scale, 9)) / scale


def busy_note(current_load: float | None, baseline_load: float | None, max_load: float) -> str | None:
    """Why a batch size cannot be judged: either side measured while other processes used the CPU."""
    if current_load is not None and current_load > max_load:
        return (
            f"machine busy: other processes used {current_load:.2f} cores during the runs "
            f"(limit {max_load:g}, --llmperf-max-load); not compared"
        )
    if baseline_load is not None and baseline_load > max_load:
        return (
            f"baseline measured on a busy machine ({baseline_load:.2f} cores used by other processes, "
            f"limit {max_load:g}, --llmperf-max-load); not compared"
        )
    return None
