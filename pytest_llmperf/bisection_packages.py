"""Bisection over packages: which of the packages whose versions differ between GOOD's and BAD's environments make
the benchmarks slower (`pytest-llmperf bisect GOOD BAD --packages`; bisection_packages_run.py runs it).

The code stays GOOD's: a step is the A/B job of a worktree of GOOD whose requirements pin GOOD's packages with a
subset of the changed ones at BAD's versions (`step_requirements`), against GOOD; the environments code builds it
with uv and the gate judges, as in every A/B job. This module chooses the subsets (`Delta`) and records the result.

`Delta` is Zeller's ddmin (Zeller and Hildebrandt, "Simplifying and isolating failure-inducing input", 2002):
halves first, then finer splits and their complements, so that two packages that are slow only together are both
named; a subset that uv cannot build, or whose step cannot decide, is neither good nor bad (ddmin's unresolved) and
the search goes on by other splits. Two shortcuts, since a step is a whole A/B job:

- A half measured good inside a set taken as slower leaves the other half taken as slower, unmeasured: a single
  slow package among 12 is named in at most 5 steps (4 splits and the step of the package itself) where plain ddmin
  takes up to 8. The set named is always one measured slower; where the inference was wrong (two packages slow only
  together, one in each half), its sets are measured from the outermost in, and ddmin splits the last one measured
  slower more finely.
- A subset of a set measured good is taken as good, unmeasured (monotony): a slowdown that a speed-up in the same
  set hides is not looked for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .bisection import BAD, GOOD, Step, step_table
from .environments.inputs import DependencyInputs
from .environments.records import PackageChange, canonical_name
from .report.tables import markdown_text, table

UNRESOLVED = "unresolved"  # uv could not build the subset's environment: no job ran
#: Why a subset is measured (a step's role): a part of the set under reduction, its complement, a set taken as
#: slower by inference and measured only where that is in doubt, and the whole (GOOD's code, BAD's versions).
PART, COMPLEMENT, CHECK, WHOLE = "part", "complement", "check", "whole"
#: The file that holds the unchanged packages at GOOD's versions, beside GOOD's first requirements file.
CONSTRAINTS = "llmperf-bisect-constraints.txt"

Subset = tuple[str, ...]
Test = Callable[[Subset, str], str]


def split(items: Subset, parts: int) -> list[Subset]:
    """`items` in `parts` consecutive pieces whose sizes differ by at most one (the smaller first)."""
    pieces, start = [], 0
    for left in range(parts, 0, -1):
        stop = start + (len(items) - start) // left
        pieces.append(items[start:stop])
        start = stop
    return pieces


@dataclass
class Delta:
    """ddmin over `items` (the changed packages), taken as slower all together (BAD's versions, GOOD's code)."""

    items: Subset
    outcomes: dict[frozenset[str], str] = field(default_factory=dict)  # each subset measured: its step's outcome
    current: Subset = ()  # the set under reduction, for the progress lines

    def known(self, subset: Subset) -> str | None:
        """The outcome of `subset`: measured, or good as a subset of a set measured good; None: not known."""
        key = frozenset(subset)
        if key in self.outcomes:
            return self.outcomes[key]
        return GOOD if any(o == GOOD and key <= s for s, o in self.outcomes.items()) else None

    def run(self, test: Test) -> Subset | None:
        """The smallest subset found slower, always one measured so; None where the whole is measured not slower.
        `test(subset, role)` runs its step: BAD, GOOD, or anything else for a step that could not decide."""

        def outcome(subset: Subset, role: str) -> str:
            found = self.known(subset)
            if found is None:
                found = self.outcomes[frozenset(subset)] = test(subset, role)
            return found

        c, n = self.items, 2
        base: Subset | None = None  # the innermost set measured slower: where a broken inference goes back to
        chain = [c]  # the sets taken as slower without a step, outermost first; the last is c
        while True:
            self.current = c
            found = self._reduce(c, n, outcome) if len(c) > 1 else None
            if found is not None:
                c, n, inferred = found
                if inferred:
                    chain.append(c)
                else:
                    base, chain = c, []
                continue
            if chain:  # c is to be refined or named, and was never measured: measure it first
                if outcome(c, WHOLE if c == self.items else CHECK) == BAD:
                    base, chain = c, []
                else:  # the first set of the chain that is not slower: the inference that put it there was wrong
                    roles = [WHOLE if i == 0 and base is None else CHECK for i in range(len(chain))]
                    at = next(i for i, s in enumerate(chain) if outcome(s, roles[i]) != BAD)
                    if at:
                        c = chain[at - 1]  # measured slower just now
                    elif base is None:
                        return None  # the whole is not slower
                    else:
                        c = base
                    base, chain, n = c, [], 2
                    continue
            if n >= len(c):
                return c
            n = min(2 * n, len(c))

    def _reduce(self, c: Subset, n: int, outcome: Callable[[Subset, str], str]) -> tuple[Subset, int, bool] | None:
        """ddmin's next set: (the set, its granularity, whether it is taken as slower without a step), or None."""
        parts = split(c, n)
        for i, part in enumerate(parts):
            if n == 2 and i == 1 and self.known(parts[0]) == GOOD and self.known(part) is None:
                return part, 2, True  # c is slower, its first half is not: the second half is taken to be
            if outcome(part, PART) == BAD:
                return part, 2, False
        if n > 2:
            for part in parts:
                rest = tuple(x for x in c if x not in part)
                if outcome(rest, COMPLEMENT) == BAD:
                    return rest, max(n - 1, 2), False
        return None


