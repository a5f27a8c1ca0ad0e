"""What differs between two sides' declared dependencies: packages (`torch 2.5.1 -> 2.6.0`), settings that name no
package (an index, find-links), and notes for what changed in form only.

A package is compared where the side's environment is built from (recipe.py): its uv.lock, else its requirements and
constraints files, else pyproject.toml; then the other files, most precise first. A specifier edited in
pyproject.toml while the lock keeps the same version is a note, not a change: the environment built from the lock
is the same. A pin bumped in requirements.txt beside a poetry.lock that did not move is a change: the environment is
built from requirements.txt.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from . import formats
from .formats import Declared, Entry
from .inputs import LOCKS, DependencyInputs
from .recipe import PYPROJECT, REQUIREMENTS, UV_LOCK
from .records import PackageChange

#: Where a package's version is read, most precise first: (name, the kinds of file).
CATEGORIES = (
    ("lock", LOCKS),
    ("requirements", ("requirements", "constraints")),
    ("pyproject", ("pyproject",)),
    ("conda", ("conda",)),
)
#: The kinds of file a recipe builds from (recipe.py), most decisive first: read first, then the others in
#: CATEGORIES' order.
BUILT_FROM = {
    UV_LOCK: (("uv.lock",),),
    REQUIREMENTS: (("requirements", "constraints"), ("pyproject",)),
    PYPROJECT: (("pyproject",),),
}


def precedence(recipe_kind: str | None) -> tuple[tuple[str, ...], ...]:
    """The kinds of file where a package is read, most decisive first, for a side built by `recipe_kind` (None: it
    cannot be built; the locks then decide, and a change in them fails the build, loudly)."""
    first = BUILT_FROM.get(recipe_kind or "", ())
    used = {kind for kinds in first for kind in kinds}
    rest = tuple(tuple(k for k in kinds if k not in used) for _, kinds in CATEGORIES)
    return tuple(kinds for kinds in (*first, *rest) if kinds)


PYTHON_VERSION = ".python-version"


@dataclass(frozen=True)
class SideDeclared:
    """What one side's dependency inputs declare, file by file."""

    files: Mapping[str, Declared]  # path -> what it declares
    kinds: Mapping[str, str]  # path -> its kind
    unreadable: Mapping[str, str]  # path -> why it could not be read

    def entries(self, kinds: Collection[str]) -> dict[str, list[tuple[str, Entry]]]:
        """name -> (path, entry) of every entry in the files of these kinds."""
        found: dict[str, list[tuple[str, Entry]]] = {}
        for path, declared in self.files.items():
            if self.kinds[path] in kinds:
                for entry in declared.entries:
                    found.setdefault(entry.name, []).append((path, entry))
        return found

    def settings(self) -> dict[str, str]:
        return {key: value for declared in self.files.values() for key, value in declared.settings.items()}

    @property
    def python_version(self) -> str | None:
        value = self.settings().get(PYTHON_VERSION)
        return None if value is None else str(json.loads(value))


def declare(inputs: DependencyInputs) -> SideDeclared:
    """Read every input of one side; those that cannot be read are listed with why."""
    files, unreadable = {}, {}
    for file in inputs.files:
        try:
            files[file.path] = formats.read(file)
        except formats.Unreadable as exc:
            unreadable[file.path] = str(exc)
    return SideDeclared(files, {f.path: f.kind for f in inputs.files}, unreadable)


def shown(entries: list[tuple[str, Entry]]) -> str | None:
    """The versions or specifiers of a package on one side ('any' only where nothing narrows it)."""
    texts = {entry.shown() for _, entry in entries}
    return " | ".join(sorted(texts - {"any"} or texts)) or None


def _keys(entries: list[tuple[str, Entry]]) -> frozenset[tuple[str, str, str, str]]:
    return frozenset(entry.key() for _, entry in entries)


def _paths(*entries: list[tuple[str, Entry]]) -> str:
    return ", ".join(sorted({path for found in entries for path, _ in found}))


def package_changes(
    base: SideDeclared, head: SideDeclared, order: tuple[tuple[str, ...], ...] = precedence(None)
) -> tuple[tuple[PackageChange, ...], tuple[str, ...]]:
    """(the packages that differ, notes on declarations that differ where a more decisive file agrees); `order`: the
    kinds of file, most decisive first (precedence())."""
    tables = [(base.entries(kinds), head.entries(kinds)) for kinds in order]
    names = sorted({name for pair in tables for side in pair for name in side})
    changes, notes = [], []
    for name in names:
        decided: tuple[list[tuple[str, Entry]], list[tuple[str, Entry]]] | None = None
        for base_table, head_table in tables:
            before, after = base_table.get(name, []), head_table.get(name, [])
            if not before and not after:
                continue
            differ = _keys(before) != _keys(after)
            if decided is None:
                decided = (before, after)
                if differ:
                    changes.append(PackageChange(name, shown(before), shown(after), _paths(before, after)))
                    break
            elif differ:
                notes.append(
                    f"{name}: {_paths(before, after)} declares {shown(before)} -> {shown(after)}; "
                    f"{_paths(*decided)} has {shown(decided[0])} on both sides"
                )
    return tuple(changes), tuple(notes)


def setting_changes(base: SideDeclared, head: SideDeclared) -> tuple[str, ...]:
    """Settings that differ (an index, find-links, a [tool.uv] key), the Python version aside."""
    before, after = base.settings(), head.settings()
    keys = sorted((before.keys() | after.keys()) - {PYTHON_VERSION})
    return tuple(
        f"{key}: {before.get(key, 'absent')} -> {after.get(key, 'absent')}"
        for key in keys
        if before.get(key) != after.get(key)
    )
