"""How much of each tail the gate's trimmed statistics drop (judge/stats.py), and what that leaves.

Apart from the statistics because the options' defaults read it (orchestrate/session.py's cap), and those are
computed in every pytest session: this module imports nothing heavy.
"""

from __future__ import annotations

import math

#: Fraction trimmed from each tail for the location and its standard error (Yuen).
TRIM = 0.2


def kept(units: int) -> int:
    """Units left after trimming TRIM from each tail."""
    return units - 2 * math.floor(TRIM * units)
