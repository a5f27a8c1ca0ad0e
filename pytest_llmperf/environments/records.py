"""The records of each side's environment that the rest of the plugin reads: how it was made, the packages that
differ between the sides, and the header's summary.

Plain data, standard library only: the worker protocol, the JSON report and the header import these without loading
a parser or a resolver.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: --llmperf-compare-deps: build each side's environment only when its dependencies differ (auto), always (build: the
#: A/A check of the machinery), or never, saying that dependency changes are not measured (code-only).
COMPARE_DEPS_MODES = ("auto", "build", "code-only")

#: How a side's environment was made.
SHARED = "shared"  # both sides run the controller's environment: their dependencies are the same
BUILT = "built"  # built by uv for this job
CACHE_HIT = "cache hit"  # built by an earlier job, reused from the cache
BASE_PYTHON = "base-python"  # the interpreter the user prepared (--llmperf-base-python)
CURRENT = "current"  # the controller's environment, on one side only (the head beside a base-python)
CODE_ONLY = "code-only"  # the controller's environment although the dependencies differ: changes not measured

# What detection (detection.py) found: the status of an Environments record.
UNCHANGED = "unchanged"
NONE_FOUND = "none-found"  # neither side has a dependency input: a dependency change cannot be seen
SAME_IN_FORM = "same-in-form"
CHANGED = "changed"
UNREADABLE = "unreadable"


@dataclass(frozen=True)
class PackageChange:
    """A package whose declared or locked version differs between the sides (None: the side does not have it)."""

    name: str
    base: str | None
    head: str | None
    source: str = ""  # the files it was read from, e.g. "uv.lock" or "requirements.txt"

    def __str__(self) -> str:
        if self.base is None:
            return f"+{self.name} {self.head}"
        if self.head is None:
            return f"-{self.name} {self.base}"
        return f"{self.name} {self.base} -> {self.head}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "base": self.base, "head": self.head, "source": self.source}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PackageChange:
        return cls(str(data["name"]), data.get("base"), data.get("head"), str(data.get("source") or ""))


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
    build_seconds: float | None = None  # what making it cost this job (a cache hit: the check that reused it)
    installed: Mapping[str, str] = field(default_factory=dict, hash=False)  # canonical distribution name -> version
    findings: tuple[str, ...] = ()  # what does not match the side's declared dependencies (base-python)

    def version(self, name: str) -> str | None:
        return self.installed.get(canonical_name(name))

    def made(self) -> str:
        """How it was made, in a few words: 'built 3.1 s', 'cache hit 0.2 s', 'shared'."""
        if self.how in (BUILT, CACHE_HIT) and self.build_seconds is not None:
            return f"{self.how} {self.build_seconds:.1f} s"
        return self.how

    def to_json(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "how": self.how,
            "python": self.python,
            "python_version": self.python_version,
            "key": self.key,
            "directory": self.directory,
            "recipe": self.recipe,
            "build_seconds": self.build_seconds,
            "installed": dict(sorted(self.installed.items())),
            "findings": list(self.findings),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SideEnvironment:
        seconds = data.get("build_seconds")
        return cls(
            side=str(data["side"]),
            how=str(data["how"]),
            python=str(data["python"]),
            python_version=str(data.get("python_version") or ""),
            key=data.get("key"),
            directory=data.get("directory"),
            recipe=data.get("recipe"),
            build_seconds=None if seconds is None else float(seconds),
            installed={str(k): str(v) for k, v in (data.get("installed") or {}).items()},
            findings=tuple(data.get("findings") or ()),
        )


@dataclass(frozen=True)
class Environments:
    """Both sides' environments for one A/B job, and what differs between their dependencies."""

    mode: str  # one of COMPARE_DEPS_MODES
    status: str  # the detection's: UNCHANGED, NONE_FOUND, SAME_IN_FORM, CHANGED or UNREADABLE
    base: SideEnvironment
    head: SideEnvironment
    files: tuple[str, ...] = ()  # dependency files whose bytes differ
    changes: tuple[PackageChange, ...] = ()
    other: tuple[str, ...] = ()  # differences that name no package (an index, a find-links, a Python version)
    notes: tuple[str, ...] = ()
    not_measured: tuple[str, ...] = ()  # differences this comparison does not measure, each with why
    detect_seconds: float = 0.0

    @property
    def per_side(self) -> bool:
        """Each side runs an interpreter of its own."""
        return self.base.python != self.head.python

    @property
    def measured(self) -> bool:
        """Every dependency difference is measured (none is left out)."""
        return not self.not_measured

    def summary_line(self) -> str:
        """One line for the header, the summary line and a JUnit property."""
        differ = "; ".join(map(str, self.changes)) or "; ".join(self.other)
        if not self.measured:
            return f"environments: DEPENDENCY CHANGES NOT MEASURED: {'; '.join(self.not_measured)} [{self.mode}]"
        if not self.per_side:
            if self.status == UNCHANGED:
                why = "dependency files unchanged"
            elif self.status == NONE_FOUND:
                why = "no dependency files found: see the note"
            elif self.status == SAME_IN_FORM and self.notes:
                why = f"{', '.join(self.files)} changed, not what the environment is built from: see the notes"
            elif self.status == SAME_IN_FORM:
                why = f"{', '.join(self.files)} changed in form only"
            else:
                why = differ or "dependencies differ"
            return f"environments: shared ({why}) [{self.mode}]"
        made = f"base {self.base.made()}, head {self.head.made()}"
        return f"environments: per side ({differ or 'built on request'}; {made}) [{self.mode}]"

    def summary_lines(self, base_label: str = "base", head_label: str = "head") -> list[str]:
        """The header's block: the summary line, then each side and the packages that differ."""
        lines = [self.summary_line()]
        width = max(len(base_label), len(head_label)) + 1
        for label, side in ((base_label, self.base), (head_label, self.head)):
            where = f"env {side.key[:12]} from {side.recipe}" if side.key else side.python
            text = f"  {label + ':':<{width}} {where}, {side.python_version or 'python'}, {side.made()}"
            lines.append(text + "".join(f"; {finding}" for finding in side.findings))
        if self.changes:
            lines.append(f"  packages that differ ({len(self.changes)}): " + "; ".join(map(str, self.changes)))
        lines += [f"  also differs: {other}" for other in self.other]
        lines += [f"  not measured: {item}" for item in self.not_measured]
        lines += [f"  note: {note}" for note in self.notes]
        return lines

    def shown_lines(self, base_label: str, head_label: str) -> list[str]:
        """What the header and the summary show: the whole block where the sides differ, something is not
        measured or there is a note; else its first line."""
        lines = self.summary_lines(base_label, head_label)
        return lines if self.per_side or not self.measured or self.notes else lines[:1]

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "status": self.status,
            "summary": self.summary_line(),
            "measured": self.measured,
            "base": self.base.to_json(),
            "head": self.head.to_json(),
            "files": list(self.files),
            "changes": [change.to_json() for change in self.changes],
            "other": list(self.other),
            "notes": list(self.notes),
            "not_measured": list(self.not_measured),
            "detect_seconds": self.detect_seconds,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Environments:
        return cls(
            mode=str(data["mode"]),
            status=str(data["status"]),
            base=SideEnvironment.from_json(data["base"]),
            head=SideEnvironment.from_json(data["head"]),
            files=tuple(data.get("files") or ()),
            changes=tuple(PackageChange.from_json(c) for c in data.get("changes") or ()),
            other=tuple(data.get("other") or ()),
            notes=tuple(data.get("notes") or ()),
            not_measured=tuple(data.get("not_measured") or ()),
            detect_seconds=float(data.get("detect_seconds") or 0.0),
        )


