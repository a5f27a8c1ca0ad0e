"""A side's dependency inputs: the files that say what its environment holds, found and read as bytes.

Found at the side's root: requirements and constraints files (with what they include by `-r`/`-c`), pyproject.toml,
uv.lock, poetry.lock, pdm.lock, Pipfile.lock, environment.yml, .python-version, and the extra paths or globs the user
names; for a member of a uv workspace, the workspace's uv.lock and pyproject.toml above it too. Reading them is all
that detection costs when nothing changed: two sides whose inputs are byte-identical are compared here, with no
parser loaded (standard library only) and nothing written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EnvironmentsError

LOCKS = ("uv.lock", "poetry.lock", "pdm.lock", "Pipfile.lock")
#: Files looked for by name at the root.
NAMED = ("pyproject.toml", *LOCKS, "environment.yml", "environment.yaml", ".python-version")
#: Requirements and constraints files looked for by pattern at the root.
PATTERNS = ("requirements*.txt", "requirements*.in", "requirements/*.txt", "requirements/*.in", "constraints*.txt")

# `-r file`, `--requirement file`, `--requirement=file`, `-c file`, ... at the start of a requirements line.
_INCLUDE = re.compile(r"^\s*(-r|--requirement|-c|--constraint)(?:\s*=\s*|\s+|(?<=-[rc]))(\S+)")


def kind_of(path: str) -> str:
    """What a dependency input is, from its name: one of LOCKS, pyproject, requirements, constraints, conda,
    python-version, or other (a file named by the user that no parser here reads)."""
    name = path.rsplit("/", 1)[-1]
    if name == "pyproject.toml":
        return "pyproject"
    if name in LOCKS:
        return name
    if name == ".python-version":
        return "python-version"
    if re.fullmatch(r"environment.*\.ya?ml", name):
        return "conda"
    if name.startswith("constraints") and name.endswith(".txt"):
        return "constraints"
    if name.endswith((".txt", ".in")):
        return "requirements"
    return "other"


@dataclass(frozen=True)
class InputFile:
    """One dependency input: its path relative to the side's root (posix), its kind, its bytes (None: named,
    by an include or by the user, but missing)."""

    path: str
    kind: str
    data: bytes | None = field(repr=False)
    included_by: str | None = None  # the requirements file that includes it

    @property
    def missing(self) -> bool:
        return self.data is None


@dataclass(frozen=True)
class DependencyInputs:
    """Every dependency input of one side, sorted by path."""

    root: Path
    files: tuple[InputFile, ...]

    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def get(self, path: str) -> InputFile | None:
        return next((f for f in self.files if f.path == path), None)

    def of_kind(self, *kinds: str) -> tuple[InputFile, ...]:
        return tuple(f for f in self.files if f.kind in kinds and not f.missing)

    def differing(self, other: DependencyInputs) -> tuple[str, ...]:
        """The paths whose bytes differ from `other`'s, or that only one of the two has."""
        mine, theirs = {f.path: f.data for f in self.files}, {f.path: f.data for f in other.files}
        return tuple(
            sorted(p for p in mine.keys() | theirs.keys() if mine.get(p, b"\0absent") != theirs.get(p, b"\0absent"))
        )


def _relative(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


class InputsUnreadable(EnvironmentsError):
    """A dependency input exists but cannot be read (permissions, a symlink loop): what the sides declare is not
    known, so nothing may be said about it."""


def includes(data: bytes) -> list[tuple[str, str]]:
    """(option, path) of each `-r`/`-c` include of a requirements file, in order."""
    found = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        match = _INCLUDE.match(line)
        if match:
            option = "constraints" if match.group(1) in ("-c", "--constraint") else "requirements"
            found.append((option, match.group(2)))
    return found


def _globbed(root: Path, patterns: Iterable[str]) -> list[Path]:
    found: list[Path] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            found += sorted(p for p in root.glob(pattern) if p.is_file())
        else:
            found.append(root / pattern)  # named: counted also when missing (on one side only, it differs)
    return found


def has_inputs(directory: Path) -> bool:
    """Whether `directory` holds a dependency input found by name or pattern."""
    return any((directory / name).is_file() for name in NAMED) or bool(_globbed(directory, PATTERNS))


def inputs_roots(base_top: Path, head_top: Path, head_root: Path) -> tuple[Path, Path]:
    """(base, head): where each side's dependency inputs are read. The nearest directory, from the head's pytest
    rootdir up to its repository's top, that holds one on either side (a rootdir in tests/perf/ of a project whose
    requirements.txt is at the top); the same place on both sides; the rootdir where none does."""
    try:
        relative = head_root.resolve().relative_to(head_top.resolve())
    except ValueError:  # a rootdir outside the repository: only itself
        return base_top, head_root
    for candidate in (relative, *relative.parents):
        if has_inputs(head_top / candidate) or has_inputs(base_top / candidate):
            return base_top / candidate, head_top / candidate
    return base_top / relative, head_top / relative


def find_inputs(root: Path | str, extra: Sequence[str] = ()) -> DependencyInputs:
    """The dependency inputs of the side whose root is `root`, with the extra paths or globs (relative to it);
    InputsUnreadable naming the file where one cannot be read."""
    try:
        return _find(Path(root), extra)
    except OSError as exc:
        where = exc.filename or root
        raise InputsUnreadable(
            f"cannot read {where}, a dependency input of {root}: {exc.strerror or exc}. Make it readable, or remove it"
        ) from None


def workspace_root(root: Path) -> Path | None:
    """The uv workspace whose lock a member at `root` is built from: the nearest directory above it, within its
    repository, whose pyproject.toml declares [tool.uv.workspace] beside a uv.lock; None where `root` has its own
    uv.lock, no pyproject.toml, or no such directory above it."""
    if (root / "uv.lock").is_file() or not (root / "pyproject.toml").is_file():
        return None
    for directory in root.resolve().parents:
        pyproject = directory / "pyproject.toml"
        if (
            (directory / "uv.lock").is_file()
            and pyproject.is_file()
            and b"[tool.uv.workspace]" in pyproject.read_bytes()
        ):
            return directory
        if (directory / ".git").exists():  # the repository's top (a worktree's .git is a file)
            return None
    return None


def _find(root: Path, extra: Sequence[str]) -> DependencyInputs:
    files: dict[str, InputFile] = {}
    queue: list[tuple[Path, str | None, str | None]] = [(root / name, None, None) for name in NAMED]
    workspace = workspace_root(root)
    if workspace is not None:  # a member's environment is the workspace's lock, as uv sync in its directory makes it
        queue += [(workspace / "uv.lock", None, None), (workspace / "pyproject.toml", None, None)]
    queue = [item for item in queue if item[0].is_file()]
    queue += [(p, None, None) for p in _globbed(root, PATTERNS)]
    queue += [(p, None, None) for p in _globbed(root, extra)]
    while queue:
        path, forced_kind, parent = queue.pop(0)
        relative = _relative(path, root)
        if relative in files:
            continue
        data = _read(path)
        kind = forced_kind or kind_of(relative)
        files[relative] = InputFile(relative, kind, data, parent)
        if data is not None and kind in ("requirements", "constraints"):
            for option, target in includes(data):
                if "://" not in target:  # a URL include is compared by its line, not fetched
                    queue.append((path.parent / target, option, relative))
    return DependencyInputs(root, tuple(sorted(files.values(), key=lambda f: f.path)))
