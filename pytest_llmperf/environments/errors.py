"""Why the sides' environments could not be made, said so that a person can act: the side, what differs, and the ways
out that apply to it. The controller turns these into a usage error (a failed job), never into a green one."""

from __future__ import annotations

from collections.abc import Sequence

BASE_PYTHON_WAY = (
    "--llmperf-base-python=PATH: run the base side with an interpreter you prepared with its dependencies (conda, a "
    "container); it is checked against the base side's dependency files, and the head side runs in this environment"
)
CODE_ONLY_WAY = (
    "--llmperf-compare-deps=code-only: compare the code alone in this environment; the report says which dependency "
    "changes were not measured"
)
HEAD_WAY = "make the working tree's dependency files build here (they are the pull request's)"


class EnvironmentsError(Exception):
    """A side's environment could not be made or checked; the message says why and what to do."""


class CannotBuild(EnvironmentsError):
    """The dependencies differ and the sides' environments cannot be made, or made so that the difference is
    measured: the message names the side, what differs and the ways out."""

    def __init__(
        self,
        reason: str,
        *,
        side: str | None = None,
        files: Sequence[str] = (),
        fix: str | None = None,
        ways: Sequence[str] = (),
    ) -> None:
        self.reason, self.side, self.files, self.fix, self.given = reason, side, tuple(files), fix, tuple(ways)
        super().__init__(self.message())

    def ways(self) -> list[str]:
        """The ways out that apply: a base-side interpreter only where the base side is what failed."""
        if self.given:
            return list(self.given)
        ways = [self.fix] if self.fix else []
        ways += [HEAD_WAY] if self.side == "head" else [BASE_PYTHON_WAY]
        return [*ways, CODE_ONLY_WAY]

    def message(self) -> str:
        which = f"the {self.side} side's environment" if self.side else "the sides' environments"
        lines = [f"the two sides' dependencies differ and {which} cannot be made: {self.reason}"]
        if self.files:
            lines.append(f"  dependency inputs that differ: {', '.join(self.files)}")
        return "\n".join([*lines, "Ways out:", *(f"  - {way}" for way in self.ways())])

    def naming(self, files: Sequence[str]) -> CannotBuild:
        """The same error, naming the inputs that differ (a build step knows only its side)."""
        return type(self)(self.reason, side=self.side, files=files, fix=self.fix, ways=self.given)


class BuildFailed(CannotBuild):
    """uv ran and failed (a package not found offline, an index not reachable, a conflict); the reason ends with
    the command as it ran and what uv said."""