def canonical_name(name: str) -> str:
    """A distribution's name as PEP 503 compares it (packaging.utils.canonicalize_name, without importing it)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def unmeasured(changes: Sequence[PackageChange], base: SideEnvironment, head: SideEnvironment) -> tuple[str, ...]:
    """The changes that the two environments do not show: both have the same installed version (or neither has
    the package), so measuring them cannot see the change."""
    found = []
    for change in changes:
        base_version, head_version = base.version(change.name), head.version(change.name)
        if base_version == head_version:
            ran = f"both sides ran {base_version}" if base_version else "neither side has it installed"
            found.append(f"{change} ({ran})")
    return tuple(found)


@dataclass(frozen=True)
class BuildSettings:
    """How both sides are built (the same for both)."""

    compile_bytecode: bool = True  # compile at install (uv's --compile-bytecode), so workers import alike and fast
    offline: bool = False  # uv --offline: only uv's cache and find-links
    extras: tuple[str, ...] = ()  # the project's extras to install (--llmperf-env-extras)
    groups: tuple[str, ...] = ()  # dependency groups beyond uv's defaults (--llmperf-env-groups)
    timeout_s: float = 3600.0  # the most one uv command may take

    def flags(self) -> list[str]:
        flags = ["--compile-bytecode"] if self.compile_bytecode else []
        return flags + (["--offline"] if self.offline else [])

    def selection(self) -> list[str]:
        return [item for e in self.extras for item in ("--extra", e)] + [
            item for g in self.groups for item in ("--group", g)
        ]