def subset_changes(changes: Sequence[PackageChange], subset: Iterable[str]) -> tuple[PackageChange, ...]:
    chosen = set(subset)
    return tuple(c for c in changes if c.name in chosen)


# -- the step's requirements ------------------------------------------------------------------------------------------

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:[<>=!~;@ ]|$)")
_LOCAL_OPTIONS = ("-f", "--find-links")
_INDEX_OPTIONS = ("-i", "--index-url", "--extra-index-url")


def _logical_lines(text: str) -> list[str]:
    """A requirements file's lines, a line continued with a backslash joined to the next (hashes)."""
    lines, pending = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines + ([pending] if pending else [])


def requirement_name(line: str) -> str | None:
    """The canonical name a requirements line asks for ('fastlib>=1 ; python_version>"3"' -> 'fastlib'), else None
    (an option, a comment, a path or URL)."""
    text = line.split(" #", 1)[0].strip()
    if not text or text.startswith(("#", "-", ".", "/", "~")) or "://" in text.split("@", 1)[0]:
        return None
    match = _NAME.match(text)
    return canonical_name(match[1]) if match else None


def _option(line: str) -> tuple[str, str] | None:
    """(option, value) of an index or find-links line ('--find-links wheels', '-f=wheels'), else None."""
    words = re.split(r"[\s=]+", line.split(" #", 1)[0].strip(), maxsplit=1)
    if len(words) == 2 and words[0] in (*_LOCAL_OPTIONS, *_INDEX_OPTIONS):
        return words[0], words[1].strip()
    return None


def _sources_of(bad: DependencyInputs, already: set[str]) -> list[str]:
    """BAD's indexes and find-links as lines for GOOD's worktree: a local path made absolute into BAD's checkout
    (its wheels may be BAD's only), BAD's index an extra one (GOOD's stays first), but those GOOD has as written."""
    lines: list[str] = []
    for file in bad.files:
        if file.data is None or file.kind not in ("requirements", "constraints"):
            continue
        folder = (bad.root / file.path).parent
        for line in _logical_lines(file.data.decode("utf-8-sig", errors="replace")):
            found = _option(line)
            if found is None:
                continue
            option, value = found
            local = option in _LOCAL_OPTIONS and "://" not in value
            if local:
                value = str((folder / value.removeprefix("file:")).resolve())
            elif line.strip() in already:
                continue
            text = f"{'--find-links' if option in _LOCAL_OPTIONS else '--extra-index-url'} {value}"
            if text not in lines:
                lines.append(text)
    return lines


