"""When a change point is an alarm: `provisional` while few commits follow it, `confirmed` once enough do and the
analyses of the series as it stood after each of the last few commits all find it.

A change point near the newest commit rests on a commit or two: a single slow job there looks like a new level
until the next jobs say otherwise (every method flags it, docs/history.md). So an alarm is confirmed only when the
method's `confirm_after` commits have been measured from its first commit on and the analyses of the series cut at
each of its last `confirm_looks` lengths (the newest included) all find a change point within `SAME_POINT` commits
of it. Those analyses are computed from
the store's rows, not remembered: the same store always gives the same states.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .detect import DEFAULT_METHOD, Method, change_points

SAME_POINT = 1  # commits a change point may move between analyses and still be the same
#: Series shorter than this are not analysed: too few commits to tell a level from noise.
MIN_COMMITS = 8


@dataclass(frozen=True)
class Found:
    index: int  # the first commit of the new level
    confirmed: bool
    commits_after: int  # commits measured from the change on (it included)


class Analyses:
    """Change points of the series cut after each commit, each computed once."""

    def __init__(self, values: Sequence[float], method: Method = DEFAULT_METHOD) -> None:
        self.values = list(values)
        self.method = method
        self._done: dict[int, list[int]] = {}

    def at(self, length: int) -> list[int]:
        if length not in self._done:
            self._done[length] = change_points(self.values[:length], self.method) if length >= MIN_COMMITS else []
        return self._done[length]

    def found(self, length: int | None = None) -> list[Found]:
        """The change points of the series cut at `length` (all of it by default), each with its state."""
        length = len(self.values) if length is None else length
        return [Found(i, self._confirmed(i, length), length - i) for i in self.at(length)]

    def _confirmed(self, index: int, length: int) -> bool:
        if length - index < self.method.confirm_after:
            return False
        looks = range(length, length - self.method.confirm_looks, -1)
        return all(any(abs(j - index) <= SAME_POINT for j in self.at(n)) for n in looks)


def first_confirmations(
    values: Sequence[float], method: Method = DEFAULT_METHOD, *, start: int = MIN_COMMITS, merge: int = 3
) -> list[tuple[int, int]]:
    """Replay the series as if analysed after every commit: (length when first confirmed, index) of each alarm,
    an alarm within `merge` commits of one already raised being the same one (one alarm per change)."""
    analyses = Analyses(values, method)
    raised: list[tuple[int, int]] = []
    for length in range(start, len(values) + 1):
        for f in analyses.found(length):
            if f.confirmed and not any(abs(f.index - i) <= merge for _, i in raised):
                raised.append((length, f.index))
    return raised
