"""A side's dependency inputs, known by their bytes: the files found by name and the local paths they name. Nothing is
parsed to decide what changed (docs/environments.md, "Detecting a difference")."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .records import CHANGED, NONE_FOUND, UNCHANGED, EnvironmentsError

#: Files looked for by name at the root: what uv builds from, and (REFUSED) what it cannot.
BUILT = ("pyproject.toml", "uv.lock", "pylock.toml", "uv.toml", ".python-version")
#: The files of other tools, each with the command that exports it to a requirements file.
_PIPENV, _CONDA = "pipenv requirements > requirements.txt", "then list its pip packages in requirements.txt"
REFUSED = {"poetry.lock": "poetry export -o requirements.txt", "pdm.lock": "pdm export -o requirements.txt",
           "Pipfile": _PIPENV, "Pipfile.lock": _PIPENV, "environment.yml": f"conda env export --from-history, {_CONDA}",
           "environment.yaml": f"conda env export --from-history, {_CONDA}",
           "conda-lock.yml": f"conda-lock render --kind explicit, {_CONDA}"}  # fmt: skip
#: Requirements and constraints files, and PEP 751 locks, looked for by pattern at the root.
PATTERNS = ("requirements*.txt", "requirements*.in", "requirements/*.txt", "requirements/*.in", "constraints*.txt",
            "pylock.*.toml")  # fmt: skip

# `-r file`, `--requirement=file`, `-c file`, ... at the start of a requirements line.
_INCLUDE = re.compile(r"^\s*(-r|--requirement|-c|--constraint)(?:\s*=\s*|\s+|(?<=-[rc]))(\S+)")
# Options of a requirements line whose value may be a local path.
_PATH_OPTIONS = ("-f", "--find-links", "-e", "--editable", "-i", "--index-url", "--extra-index-url")
_ARCHIVES = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")
#: TOML keys whose values are paths or URLs (uv.lock sources, [tool.uv], pylock.toml): a string or an array of them.
_KEYS = r"(?:path|directory|editable|registry|find-links|url|index-url|extra-index-url)"
_TOML_PATHS = re.compile(rf"(?<![\w-]){_KEYS}\s*=\s*(\[[^\]]*\]|'[^'\n]*'|\"[^\"\n]*\")")
_QUOTED = re.compile(r"\"([^\"\n]*)\"|'([^'\n]*)'")
#: Left out of a directory's fingerprint.
_SKIPPED = {".git", "__pycache__", ".venv", "node_modules"}


def kind_of(path: str) -> str:
    """What a dependency input is, from its name (other: uv.toml, .python-version, a file the user named)."""
    name = path.rsplit("/", 1)[-1]
    if name in ("pyproject.toml", "uv.lock"):
        return name
    if name in REFUSED:
        return "refused"
    if re.fullmatch(r"pylock(\.[^.]+)?\.toml", name):
        return "pylock"
    if name.startswith("constraints") and name.endswith(".txt"):
        return "constraints"
    if name.endswith((".txt", ".in")):
        return "requirements"
    return "other"


@dataclass(frozen=True)
class InputFile:
    """One dependency input: its path relative to the side's root (posix), its kind, its bytes (None: missing)."""

    path: str
    kind: str
    data: bytes | None = field(repr=False)
    included_by: str | None = None


@dataclass(frozen=True)
class DependencyInputs:
    """Every dependency input of one side, and a fingerprint of each local path they name."""

    root: Path
    files: tuple[InputFile, ...]
    local: tuple[tuple[str, str], ...] = ()  # (path: relative to the root where named so, else absolute; fingerprint)

    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def get(self, path: str) -> InputFile | None:
        return next((f for f in self.files if f.path == path and f.data is not None), None)

    def of_kind(self, kind: str) -> tuple[InputFile, ...]:
        """The files of this kind that exist, but those that others include."""
        return tuple(f for f in self.files if f.kind == kind and f.data is not None and f.included_by is None)

    def digests(self) -> dict[str, str | None]:
        """Each input's and named path's digest: what detection compares and the cache key reads."""
        files = {f.path: None if f.data is None else hashlib.sha256(f.data).hexdigest() for f in self.files}
        return {**files, **dict(self.local)}