def step_requirements(
    good: DependencyInputs,
    bad: DependencyInputs,
    requirements: Sequence[str],
    good_set: Mapping[str, str],
    changes: Sequence[PackageChange],
    subset: Iterable[str],
    note: str,
) -> dict[str, str]:
    """The files to write into a worktree of GOOD (path relative to its inputs' root -> text) so that its
    environment is GOOD's with `subset` of `changes` at BAD's versions: every requirements and constraints line of
    a changed package dropped; in GOOD's first requirements file (of `requirements`, its recipe's), BAD's indexes and
    find-links, a pin of each changed package (BAD's version in `subset`, else GOOD's; none where that side has
    none), and a constraints file that holds every other package of GOOD's set at its version."""
    changed, chosen = {c.name for c in changes}, set(subset)
    first = next(p for p in requirements if p.endswith((".txt", ".in")))
    written: dict[str, str] = {}
    already: set[str] = set()
    for file in good.files:
        if file.data is None or file.kind not in ("requirements", "constraints"):
            continue
        lines = _logical_lines(file.data.decode("utf-8-sig", errors="replace"))
        already |= {line.strip() for line in lines}
        kept = [line for line in lines if requirement_name(line) not in changed]
        if len(kept) < len(lines) or file.path == first:
            written[file.path] = "\n".join(kept) + "\n"
    pins = []
    for change in changes:
        version = change.head if change.name in chosen else change.base
        if version is not None:
            pins.append(f"{change.name}=={version}")
    folder = PurePosixPath(first).parent
    written[first] += "\n".join([
        f"# {note}", *_sources_of(bad, already), f"-c {CONSTRAINTS}", *pins, ""
    ])  # fmt: skip
    unchanged = sorted((name, v) for name, v in good_set.items() if name not in changed)
    written[str(folder / CONSTRAINTS)] = "".join(f"{name}=={version}\n" for name, version in unchanged)
    return written


def write_files(root: Path, files: Mapping[str, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


# -- the result -------------------------------------------------------------------------------------------------------


@dataclass
class PackageBisection:
    """What a bisection over packages found, as the report shows it."""

    good: str
    bad: str
    changes: list[PackageChange]  # every package whose version differs
    command: str  # what each step runs, in a worktree of GOOD with its requirements rewritten
    steps: list[Step] = field(default_factory=list)
    culprits: list[PackageChange] = field(default_factory=list)  # the smallest set found slower
    found_by: int | None = None  # the step that measured it
    status: str = "running"  # found | not-in-packages | undecided | interrupted | running
    builds: int = 0  # environments built by uv (the others came from the cache)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def verdict(self) -> str:
        step = self.steps[self.found_by - 1] if self.found_by else None
        measured = f" (step {step.number}: {step.row.text()})" if step and step.row else ""
        whole = next((s for s in self.steps if s.role == WHOLE), None)
        said = f" (step {whole.number}: {whole.why})" if whole else ""
        together = " together" if len(self.culprits) > 1 else ""
        return {
            "found": f"the package(s) that make it slower{together}: {'; '.join(map(str, self.culprits))}{measured}",
            "not-in-packages": f"GOOD's code with all of BAD's package versions is not slower{said}: the slowdown "
            "is not in the packages alone; bisect the commits (without --packages)",
            "undecided": f"GOOD's code with all of BAD's package versions could not be decided{said}",
            "interrupted": f"interrupted after {len(self.steps)} step(s)",
            "running": f"{len(self.steps)} step(s) so far",
        }[self.status]

    def exit_code(self) -> int:
        return 0 if self.status == "found" else 130 if self.status == "interrupted" else 1

    def jobs(self) -> int:
        return sum(1 for s in self.steps if s.outcome != UNRESOLVED)

    def cost(self) -> str:
        return (f"{len(self.steps)} step(s): {self.jobs()} A/B job(s), {self.builds} environment(s) built by uv, in "
                f"{self.seconds:.0f} s")  # fmt: skip

    def document(self) -> dict[str, Any]:
        return {**asdict(self), "result": self.verdict(), "jobs": self.jobs()}

    def markdown(self) -> str:
        rows = [(c.name, c.base or "-", c.head or "-") for c in self.changes]
        notes = [*(f"- {markdown_text(note)}" for note in self.notes), ""] if self.notes else []
        lines = [
            f"# Bisection of the packages {self.good[:12]}..{self.bad[:12]}",
            "",
            markdown_text(f"{len(self.changes)} packages differ; each step: {self.command}, in a worktree of GOOD"),
            "",
            f"**{markdown_text(self.verdict())}**",
            "",
            table(("package", "GOOD", "BAD"), rows, markdown=True),
            "",
            step_table(self.steps, markdown=True, subject="packages at BAD's versions"),
            "",
            *notes,
            markdown_text(self.cost()),
            "",
        ]
        return "\n".join(lines)
