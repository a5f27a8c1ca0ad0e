"""Each side's environment as the rest of the plugin reads it, and why one could not be made (the side, what differs,
and the ways out that apply to it: the controller turns these into a usage error, a failed job, never a green one).
Standard library only: the worker protocol, the JSON report and the header import it."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: --llmperf-compare-deps: build each side's environment only when its dependency inputs differ (auto), always (build:
#: the A/A check of the machinery), or never, saying that dependency changes are not measured (code-only).
COMPARE_DEPS_MODES = ("auto", "build", "code-only")

#: How a side's environment was made.
SHARED = "shared"  # both sides run the controller's environment: their dependencies are the same
BUILT = "built"  # built by uv for this job
CACHE_HIT = "cache hit"  # built by an earlier job, reused from the cache
BASE_PYTHON = "base-python"  # the interpreter the user prepared (--llmperf-base-python)
CURRENT = "current"  # the controller's environment, on one side only (the head beside a base-python)
CODE_ONLY = "code-only"  # the controller's environment although the dependencies differ: changes not measured

#: The sides' dependency inputs, by their bytes (Environments.status).
UNCHANGED = "unchanged"
NONE_FOUND = "none-found"  # neither side has a dependency input: a dependency change cannot be seen
CHANGED = "changed"


def canonical_name(name: str) -> str:
    """A distribution's name as PEP 503 compares it (packaging's canonicalize_name, without importing packaging)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class PackageChange:
    """A package whose installed version differs between the sides (None: the side does not have it)."""

    name: str
    base: str | None
    head: str | None

    def __str__(self) -> str:
        if self.base is None:
            return f"+{self.name} {self.head}"
        if self.head is None:
            return f"-{self.name} {self.base}"
        return f"{self.name} {self.base} -> {self.head}"


def held_changes(
    base: Mapping[str, str],
    head: Mapping[str, str],
    base_contents: Mapping[str, str] | None = None,
    head_contents: Mapping[str, str] | None = None,
) -> tuple[PackageChange, ...]:
    """What two installed sets (name -> version) hold differently; with the digests of their files (name -> digest),
    a version whose files differ too (a wheel rebuilt under its version)."""
    found = []
    for name in sorted(base.keys() | head.keys()):
        before, after = base.get(name), head.get(name)
        if before != after:
            found.append(PackageChange(name, before, after))
        elif (base_contents or {}).get(name) != (head_contents or {}).get(name):
            found.append(PackageChange(name, before, f"{after} (other files)"))
    return tuple(found)


@dataclass(frozen=True)
class SideEnvironment:
    """One side's environment: the interpreter its workers run, and what is installed there."""

    side: str  # "base" (the compared ref) or "head" (the working tree)
    how: str  # SHARED, BUILT, CACHE_HIT, BASE_PYTHON, CURRENT or CODE_ONLY
    python: str  # the interpreter its workers start with
    python_version: str = ""  # e.g. "CPython 3.11.7"
    key: str | None = None  # the cache key of a built environment
    directory: str | None = None  # where a built environment lies
    recipe: str | None = None  # what it was built from, e.g. "uv.lock" or "requirements.txt -c constraints.txt"
    build_seconds: float | None = None  # what making it cost this job (a cache hit: the checks that reused it)
    installed: Mapping[str, str] = field(default_factory=dict, hash=False)  # canonical distribution name -> version
    findings: tuple[str, ...] = ()  # what the header says of it: why it was rebuilt, what it does not hold
    contents: Mapping[str, str] = field(default_factory=dict, hash=False)  # canonical name -> digest of its files

    def version(self, name: str) -> str | None:
        return self.installed.get(canonical_name(name))

    @property
    def pycache(self) -> str | None:
        """Where the workers of a built environment write bytecode (it is not compiled at install)."""
        return str(Path(self.directory) / "pycache") if self.directory and self.how in (BUILT, CACHE_HIT) else None

    def made(self) -> str:
        """'built 3.1 s', 'cache hit 0.2 s', 'shared'."""
        if self.how in (BUILT, CACHE_HIT) and self.build_seconds is not None:
            return f"{self.how} {self.build_seconds:.1f} s"
        return self.how


