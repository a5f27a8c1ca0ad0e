"""Does an interpreter's installed set match a side's declared dependencies? For --llmperf-base-python (an
interpreter the user prepared): what it lacks, or has at another version, said per package.

A lock decides the version where it names a package: the installed one must be the locked one (a package the lock
names but that is not installed may belong to another platform or an unselected group: not a finding by itself).
The main requirements (requirements files, [project] dependencies) must be installed, where their markers apply, and
satisfied where no lock names them; constraints only where installed; optional extras and groups are not required.
"""

from __future__ import annotations

from collections.abc import Mapping

from packaging.markers import InvalidMarker, Marker
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .differences import SideDeclared
from .inputs import LOCKS


def _same_version(have: str, locked: str) -> bool:
    try:
        return Version(have) == Version(locked)
    except InvalidVersion:
        return have == locked


def _applies(marker: str, environment: Mapping[str, str]) -> bool:
    try:
        return not marker or Marker(marker).evaluate({**environment, "extra": ""})
    except InvalidMarker:
        return True


def _satisfies(have: str, spec: str) -> bool | None:
    """Whether version `have` meets `spec`; None where the spec is no PEP 440 specifier (poetry's ^1.2, a URL)."""
    try:
        return SpecifierSet(spec).contains(have, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return None


def unsatisfied(declared: SideDeclared, installed: Mapping[str, str], markers: Mapping[str, str]) -> tuple[str, ...]:
    """What in `installed` (canonical name -> version) does not match `declared`, one line per package."""
    problems: dict[str, str] = {}
    locked = declared.entries(LOCKS)
    for name, found in sorted(locked.items()):
        versions = sorted({entry.spec[2:] for _, entry in found})
        have = installed.get(name)
        if have is not None and not any(_same_version(have, v) for v in versions):
            paths = ", ".join(sorted({path for path, _ in found}))
            problems[name] = f"{name} {have} is installed; {paths} locks {' | '.join(versions)}"
    for kinds in (("requirements", "constraints"), ("pyproject",)):
        for name, found in sorted(declared.entries(kinds).items()):
            for path, entry in found:
                if name in problems or entry.group not in ("", "constraint") or not _applies(entry.marker, markers):
                    continue
                have = installed.get(name)
                if have is None and entry.group != "constraint":
                    problems[name] = f"{name} is not installed; {path} requires {entry.shown()}"
                elif have is not None and name not in locked and _satisfies(have, entry.spec) is False:
                    problems[name] = f"{name} {have} is installed; {path} requires {entry.shown()}"
    unread = [f"not checked: {why}" for path, why in declared.unreadable.items() if declared.kinds[path] != "other"]
    return (*problems.values(), *unread)
