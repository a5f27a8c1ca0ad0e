"""Bisection over commits: which commit made the benchmarks slower, each step one of this plugin's A/B jobs.

`pytest-llmperf bisect GOOD BAD` (bisection_run.py runs it) composes what exists, as asv's `continuous` composes
`run` and `compare`: a step is the A/B job a user runs (`pytest ... --llmperf-compare=GOOD` in a worktree of the
commit), and this module only reads the verdicts of its JSON report (`step_outcome`) and chooses the next commit
(`Search`). Nothing here measures or judges.

- A step is *bad* when a row of its report regressed, *good* when its rows were decided and none regressed, and
  *skipped* otherwise, as `git bisect skip` would: undecided at the cap (inconclusive), nothing compared, or no
  report at all (a commit that does not collect or build). The next step takes the untested commit nearest the
  middle of what is left, so one skip costs one step more.
- The result is the first bad commit, confirmed by an A/B of it against its parent: a slowdown that accumulated
  over several commits below the tolerance each finds a first commit past it against GOOD, which its parent
  does not confirm, and the result says so. Skipped commits next to it leave the result ambiguous: all are named.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .judge.verdicts import COMPARED, DECIDED, Verdict
from .report.tables import markdown_text, table

BAD, GOOD, SKIP = "bad", "good", "skip"


@dataclass(frozen=True)
class Row:
    """The row of a step's verdict table that speaks for the step (the most regressed, else the largest change)."""

    test: str
    metric: str
    batch_size: int
    ratio: float | None
    low: float | None
    high: float | None
    verdict: str

    def text(self) -> str:
        interval = "" if self.low is None or self.high is None else f" [{self.low:.3f}, {self.high:.3f}]"
        ratio = "n/a" if self.ratio is None else f"{self.ratio:.3f}"
        return f"{self.metric} bs {self.batch_size} ratio {ratio}{interval} {self.verdict}"


@dataclass(frozen=True)
class Step:
    number: int
    commit: str
    subject: str
    against: str  # the A side's commit: GOOD, or the commit's parent for the confirmation
    role: str  # bisect | confirm; over packages (bisection_packages.py): part | complement | check | whole
    outcome: str  # bad | good | skip; over packages also unresolved (uv could not build it: no job)
    why: str
    row: Row | None
    seconds: float
    exit_code: int
    log: str  # the step's pytest output
    packages: tuple[str, ...] = ()  # over packages: those at BAD's versions, 'name GOOD -> BAD'


def _effect(row: Mapping[str, Any]) -> float:
    ratio = row.get("ratio")
    return abs(math.log(ratio)) if isinstance(ratio, (int, float)) and ratio > 0 else 0.0


def _row(data: Mapping[str, Any]) -> Row:
    return Row(
        str(data.get("nodeid") or data.get("key", "")),
        str(data.get("metric", "")),
        int(data.get("batch_size", 0)),
        data.get("ratio"),
        data.get("ci_low"),
        data.get("ci_high"),
        str(data.get("verdict", "")),
    )


def step_outcome(
    document: Mapping[str, Any] | None,
    exit_code: int,
    metrics: Sequence[str] = (),
    batch_size: int | None = None,
    focus: tuple[str, int] | None = None,
) -> tuple[str, str, Row | None]:
    """(outcome, why, the row that speaks for it) of one A/B job from its JSON report (--llmperf-json), None when it
    wrote none. `metrics` and `batch_size` keep only those rows (a history series'); by default every row counts.
    `focus` (metric, batch size): the row shown for a step that did not regress, where it has one (the row an earlier
    step found regressed, so that the table follows one ratio)."""
    if document is None:
        return SKIP, f"no report (pytest exited {exit_code}): the commit does not collect or build here", None
    rows = [
        r
        for r in document.get("verdicts", [])
        if (not metrics or r.get("metric") in metrics) and (batch_size is None or r.get("batch_size") == batch_size)
    ]
    compared = [r for r in rows if r.get("verdict") in COMPARED]
    regressed = [r for r in compared if r.get("verdict") == Verdict.REGRESSED]
    if regressed:
        worst = max(regressed, key=_effect)
        return BAD, f"{len(regressed)} row(s) regressed", _row(worst)
    open_rows = [r for r in compared if r.get("verdict") == Verdict.INCONCLUSIVE]
    if open_rows:
        return SKIP, f"{len(open_rows)} row(s) inconclusive at the cap: undecided", _row(max(open_rows, key=_effect))
    decided = [r for r in compared if r.get("verdict") in DECIDED]
    if decided:
        shown = [r for r in decided if (r.get("metric"), r.get("batch_size")) == focus] or decided
        return GOOD, f"{len(decided)} row(s) decided, none regressed", _row(max(shown, key=_effect))
    counts = ", ".join(f"{n} {k}" for k, n in sorted(document.get("counts", {}).items())) or "no benchmark"
    chosen = f" among the rows of {', '.join(metrics)}" if metrics else ""
    return SKIP, f"nothing compared{chosen} ({counts}; pytest exited {exit_code})", None


