"""Why the sides' environments could not be made, said so that a person can act: the packages that differ and the
ways out. The controller turns these into a usage error (a failed job), never into a green one."""

from __future__ import annotations

from collections.abc import Sequence

from .records import PackageChange

WAYS_OUT = (
    "--llmperf-base-python=PATH: run the base side with an interpreter you prepared with its dependencies (conda, a "
    "container); its installed set is checked against the base side's declared dependencies, and the head side runs "
    "in this environment",
    "--llmperf-compare-deps=code-only: compare the code alone in this environment; the report says which dependency "
    "changes were not measured",
)


class EnvironmentsError(Exception):
    """A side's environment could not be made or checked; the message says why and what to do."""


class CannotBuild(EnvironmentsError):
    """The dependencies differ and the sides' environments cannot be built (no uv, no index reachable, a format that
    is not read, a build that failed): the message names the packages that differ and the ways out."""

    def __init__(
        self,
        reason: str,
        *,
        changes: Sequence[PackageChange] = (),
        other: Sequence[str] = (),
        fix: str | None = None,
    ) -> None:
        self.reason = reason
        self.changes = tuple(changes)
        self.other = tuple(other)
        self.fix = fix
        super().__init__(self.message())

    def message(self) -> str:
        lines = [f"the two sides' dependencies differ and their environments cannot be built: {self.reason}"]
        if self.changes:
            lines.append("  packages that differ: " + "; ".join(map(str, self.changes)))
        lines += [f"  also differs: {other}" for other in self.other]
        lines.append("Ways out:")
        if self.fix:
            lines.append(f"  - {self.fix}")
        lines += [f"  - {way}" for way in WAYS_OUT]
        return "\n".join(lines)

    def with_differences(self, changes: Sequence[PackageChange], other: Sequence[str]) -> CannotBuild:
        """The same error, naming the differences the caller knows (a build step knows only its side)."""
        return type(self)(self.reason, changes=changes, other=other, fix=self.fix)


class BuildFailed(CannotBuild):
    """uv ran and failed (a package not found offline, an index not reachable, a conflict); the reason ends with
    what uv said."""