def _local(text: str) -> str | None:
    """The local path a URL or path names ('file:///w/x.whl', './vendor', '../libs/x'), else None."""
    text = text.strip().strip("'\"")
    if text.startswith("file:"):
        text = re.sub(r"^file:(//)?", "", text)
    elif "://" in text or not text or text.startswith("$"):
        return None
    return os.path.expanduser(text)


def _requirement_paths(line: str) -> Iterator[str]:
    """The local paths one requirement line (or requirement string) may name."""
    tokens = re.split(r"[\s=]+", line.split(" #", 1)[0].strip())
    for index, token in enumerate(tokens):
        if token in _PATH_OPTIONS and index + 1 < len(tokens):
            yield tokens[index + 1]
        elif token.startswith(("file:", "./", "../", "/", "~")) or token.endswith(_ARCHIVES):
            yield token
    if "@" in line:
        yield line.split("@", 1)[1].split(";", 1)[0].strip()


def named_paths(file: InputFile) -> Iterator[str]:
    """The paths that the input `file` names, as written: in a requirements line, or under a TOML key uv reads."""
    text, lines = (file.data or b"").decode("utf-8-sig", errors="replace"), []
    if file.kind in ("requirements", "constraints"):
        lines = text.splitlines()
    elif file.path.endswith((".toml", ".lock")):
        yield from (a or b for values in _TOML_PATHS.findall(text) for a, b in _QUOTED.findall(values))
        lines = [a or b for a, b in _QUOTED.findall(text) if "@" in (a or b)]  # PEP 508 direct references
    for line in lines:
        yield from _requirement_paths(line)


