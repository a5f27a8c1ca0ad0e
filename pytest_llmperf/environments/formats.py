"""Reading each dependency input into what it declares: package entries (name, version or specifier, marker) and
settings (an index, find-links, a tool.uv table), in a canonical form, so that a reordered file or an edited comment
reads the same.

`packaging` reads requirements, specifiers and versions (pytest depends on it); tomllib (tomli before Python 3.11)
reads TOML, json the Pipfile lock, PyYAML environment.yml where it is installed. A file that cannot be read raises
`Unreadable` naming the file and why.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name, canonicalize_version

from .inputs import InputFile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest requires tomli before 3.11
    import tomli as tomllib


class Unreadable(ValueError):
    """A dependency input that could not be read; the message names the file and why."""


@dataclass(frozen=True, order=True)
class Entry:
    """One package as one file declares or locks it."""

    name: str  # canonical (PEP 503)
    spec: str = ""  # a specifier ('==1.0', '>=2,<3'), a tool's own ('^1.2' in poetry, '1.2.*' in conda), '' any
    marker: str = ""
    group: str = ""  # '' for the main dependencies; 'extra hf', 'group dev', 'develop', 'constraint', ...
    locked: bool = False  # from a lock file: spec is '==<version>'

    def shown(self) -> str:
        """The version or specifier as a person reads it: '2.5.1', '>=2,<3', 'any'."""
        text = (
            self.spec[2:] if self.spec.startswith("==") and "," not in self.spec and "*" not in self.spec else self.spec
        )
        text = text or "any"
        if self.marker:
            text += f" ; {self.marker}"
        return text + (f" [{self.group}]" if self.group else "")

    def key(self) -> tuple[str, str, str, str]:
        """What two entries must share to be the same: '==1.0' and '==1.0.0' are."""
        return (self.name, _canonical_spec(self.spec), self.marker, self.group)


@dataclass(frozen=True)
class Declared:
    """What one file declares: its package entries and its settings (name -> canonical JSON text)."""

    entries: frozenset[Entry] = frozenset()
    settings: Mapping[str, str] = field(default_factory=dict)

    def keys(self) -> tuple[frozenset[tuple[str, str, str, str]], tuple[tuple[str, str], ...]]:
        return frozenset(e.key() for e in self.entries), tuple(sorted(self.settings.items()))


def _canonical_spec(spec: str) -> str:
    try:
        parsed = SpecifierSet(spec)
    except InvalidSpecifier:
        return "".join(spec.split())
    parts = []
    for item in parsed:
        version = item.version
        if not version.endswith(".*"):
            with contextlib.suppress(Exception):  # a '===' arbitrary string stays as written
                version = canonicalize_version(version)
        parts.append(item.operator + version)
    return ",".join(sorted(parts))


def _setting(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def requirement_entry(text: str, group: str = "") -> Entry:
    """A PEP 508 line as an entry (raises InvalidRequirement)."""
    req = Requirement(text)
    spec = f"@ {req.url}" if req.url else str(req.specifier)
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return Entry(canonicalize_name(req.name), spec, str(req.marker or ""), group + extras if extras else group)


# --- requirements.txt ------------------------------------------------------------------------------------------

#: Options that are settings of the whole file; their values are compared as sets.
_FILE_OPTIONS = {
    "-i": "--index-url",
    "--index-url": "--index-url",
    "--extra-index-url": "--extra-index-url",
    "-f": "--find-links",
    "--find-links": "--find-links",
    "--no-index": "--no-index",
    "--pre": "--pre",
    "--trusted-host": "--trusted-host",
    "--prefer-binary": "--prefer-binary",
    "--only-binary": "--only-binary",
    "--no-binary": "--no-binary",
    "-e": "--editable",
    "--editable": "--editable",
}
_FLAGS = {"--no-index", "--pre", "--prefer-binary"}
_INCLUDES = {"-r", "--requirement", "-c", "--constraint"}


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """(first line number, line) with continuations joined and comments removed, as pip reads them."""
    joined, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not joined:
            start = number
        line = raw
        for index, char in enumerate(line):  # a comment starts a line, or follows whitespace (not a URL #fragment)
            if char == "#" and (index == 0 or line[index - 1].isspace()):
                line = line[:index]
                break
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        joined += line
        if joined.strip():
            yield start, joined.strip()
        joined = ""
    if joined.strip():
        yield start, joined.strip()


def _option(line: str) -> tuple[str, str]:
    """('--find-links', 'wheels') from '--find-links wheels' or '--find-links=wheels'; ('-f', 'x') from '-fx'."""
    if line.startswith("--"):
        first, _, rest = line.partition(" ")
        option, sep, value = first.partition("=")
        return option, (value if sep else rest).strip()
    return line[:2], line[2:].strip()


def read_requirements(file: InputFile, group: str = "") -> Declared:
    assert file.data is not None
    entries: set[Entry] = set()
    options: dict[str, set[str]] = {}
    direct: list[str] = []
    for number, line in _logical_lines(file.data.decode("utf-8", errors="replace")):
        if line.startswith("-"):
            option, value = _option(line)
            if option in _INCLUDES:
                continue  # the included file is an input of its own
            if option not in _FILE_OPTIONS:
                raise Unreadable(f"{file.path} line {number}: option {option} is not one pytest-llmperf reads")
            name = _FILE_OPTIONS[option]
            options.setdefault(name, set()).add("" if name in _FLAGS else value)
            continue
        line = line.split(" --", 1)[0].strip()  # per-requirement options (--hash=...) are not the package
        try:
            entries.add(requirement_entry(line, group))
        except InvalidRequirement as exc:
            if line.startswith((".", "/", "file:")) or "://" in line:
                direct.append(line)  # a path or URL: compared as written
                continue
            raise Unreadable(f"{file.path} line {number}: {line!r} is not a requirement ({exc})") from None
    settings = {f"{file.path} {name}": _setting(sorted(values)) for name, values in options.items()}
    if direct:
        settings[f"{file.path} direct"] = _setting(sorted(direct))
    return Declared(frozenset(entries), settings)


# --- TOML: pyproject.toml and the lock files --------------------------------------------------------------------


def load_toml(file: InputFile) -> dict[str, Any]:
    assert file.data is not None
    try:
        return tomllib.loads(file.data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise Unreadable(f"{file.path}: not valid TOML ({exc})") from None


def _pep508_list(file: InputFile, items: Any, group: str, where: str) -> set[Entry]:
    found = set()
    for item in items or ():
        if isinstance(item, Mapping):  # {include-group = "..."}: the included group is read where it is
            continue
        try:
            found.add(requirement_entry(str(item), group))
        except InvalidRequirement as exc:
            raise Unreadable(f"{file.path} {where}: {item!r} is not a requirement ({exc})") from None
    return found


def _poetry_entries(table: Mapping[str, Any], group: str) -> tuple[set[Entry], dict[str, Any]]:
    entries, python = set(), {}
    for name, value in (table or {}).items():
        if name.lower() == "python":
            python[group or "main"] = value
            continue
        spec = value if isinstance(value, str) else _setting(value)
        entries.add(Entry(canonicalize_name(name), spec, "", group))
    return entries, python


def read_pyproject(file: InputFile) -> Declared:
    data = load_toml(file)
    project, tool = data.get("project") or {}, data.get("tool") or {}
    entries = _pep508_list(file, project.get("dependencies"), "", "[project] dependencies")
    for extra, items in (project.get("optional-dependencies") or {}).items():
        entries |= _pep508_list(file, items, f"extra {extra}", f"optional-dependencies.{extra}")
    for group, items in (data.get("dependency-groups") or {}).items():
        entries |= _pep508_list(file, items, f"group {group}", f"dependency-groups.{group}")
    settings: dict[str, str] = {}
    if "requires-python" in project:
        settings[f"{file.path} requires-python"] = _setting(project["requires-python"])
    uv = dict(tool.get("uv") or {})
    for key, group in (
        ("dev-dependencies", "group dev"),
        ("constraint-dependencies", "constraint"),
        ("override-dependencies", "override"),
    ):
        entries |= _pep508_list(file, uv.pop(key, ()), group, f"[tool.uv] {key}")
    settings.update({f"{file.path} [tool.uv] {key}": _setting(value) for key, value in uv.items()})
    poetry = tool.get("poetry") or {}
    groups = {"": poetry.get("dependencies"), "group dev": poetry.get("dev-dependencies")}
    groups.update({f"group {g}": t.get("dependencies") for g, t in (poetry.get("group") or {}).items()})
    for group, table in groups.items():
        found, python = _poetry_entries(table or {}, group)
        entries |= found
        if python:
            settings[f"{file.path} [tool.poetry] python {group or 'main'}"] = _setting(python)
    for group, items in ((tool.get("pdm") or {}).get("dev-dependencies") or {}).items():
        entries |= _pep508_list(file, items, f"group {group}", f"[tool.pdm] dev-dependencies.{group}")
    return Declared(frozenset(entries), settings)


def read_toml_lock(file: InputFile) -> Declared:
    """uv.lock, poetry.lock, pdm.lock: each [[package]]'s name and version, and where it comes from. The
    project's own entry (uv.lock: a virtual or editable '.') is left out: the project is never installed."""
    packages = load_toml(file).get("package")
    if not isinstance(packages, list):
        raise Unreadable(f"{file.path}: no [[package]] tables, not a lock file pytest-llmperf reads")
    entries: set[Entry] = set()
    sources: dict[str, set[str]] = {}
    for package in packages:
        try:
            name, version = canonicalize_name(str(package["name"])), str(package["version"])
        except (KeyError, TypeError):
            raise Unreadable(f"{file.path}: a [[package]] without a name and a version") from None
        source = package.get("source") or {}
        if source.get("virtual") == "." or source.get("editable") == ".":
            continue
        entries.add(Entry(name, f"=={version}", locked=True))
        if source:
            sources.setdefault(name, set()).add(_setting(source))
    settings = {f"{file.path} source of {name}": ", ".join(sorted(found)) for name, found in sources.items()}
    return Declared(frozenset(entries), settings)