def focus_of(steps: Iterable[Step]) -> tuple[str, int] | None:
    """(metric, batch size) of the row the last bad step found regressed: what the next steps show (step_outcome)."""
    regressed = [s.row for s in steps if s.outcome == BAD and s.row]
    return (regressed[-1].metric, regressed[-1].batch_size) if regressed else None


@dataclass
class Search:
    """The state of a bisection over `commits` (oldest first, after GOOD; the last is BAD, taken as bad)."""

    commits: Sequence[str]
    good: int = -1  # the newest commit known good (-1: GOOD itself)
    bad: int = -2  # the oldest known bad (-2: set to the last, BAD)
    skipped: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.bad == -2:
            self.bad = len(self.commits) - 1

    def candidates(self) -> list[int]:
        return [i for i in range(self.good + 1, self.bad) if i not in self.skipped]

    def next(self) -> int | None:
        """The untested commit nearest the middle of what is left; None when the first bad one is known (or, with
        skipped commits, narrowed as far as it can be)."""
        left = self.candidates()
        middle = (self.good + self.bad) / 2
        return min(left, key=lambda i: (abs(i - middle), i)) if left else None

    def record(self, index: int, outcome: str) -> None:
        if outcome == BAD:
            self.bad = index
        elif outcome == GOOD:
            self.good = index
        else:
            self.skipped.add(index)

    def steps_left(self) -> int:
        """About how many steps are still to come (without skips)."""
        span = len(self.candidates()) + 1
        return math.ceil(math.log2(span)) if span > 1 else 0

    def suspects(self) -> list[int]:
        """The commits that may be the first bad one: the skipped ones just before the oldest bad, and it."""
        return [i for i in range(self.good + 1, self.bad) if i in self.skipped] + [self.bad]


@dataclass
class Bisection:
    """What a bisection found, as the report shows it."""

    good: str
    bad: str
    commits: int  # first-parent commits after GOOD up to BAD
    command: str  # what each step runs, in a worktree of its commit
    steps: list[Step] = field(default_factory=list)
    first_bad: str | None = None
    subject: str = ""
    suspects: list[str] = field(default_factory=list)  # skipped commits that may be it instead
    confirmed_by: int | None = None  # the step that measured it against its parent
    status: str = "running"  # found | not-confirmed | unconfirmed | ambiguous | interrupted | running
    seconds: float = 0.0

    def verdict(self) -> str:
        commit = (self.first_bad or "")[:12]
        confirm = self.steps[self.confirmed_by - 1] if self.confirmed_by else None
        against = f" (against its parent: {confirm.row.text()})" if confirm and confirm.row else ""
        return {
            "found": f"first bad commit: {commit} {self.subject}{against}",
            "ambiguous": f"the first bad commit is one of {', '.join(c[:12] for c in self.suspects)}: the steps "
            "between the last good one and the first bad one could not decide (skipped)",
            "not-confirmed": f"{commit} {self.subject} is the first commit slower than GOOD, but against its parent it "
            f"is not{against}: the slowdown accumulated over several commits, or a step was misled",
            "unconfirmed": f"{commit} {self.subject} is the first commit slower than GOOD; its A/B against its "
            "parent could not decide",
            "interrupted": f"interrupted after {len(self.steps)} step(s)",
            "running": f"{len(self.steps)} step(s) so far",
        }[self.status]

    def exit_code(self) -> int:
        return 0 if self.status == "found" else 130 if self.status == "interrupted" else 1

    def document(self) -> dict[str, Any]:
        return {**asdict(self), "result": self.verdict()}

    def markdown(self) -> str:
        lines = [
            f"# Bisection {self.good[:12]}..{self.bad[:12]}",
            "",
            markdown_text(f"{self.commits} first-parent commits; each step: {self.command}"),
            "",
            f"**{markdown_text(self.verdict())}**",
            "",
            step_table(self.steps, markdown=True),
            "",
            f"{len(self.steps)} A/B job(s) in {self.seconds:.0f} s",
            "",
        ]
        return "\n".join(lines)


def step_table(steps: Iterable[Step], *, markdown: bool, subject: str = "commit") -> str:
    """The steps' table; `subject`: the second column's name (over packages: the step's subject alone, no commit)."""
    header = ("step", subject, "against", "metric", "ratio [95% CI]", "verdict", "step says", "seconds")
    rows = []
    for s in steps:
        row = s.row
        ratio = "" if row is None or row.ratio is None else f"{row.ratio:.3f}"
        if row is not None and row.low is not None and row.high is not None:
            ratio += f" [{row.low:.3f}, {row.high:.3f}]"
        metric = "" if row is None else f"{row.metric} bs {row.batch_size}"
        name = f"{s.number}" + (f" ({s.role})" if s.role != "bisect" else "")
        what = f"{s.outcome}: {s.why}"
        first = f"{s.commit[:10]} {s.subject[:40]}" if subject == "commit" else s.subject
        rows.append([name, first, s.against[:10], metric, ratio,
                     "" if row is None else row.verdict, what, f"{s.seconds:.0f}"])  # fmt: skip
    return table(header, rows, markdown=markdown)
