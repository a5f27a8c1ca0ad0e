"""Events: the changes of many series at one place, reported, failed on and marked as one.

A cause moves every series it touches at the same commit: a runner image or host, a dependency, a change of the
engine itself. Change points of the series of one target and machine class that start within `SPREAD` commits of
each other (in the commits' common order, `Point.order`) are one event, with the series it moved and the spread of
their sizes. An event that moves most of the series measured across it, the same way, says so: on real CI data
that is the runner or its environment more often than the code (docs/history.md, "Real histories"), besides what
the fingerprints say (`env_changed`, `machine_changed`), which CI data often lack (a hosted runner's fingerprint can
stay equal while its host changes).

An event is confirmed when one of its changes is, a regression when its confirmed changes (else all of them) are
regressions, an improvement when none is, mixed otherwise; it fails when one of its changes fails
(`Change.fails`). `--llmperf-history-check=fail` and `analyze --fail` count events, not series.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from .analysis import Change, SeriesAnalysis

SPREAD = 2  # commits between the first and the last change of one event
SHARED = 0.5  # an event moving more than this share of the series measured across it, alike, moves the machine
MIN_SHARED = 3  # and at least this many series
ALIKE = 0.75  # of its changes, at least this share the same way


@dataclass(frozen=True)
class Event:
    target: str
    machine: str
    changes: tuple[Change, ...]  # one per series it moved, by series label
    series_total: int  # the series of this target and machine measured before and after it
    min_effect: float

    @property
    def id(self) -> str:
        """`EVENT:<machine class hash>@<first bad commit>`, for `pytest-llmperf history mark`."""
        machine = hashlib.sha256(f"{self.target}\0{self.machine}".encode()).hexdigest()[:8]
        return f"EVENT:{machine}@{self.first_bad[:12]}"

    @property
    def state(self) -> str:
        return "confirmed" if any(c.state == "confirmed" for c in self.changes) else "provisional"

    def _deciding(self) -> list[Change]:
        confirmed = [c for c in self.changes if c.state == "confirmed"]
        return confirmed or list(self.changes)

    @property
    def kind(self) -> str:
        kinds = {c.kind for c in self._deciding()}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def last_good(self) -> str:
        """The earliest last good commit of its changes."""
        return min(self.changes, key=lambda c: (c.order, c.label)).last_good

    @property
    def first_bad(self) -> str:
        """The latest first bad commit of its changes."""
        return max(self.changes, key=lambda c: (c.order, c.label)).first_bad

    @property
    def sizes(self) -> tuple[float, float]:
        sizes = [c.change for c in self._deciding()]
        return min(sizes), max(sizes)

    @property
    def shared(self) -> bool:
        """Most series measured across it moved, and alike: the runner or its environment, more likely than code."""
        deciding = self._deciding()
        ups = sum(c.change > 0 for c in deciding)
        alike = max(ups, len(deciding) - ups) >= ALIKE * len(deciding)
        moved = len(self.changes)
        return moved >= MIN_SHARED and moved > SHARED * self.series_total and alike

    @property
    def fails(self) -> bool:
        return any(c.fails(self.min_effect) for c in self.changes)

    @property
    def mark(self) -> str | None:
        """A mark every change of it carries (marking the event marks them all)."""
        marks = {c.mark for c in self.changes}
        return marks.pop() if len(marks) == 1 else None

    @property
    def changed_there(self) -> list[str]:
        return [
            what
            for what, on in (
                ("environment", any(c.env_changed for c in self.changes)),
                ("machine", any(c.machine_changed for c in self.changes)),
            )
            if on
        ]

    def describe(self) -> str:
        """`+11.2% to +19.0% in 58 of 65 series`, and what it likely is."""
        low, high = self.sizes
        size = f"{low:+.1%}" if len(self._deciding()) == 1 else f"{low:+.1%} to {high:+.1%}"
        text = f"{size} in {len(self.changes)} of {self.series_total} series"
        if self.shared:
            text += ", most of this machine's series alike: likely the runner or its environment"
        if self.changed_there:
            text += f" ({' and '.join(self.changed_there)} changed there)"
        return text


def events(analyses: Sequence[SeriesAnalysis], min_effect: float) -> list[Event]:
    """The changes of `analyses` grouped into events, per target and machine class; confirmed first, then by the
    number of series moved."""
    groups: dict[tuple[str, str], list[SeriesAnalysis]] = defaultdict(list)
    for a in analyses:
        groups[(a.series.id.target, a.series.id.machine)].append(a)
    found = []
    for (target, machine), members in groups.items():
        cluster: list[Change] = []
        for change in sorted((c for a in members for c in a.changes), key=lambda c: (c.order, c.label)):
            if cluster and change.order - cluster[0].order > SPREAD:
                found.append(_event(target, machine, cluster, members, min_effect))
                cluster = []
            cluster.append(change)
        if cluster:
            found.append(_event(target, machine, cluster, members, min_effect))
    return sorted(found, key=lambda e: (e.state != "confirmed", -len(e.changes), e.first_bad))


def _event(
    target: str, machine: str, cluster: list[Change], members: Sequence[SeriesAnalysis], min_effect: float
) -> Event:
    first, last = cluster[0].order, cluster[-1].order
    total = sum(bool(a.series.points) and a.series.points[0].order < first and a.series.points[-1].order >= last
                for a in members)  # fmt: skip
    by_series: dict[str, Change] = {}
    for change in cluster:  # one change a series: its confirmed one, else its first
        held = by_series.get(change.series_key)
        if held is None or (change.state == "confirmed" and held.state != "confirmed"):
            by_series[change.series_key] = change
    changes = tuple(sorted(by_series.values(), key=lambda c: c.label))
    return Event(target, machine, changes, max(total, len(changes)), min_effect)