@dataclass(frozen=True)
class Environments:
    """Both sides' environments for one A/B job, and what differs between what they hold."""

    mode: str  # one of COMPARE_DEPS_MODES
    status: str  # UNCHANGED, NONE_FOUND or CHANGED
    base: SideEnvironment
    head: SideEnvironment
    files: tuple[str, ...] = ()  # dependency inputs (and the local paths they name) whose bytes differ
    changes: tuple[PackageChange, ...] = ()  # what the two environments hold differently
    other: tuple[str, ...] = ()  # differences that name no package
    notes: tuple[str, ...] = ()
    not_measured: tuple[str, ...] = ()  # differences this comparison does not measure, each with why
    detect_seconds: float = 0.0

    @property
    def per_side(self) -> bool:
        return self.base.python != self.head.python

    @property
    def measured(self) -> bool:
        return not self.not_measured

    def summary_line(self) -> str:
        """One line for the header, the summary line and a JUnit property."""
        if not self.measured:
            return f"environments: DEPENDENCY CHANGES NOT MEASURED: {'; '.join(self.not_measured)} [{self.mode}]"
        if not self.per_side:
            if self.status == UNCHANGED:
                why = "dependency files unchanged"
            elif self.status == NONE_FOUND:
                why = "no dependency files found: see the note"
            else:
                why = f"{', '.join(self.files)} differ; both sides' environments hold the same packages"
            return f"environments: shared ({why}) [{self.mode}]"
        differ = "; ".join(map(str, self.changes)) or "; ".join(self.other) or "built on request"
        return f"environments: per side ({differ}; base {self.base.made()}, head {self.head.made()}) [{self.mode}]"

    def summary_lines(
        self, base_label: str = "base", head_label: str = "head", imported: Collection[str] | None = None
    ) -> list[str]:
        """The header's block; `imported`: the distributions the workers imported, once they ran."""
        lines = [self.summary_line()]
        width = max(len(base_label), len(head_label)) + 1
        for label, side in ((base_label, self.base), (head_label, self.head)):
            where = f"env {side.key[:12]} from {side.recipe}" if side.key else side.python
            text = f"  {label + ':':<{width}} {where}, {side.python_version or 'python'}, {side.made()}"
            lines.append(text + "".join(f"; {finding}" for finding in side.findings))
        if self.changes:
            lines.append(f"  packages that differ ({len(self.changes)}): " + "; ".join(map(str, self.changes)))
        if imported is not None:
            lines += [f"  {c}: imported by no benchmark" for c in self.changes if c.name not in imported]
        lines += [f"  also differs: {other}" for other in self.other]
        lines += [f"  not measured: {item}" for item in self.not_measured]
        return lines + [f"  note: {note}" for note in self.notes]

    def shown_lines(self, base_label: str, head_label: str, imported: Collection[str] | None = None) -> list[str]:
        """The whole block where the sides differ, something is not measured or there is a note; else its first line."""
        lines = self.summary_lines(base_label, head_label, imported)
        return lines if self.per_side or not self.measured or self.notes else lines[:1]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "summary": self.summary_line(), "measured": self.measured}


@dataclass(frozen=True)
class BuildSettings:
    """How both sides are built (the same for both)."""

    # Off, as uv's default: compiling a torch + transformers environment took 30 s a side here, where the workers'
    # own imports write what they use into the environment once (SideEnvironment.pycache; docs/environments.md).
    compile_bytecode: bool = False
    offline: bool = False  # uv --offline: only uv's cache and find-links
    extras: tuple[str, ...] = ()  # the project's extras to install (llmperf_env_extras)
    groups: tuple[str, ...] = ()  # dependency groups beyond uv's defaults (llmperf_env_groups)
    timeout_s: float = 3600.0  # the most one uv command may take

    def flags(self) -> list[str]:
        flags = ["--compile-bytecode"] if self.compile_bytecode else []
        return flags + (["--offline"] if self.offline else [])

    def selection(self) -> list[str]:
        return [*(a for e in self.extras for a in ("--extra", e)), *(a for g in self.groups for a in ("--group", g))]


# Why an environment could not be made, and the ways out.
BASE_PYTHON_WAY = (
    "--llmperf-base-python=PATH: run the base side with an interpreter you prepared with its dependencies (conda, a "
    "container); it is checked against the base side's dependency files, and the head side runs in this environment"
)
CODE_ONLY_WAY = (
    "--llmperf-compare-deps=code-only: compare the code alone in this environment; the report says which dependency "
    "changes were not measured"
)
HEAD_WAY = "make the working tree's dependency files build here (they are the pull request's)"
WRITABLE_WAY = "give a writable directory: -o llmperf_env_dir=PATH, or the ini key llmperf_env_dir"


class EnvironmentsError(Exception):
    """A side's environment could not be made or checked; the message says why and what to do."""


class CannotBuild(EnvironmentsError):
    """The dependencies differ and the sides' environments cannot be made so that the difference is measured."""

    def __init__(
        self,
        reason: str,
        *,
        side: str | None = None,
        files: Sequence[str] = (),
        fix: str | None = None,
        ways: Sequence[str] = (),
    ) -> None:
        super().__init__(reason)
        self.reason, self.side, self.files, self.fix, self.given = reason, side, tuple(files), fix, tuple(ways)

    def ways(self) -> list[str]:
        """The ways out that apply: a base-side interpreter only where the base side is what failed."""
        if self.given:
            return list(self.given)
        ways = [self.fix] if self.fix else []
        return [*ways, HEAD_WAY if self.side == "head" else BASE_PYTHON_WAY, CODE_ONLY_WAY]

    def __str__(self) -> str:  # read when shown: the plan names the inputs that differ after a side's build failed
        which = f"the {self.side} side's environment" if self.side else "the sides' environments"
        lines = [f"the two sides' dependencies differ and {which} cannot be made: {self.reason}"]
        if self.files:
            lines.append(f"  dependency inputs that differ: {', '.join(self.files)}")
        return "\n".join([*lines, "Ways out:", *(f"  - {way}" for way in self.ways())])


class BuildFailed(CannotBuild):
    """uv ran and failed; the reason ends with the command as it ran and what uv said."""
