"""Why the sides' environments could not be made: the side, what differs, and the ways out that apply to it. The
controller turns these into a usage error (a failed job), never into a green one."""

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