def fingerprint(path: Path, content: bool) -> str:
    """A digest of what lies at `path`, a file or a directory: by content, or by size and modification time."""
    if path.is_file():
        files = [(".", path)]
    else:
        files = []
        for folder, subfolders, names in os.walk(path):
            subfolders[:] = [s for s in subfolders if s not in _SKIPPED]
            files += [(_relative(Path(folder, name), path), Path(folder, name)) for name in names]
    digest = hashlib.sha256()
    for name, file in sorted(files):
        digest.update(f"{name}\0".encode())
        if content:
            with open(file, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
        else:
            digest.update(f"{file.stat().st_size}:{file.stat().st_mtime_ns}".encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def _relative(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def _globbed(root: Path, patterns: Sequence[str]) -> list[Path]:
    found: list[Path] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            found += sorted(p for p in root.glob(pattern) if p.is_file() or p.is_symlink())
        else:
            found.append(root / pattern)  # named: counted also when missing (on one side only, it differs)
    return found


def inputs_roots(base_top: Path, head_top: Path, head_root: Path) -> tuple[Path, Path]:
    """(base, head): where the sides' inputs are read: the nearest place above the rootdir that holds one on either."""
    try:
        relative = head_root.resolve().relative_to(head_top.resolve())
    except ValueError:  # a rootdir outside the repository: only itself
        return base_top, head_root
    for candidate in (relative, *relative.parents):
        for directory in (head_top / candidate, base_top / candidate):
            if any((directory / name).is_file() for name in (*BUILT, *REFUSED)) or _globbed(directory, PATTERNS):
                return base_top / candidate, head_top / candidate
    return base_top / relative, head_top / relative


def workspace_root(root: Path) -> Path | None:
    """The uv workspace that a member at `root` (a pyproject.toml, no uv.lock) is built from, within its repository."""
    if (root / "uv.lock").is_file() or not (root / "pyproject.toml").is_file() or (root / ".git").exists():
        return None
    for directory in root.resolve().parents:
        lock, pyproject = directory / "uv.lock", directory / "pyproject.toml"
        if lock.is_file() and pyproject.is_file() and b"[tool.uv.workspace]" in pyproject.read_bytes():
            return directory
        if (directory / ".git").exists():  # the repository's top (a worktree's .git is a file)
            return None
    return None


class InputsUnreadable(EnvironmentsError):
    """A dependency input exists but cannot be read: what the side declares is not known."""


def _read(path: Path) -> bytes | None:
    """The bytes of `path`; None where nothing is there; InputsUnreadable where something is but cannot be read."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        why = "a symlink to nothing" if path.is_symlink() and not path.exists() else exc.strerror or str(exc)
        raise InputsUnreadable(
            f"cannot read {path}, a dependency input: {why}. Make it readable, or remove it"
        ) from None


def find_inputs(root: Path | str, extra: Sequence[str] = ()) -> DependencyInputs:
    """The dependency inputs of the side whose root is `root`, with the extra paths or globs (relative to it)."""
    root = Path(root)
    by_name = [root / name for name in (*BUILT, *REFUSED)]
    workspace = workspace_root(root)
    if workspace is not None:  # a member's environment is the workspace's lock, as uv sync in its directory makes it
        by_name += [workspace / "uv.lock", workspace / "pyproject.toml"]
    found = [p for p in by_name if p.exists() or p.is_symlink()] + _globbed(root, PATTERNS) + _globbed(root, extra)
    queue: list[tuple[Path, str | None, str | None]] = [(path, None, None) for path in found]  # (path, kind, includer)
    files: dict[str, InputFile] = {}
    while queue:
        path, kind, parent = queue.pop(0)
        relative = _relative(path, root)
        if relative in files:  # found by pattern and included too: read through what includes it
            if parent is not None and files[relative].included_by is None:
                files[relative] = replace(files[relative], included_by=parent)
            continue
        data = _read(path)
        file = files[relative] = InputFile(relative, kind or kind_of(relative), data, parent)
        if data is not None and file.kind in ("requirements", "constraints"):
            for line in data.decode("utf-8-sig", errors="replace").splitlines():
                if (match := _INCLUDE.match(line)) and "://" not in match[2]:
                    included = "constraints" if match[1] in ("-c", "--constraint") else "requirements"
                    queue.append((path.parent / match[2], included, relative))
    local, project = {}, {root.resolve(), *root.resolve().parents}
    for file in files.values():
        for given in filter(None, map(_local, named_paths(file))):
            path = (root / file.path).parent / given
            if path.exists() and path.resolve() not in project:  # the project itself: imported from its checkout
                inside = not os.path.isabs(given)
                local[_relative(path, root) if inside else str(path)] = fingerprint(path, inside)
    return DependencyInputs(root, tuple(sorted(files.values(), key=lambda f: f.path)), tuple(sorted(local.items())))


@dataclass(frozen=True)
class Detection:
    """What differs between the two sides' dependency inputs, by their bytes."""

    base: DependencyInputs
    head: DependencyInputs
    files: tuple[str, ...] = ()  # the inputs (and named local paths) that differ, or that one side only has
    seconds: float = 0.0  # what detecting cost

    @property
    def found(self) -> bool:
        return bool(self.base.files or self.head.files)

    @property
    def differs(self) -> bool:
        return bool(self.files)

    @property
    def status(self) -> str:
        return CHANGED if self.differs else UNCHANGED if self.found else NONE_FOUND

    def none_found(self) -> str:
        return (f"no dependency files at {self.head.root} (nor above it in the repository): a change of dependencies "
                "cannot be seen; name the files that define the environment in the ini option "
                "llmperf_compare_deps_paths")  # fmt: skip


def detect(
    base_root: Path | str,
    head_root: Path | str,
    extra: Sequence[str] = (),
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> Detection:
    """How the dependency inputs at `base_root` and `head_root` differ (`extra`: ini llmperf_compare_deps_paths)."""
    start = clock()
    base, head = find_inputs(base_root, extra), find_inputs(head_root, extra)
    mine, theirs = base.digests(), head.digests()
    differing = sorted(p for p in mine.keys() | theirs.keys() if mine.get(p, "-") != theirs.get(p, "-"))
    return Detection(base, head, tuple(differing), clock() - start)
