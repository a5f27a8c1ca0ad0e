"""Detection: do the two sides' dependencies differ, and how?

`detect(base_root, head_root)` reads both sides' dependency inputs (inputs.py). Byte-identical inputs are
"unchanged" at once: no parser is loaded, no process started, nothing written. Otherwise both sides are parsed and
compared: the same packages and settings in another form (reordered, comments, whitespace) are "same-in-form";
packages or settings that differ are "changed" with the list (`torch 2.5.1 -> 2.6.0`); a differing file that
cannot be read is "unreadable", naming it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .inputs import DependencyInputs, find_inputs
from .records import CHANGED, NONE_FOUND, SAME_IN_FORM, UNCHANGED, UNREADABLE, PackageChange

__all__ = ["CHANGED", "NONE_FOUND", "SAME_IN_FORM", "UNCHANGED", "UNREADABLE", "Detection", "compare", "detect"]


@dataclass(frozen=True)
class Detection:
    """What differs between the two sides' dependency inputs."""

    base: DependencyInputs
    head: DependencyInputs
    status: str  # UNCHANGED, NONE_FOUND, SAME_IN_FORM, CHANGED or UNREADABLE
    files: tuple[str, ...] = ()  # the inputs whose bytes differ (or that one side only has)
    changes: tuple[PackageChange, ...] = ()
    other: tuple[str, ...] = ()  # settings that differ and name no package
    notes: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()  # 'path: why', for each differing input that could not be read
    python_versions: tuple[str | None, str | None] | None = None  # .python-version (base, head) where they differ
    seconds: float = 0.0  # what detecting cost

    @property
    def differs(self) -> bool:
        """The environments may differ: build them (auto), or say why not."""
        return self.status in (CHANGED, UNREADABLE)

    def summary(self) -> str:
        if self.status == UNCHANGED:
            return "dependency files unchanged"
        if self.status == NONE_FOUND:
            return self.notes[0]
        if self.status == SAME_IN_FORM and self.notes:
            return f"{', '.join(self.files)} changed, not what the environment is built from: {'; '.join(self.notes)}"
        if self.status == SAME_IN_FORM:
            return f"{', '.join(self.files)} changed in form only (order, comments, whitespace): no package differs"
        parts = [str(change) for change in self.changes] + list(self.other)
        if self.python_versions:
            parts.append(f".python-version {self.python_versions[0]} -> {self.python_versions[1]}")
        parts += [f"cannot read {item}" for item in self.unreadable]
        return "; ".join(parts)


def compare(base: DependencyInputs, head: DependencyInputs) -> Detection:
    """Compare two sides' inputs (found by find_inputs)."""
    files = base.differing(head)
    if not base.files and not head.files:
        note = (
            f"no dependency files at {head.root} (nor above it in the repository): a change of dependencies cannot be "
            "seen; name the files that define the environment in the ini option llmperf_compare_deps_paths"
        )
        return Detection(base, head, NONE_FOUND, notes=(note,))
    if not files:
        return Detection(base, head, UNCHANGED)
    from . import differences  # the parsers load only when something differs
    from .recipe import kind_of_build

    before, after = differences.declare(base), differences.declare(head)
    unreadable = tuple(
        sorted({side.unreadable[path] for side in (before, after) for path in files if path in side.unreadable})
    )
    built_from = (kind_of_build(base), kind_of_build(head))
    changes, notes = differences.package_changes(before, after, differences.precedence(built_from[1]))
    other = differences.setting_changes(before, after)
    if built_from[0] != built_from[1]:  # e.g. a project that moved from requirements files to uv.lock
        other += (f"built from {built_from[0] or 'nothing it can build'} -> {built_from[1] or 'nothing it can build'}",)
    versions = (before.python_version, after.python_version)
    python_versions = versions if versions[0] != versions[1] else None
    if unreadable:
        status = UNREADABLE
    elif changes or other or python_versions:
        status = CHANGED
    else:
        status = SAME_IN_FORM
    return Detection(base, head, status, files, changes, other, notes, unreadable, python_versions)


def detect(
    base_root: Path | str,
    head_root: Path | str,
    extra: Sequence[str] = (),
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> Detection:
    """Detect how the dependencies of the side at `base_root` (the compared ref's checkout) and the side at
    `head_root` (the working tree) differ; `extra`: more paths or globs, relative to each root, that count as
    dependency inputs (ini llmperf_compare_deps_paths)."""
    start = clock()
    base, head = find_inputs(base_root, extra), find_inputs(head_root, extra)
    return replace(compare(base, head), seconds=clock() - start)