def read_pipfile_lock(file: InputFile) -> Declared:
    assert file.data is not None
    try:
        data = json.loads(file.data)
        entries = set()
        for section, group in (("default", ""), ("develop", "develop")):
            for name, info in (data.get(section) or {}).items():
                spec = str(info.get("version") or "") if isinstance(info, Mapping) else str(info)
                entries.add(Entry(canonicalize_name(name), spec, str(info.get("markers") or ""), group, True))
        sources = (data.get("_meta") or {}).get("sources") or []
    except (ValueError, AttributeError) as exc:
        raise Unreadable(f"{file.path}: not a Pipfile.lock pytest-llmperf reads ({exc})") from None
    return Declared(frozenset(entries), {f"{file.path} sources": _setting(sources)} if sources else {})


def read_conda(file: InputFile) -> Declared:
    assert file.data is not None
    try:
        import yaml
    except ImportError:
        raise Unreadable(f"{file.path}: reading a conda environment file needs PyYAML (pip install pyyaml)") from None
    try:
        data = yaml.safe_load(file.data) or {}
        items, channels = list(data.get("dependencies") or ()), data.get("channels") or []
    except (yaml.YAMLError, AttributeError, TypeError) as exc:
        raise Unreadable(f"{file.path}: not a conda environment file ({exc})") from None
    entries = set()
    for item in items:
        if isinstance(item, Mapping):
            entries |= _pep508_list(file, item.get("pip"), "pip", "pip:")
            continue
        spec = str(item).split("::", 1)[-1].strip()
        name = spec.split()[0]
        for index, char in enumerate(name):
            if char in "=<>!~ ":
                name, spec = name[:index], spec[index:]
                break
        else:
            spec = ""
        entries.add(Entry(canonicalize_name(name), "".join(spec.split()), "", "conda"))
    return Declared(frozenset(entries), {f"{file.path} channels": _setting(channels)} if channels else {})


def python_version_of(file: InputFile) -> str:
    """The first version a .python-version file names ('' for an empty one)."""
    assert file.data is not None
    lines = [ln.strip() for ln in file.data.decode("utf-8", errors="replace").splitlines()]
    return next((ln for ln in lines if ln and not ln.startswith("#")), "")


def read(file: InputFile) -> Declared:
    """What `file` declares; Unreadable if it cannot be read (or is missing)."""
    if file.data is None:
        by = f" (included by {file.included_by})" if file.included_by else ""
        raise Unreadable(f"{file.path}: named as a dependency input{by} but missing")
    if file.kind in ("requirements", "constraints"):
        return read_requirements(file, "constraint" if file.kind == "constraints" else "")
    if file.kind == "pyproject":
        return read_pyproject(file)
    if file.kind in ("uv.lock", "poetry.lock", "pdm.lock"):
        return read_toml_lock(file)
    if file.kind == "Pipfile.lock":
        return read_pipfile_lock(file)
    if file.kind == "conda":
        return read_conda(file)
    if file.kind == "python-version":
        return Declared(frozenset(), {".python-version": _setting(python_version_of(file))})
    raise Unreadable(f"{file.path}: not a format pytest-llmperf reads; its change cannot be told apart from others")
