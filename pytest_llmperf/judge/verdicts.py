"""The words of a judgement, defined once: a row's verdict, a benchmark's status and the one kind it counts as.

- `Verdict`: one row of the verdict table (a metric at a batch size), compared or not.
- `Status`: what happened to one benchmark: compared with its reference, recorded, refused, missing, new.
- `Kind`: the one word a benchmark counts as in every summary line (`kind_of`); each benchmark counts once.

A benchmark is *judged* when at least one of its rows got a verdict from a comparison (pass, regressed,
improved, inconclusive); refused comparisons, missing baselines, new tests and recordings judged nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..measure.records import BenchmarkResult


class _Word(str, Enum):
    """A str-valued enum that prints, formats and serialises as its word."""

    def __str__(self) -> str:
        return str(self.value)


class Verdict(_Word):
    PASS = "pass"
    REGRESSED = "regressed"
    IMPROVED = "improved"
    INCONCLUSIVE = "inconclusive"  # the process cap was reached before the row was decided
    REFUSED = "refused"  # not compared: a busy machine or baseline, units that do not compare
    UNGATED = "ungated"  # a gated metric that could not be tested (not measured on one side, too few gaps)
    MISSING = "missing"  # a gated metric or a batch size this run measured and its stored baseline holds no values of
    NEW = "new"  # a batch size the A side of an A/B comparison did not measure, or its baseline failed at
    OOM = "oom"  # a batch size with no baseline that ran out of memory
    ERROR = "error"  # a batch size with no baseline that failed
    UNDECIDED = "undecided"  # still being measured: more units at the next look (never in a final outcome)
    INVALID = "invalid"  # a measured value the gate cannot use (NaN, infinite, a time <= 0): fails the test
    CHANGED = "changed"  # generated tokens differ from the reference's
    VARIES = "varies"  # generated tokens differ between runs: not compared


#: Verdicts that come from a comparison: a row with one of these was judged.
DECIDED = frozenset({Verdict.PASS, Verdict.REGRESSED, Verdict.IMPROVED})
COMPARED = DECIDED | {Verdict.INCONCLUSIVE}


class Status(_Word):
    COMPARED = "compared"
    CREATED = "created"
    UPDATED = "updated"
    REFUSED = "refused"
    MISSING = "missing"
    NEW = "new"  # A/B: the test exists in the working tree only


class Kind(_Word):
    PASSED = "passed"
    REGRESSED = "regressed"
    IMPROVED = "improved"
    INCONCLUSIVE = "inconclusive"
    OUTPUTS_CHANGED = "outputs changed"
    CREATED = "created"
    UPDATED = "updated"
    NEW = "new"
    REFUSED = "refused"
    MISSING = "missing"


#: Kinds that judged something, in the order of the summary's count line (the others follow).
JUDGED = (Kind.PASSED, Kind.REGRESSED, Kind.IMPROVED, Kind.INCONCLUSIVE, Kind.OUTPUTS_CHANGED)
NOT_JUDGED = (Kind.CREATED, Kind.UPDATED, Kind.NEW, Kind.REFUSED, Kind.MISSING)


@dataclass(frozen=True)
class Row:
    """One line of the verdict table: a metric at a batch size, compared or not."""

    key: str
    nodeid: str
    metric: str  # "*" for the batch size as a whole
    batch_size: int
    baseline: float | None
    now: float | None
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_adjusted: float | None
    verdict: Verdict
    note: str = ""
    p_better: float | None = None  # one-sided p of the improving direction (reports show it for "improved")
    # A/B pairs with their runs (judge/stats.py, `nested`): how much a pair's effect scatters beyond its runs, and one
    # run within its process (log scale); what the next look's runs and processes are chosen from (judge/procedure.py)
    between_sd: float | None = None
    within_sd: float | None = None
    se: float | None = None  # the estimate's standard error (log scale): the information it holds
    bound: float | None = None  # an inconclusive row: the largest regression its interval leaves possible (0.088)

    def medians_ratio(self) -> float | None:
        """Now's median over the baseline's. The tables show `ratio`, the one the verdict rests on (the gate's
        estimate); this one the JSON report and the JUnit properties keep beside it."""
        return self.now / self.baseline if self.baseline and self.now is not None else None


def note_row(result: BenchmarkResult, metric: str, batch_size: int, verdict: Verdict, note: str) -> Row:
    """A row without numbers: a refusal, a batch that failed, an ungated metric, changed outputs."""
    return Row(result.key, result.nodeid, metric, batch_size, None, None, None, None, None, None, None, verdict, note)


@dataclass
class Outcome:
    """What happened to one benchmark: its status and the verdict rows."""

    result: BenchmarkResult
    status: Status
    rows: list[Row] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)  # what its kind says: fail the test where fail_on lists it
    errors: list[str] = field(default_factory=list)  # always fail the test: an unusable baseline, another GPU
    drift: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    baseline_path: str = ""
    reference: BenchmarkResult | None = None  # the A side of an A/B comparison, every run of it
    reason: str = ""  # why nothing was judged, for the summary's judged line
    changed: list[str] = field(default_factory=list)  # generated tokens that changed, failing (--llmperf-outputs)
    outputs_unchecked: bool = False  # outputs measured, but the baseline (or the ref) holds none to compare with
    warnings: list[str] = field(default_factory=list)  # said at the test's location, never failing it
    baseline_created: str = ""  # when the stored baseline it was judged against was recorded (ISO 8601, UTC)

    @property
    def kind(self) -> Kind:
        return kind_of(self)


def kind_of(outcome: Outcome) -> Kind:
    """The one kind a benchmark counts as. A comparison in which no row was compared (every row refused,
    ungated or new) judged nothing and is never counted as passed."""
    if outcome.status != Status.COMPARED:
        return Kind(outcome.status.value)
    verdicts = {r.verdict for r in outcome.rows}
    if Verdict.MISSING in verdicts and Verdict.REGRESSED not in verdicts and not outcome.changed:
        return Kind.MISSING  # the baseline lacks a gated metric: as a missing baseline, whatever the others did
    if not verdicts & COMPARED:
        return Kind.NEW if verdicts and verdicts <= {Verdict.NEW, Verdict.OOM, Verdict.ERROR} else Kind.REFUSED
    if Verdict.REGRESSED in verdicts:
        return Kind.REGRESSED
    if outcome.changed:  # its timings may pass, but it fails: the tokens it generates changed
        return Kind.OUTPUTS_CHANGED
    if Verdict.INCONCLUSIVE in verdicts:
        return Kind.INCONCLUSIVE
    if Verdict.IMPROVED in verdicts:
        return Kind.IMPROVED
    return Kind.PASSED


def reason_of(outcome: Outcome) -> str:
    """Why a benchmark was not judged (or was inconclusive), in a few words."""
    if outcome.reason:
        return outcome.reason
    kind = kind_of(outcome)
    if kind == Kind.MISSING:
        if outcome.status != Status.COMPARED:
            return "no baseline"
        lacks = {
            "batch sizes" if r.metric == "*" else "gated metrics" for r in outcome.rows if r.verdict == Verdict.MISSING
        }
        return "the baseline lacks " + " and ".join(sorted(lacks))
    if kind in (Kind.CREATED, Kind.UPDATED):
        return "baseline written"
    if kind == Kind.NEW:
        return "no baseline for its batch sizes" if outcome.status == Status.COMPARED else "new test"
    if kind == Kind.REFUSED:
        notes = {r.note for r in outcome.rows if r.verdict == Verdict.REFUSED}
        if any(n.startswith("machine busy") for n in notes):
            return "machine busy"
        if not notes:
            return (
                "nothing gated was measured" if any(r.verdict == Verdict.UNGATED for r in outcome.rows) else "refused"
            )
        # judge/rows.py words each refusal so that its head says why
        return (
            "baseline from a busy machine"
            if any(n.startswith("baseline measured on a busy machine") for n in notes)
            else "not comparable"
        )
    if kind == Kind.INCONCLUSIVE:
        return "undecided at their last look"
    return ""


def counts(outcomes: Iterable[Outcome]) -> Counter[Kind]:
    """How many benchmarks ended as each kind (each benchmark once)."""
    return Counter(kind_of(o) for o in outcomes)


def failing(outcomes: Iterable[Outcome], fail_on: Sequence[str]) -> Counter[Kind]:
    """How many benchmarks ended in each kind listed in fail_on."""
    return Counter(k for k in map(kind_of, outcomes) if k in fail_on)


#: --llmperf-fail-on's word for a session that selected benchmarks and judged none of them.
UNJUDGED = "unjudged"


def run_failures(outcomes: Sequence[Outcome], fail_on: Sequence[str], *, gating: bool, selected: int) -> list[str]:
    """Why the run fails, as --llmperf-fail-on says (`2 regressed`, `nothing judged`); empty: it does not. A gating
    session that selected benchmarks and judged none of them fails with `unjudged`: compared nothing is no pass."""
    found = [f"{n} {k}" for k, n in failing(outcomes, fail_on).items()]
    if UNJUDGED in fail_on and gating and selected and not any(kind_of(o) in JUDGED for o in outcomes):
        found.append("nothing judged")
    return found
