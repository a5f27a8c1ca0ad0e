"""What an interpreter holds (`probe`), and what a worker actually ran (`imported_distributions`, `check_imported`).
Standard library only: a worker imports this."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .records import SHARED, EnvironmentsError, SideEnvironment, canonical_name

#: Run by the probed interpreter with -I. A distribution's files: a digest of their RECORD hashes (a wheel rebuilt
#: under its version holds other files), and whether each is there at its size.
PROBE = r"""
import hashlib, importlib.metadata, importlib.util, json, os, platform, sys
installed, contents, damaged, local = {}, {}, [], []
for dist in importlib.metadata.distributions() if sys.argv[1:] != ["--no-installed"] else ():
    name = dist.metadata["Name"]
    if name and name not in installed:
        installed[name], own = dist.version, []
        for item in dist.files or ():
            if item.size is not None and len(damaged) < 5:
                try:
                    ok = os.stat(dist.locate_file(item)).st_size == item.size
                except OSError:
                    ok = False
                if not ok:
                    damaged.append(f"{item} of {name} {dist.version}")
            if item.hash is not None and item.parts[0] != ".." and not item.parts[0].endswith(".dist-info"):
                own.append(f"{item.as_posix()} {item.hash.value}")
        contents[name] = hashlib.sha256("\n".join(sorted(own)).encode()).hexdigest()[:16]
        if '"dir_info"' in (dist.read_text("direct_url.json") or ""):
            local.append(name)
impl = sys.implementation
print(json.dumps({
    "executable": sys.executable, "base_executable": getattr(sys, "_base_executable", sys.executable),
    "identity": {"version": sys.version, "implementation": impl.name, "cache_tag": impl.cache_tag,
                 "magic": importlib.util.MAGIC_NUMBER.hex(), "platform": [sys.platform, platform.machine()]},
    "python": [platform.python_implementation(), platform.python_version()],
    "installed": installed, "contents": contents, "damaged": damaged, "local": local,
}))
"""


@dataclass(frozen=True)
class Probe:
    """An interpreter as it reported itself."""

    executable: str
    base_executable: str
    identity: Mapping[str, Any]  # what makes two interpreters the same one (pyperformance's recipe), with the platform
    implementation: str  # "CPython"
    version: str  # "3.11.7"
    installed: Mapping[str, str] = field(default_factory=dict)  # canonical name -> version
    contents: Mapping[str, str] = field(default_factory=dict)  # canonical name -> digest of its files
    damaged: tuple[str, ...] = ()  # files that a distribution's RECORD lists but that are missing or another size
    local: tuple[str, ...] = ()  # distributions installed from a local directory

    @property
    def python_version(self) -> str:
        return f"{self.implementation} {self.version}"


def probe(python: str, *, installed: bool = True, timeout: float = 120.0) -> Probe:
    """Ask the interpreter `python` what it is and (unless not `installed`) what it has installed."""
    command = [python, "-I", "-c", PROBE, *([] if installed else ["--no-installed"])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvironmentsError(f"{python} could not be run as a Python interpreter: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise EnvironmentsError(f"{python} could not be run as a Python interpreter (exit {done.returncode}): {tail}")
    data: dict[str, Any] = json.loads(done.stdout)
    installed_set = {canonical_name(name): version for name, version in data["installed"].items()}
    contents = {canonical_name(name): digest for name, digest in data["contents"].items()}
    identity = {**data["identity"], "executable": data["base_executable"]}
    implementation, version = data["python"]
    return Probe(data["executable"], data["base_executable"], identity, implementation, version, installed_set,
                 contents, tuple(data["damaged"]), tuple(data["local"]))  # fmt: skip


def installed_here() -> dict[str, str]:
    """The distributions this process can import (canonical name -> version; the first found wins, as imports do)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        if dist.metadata["Name"]:
            found.setdefault(canonical_name(dist.metadata["Name"]), dist.version)
    return found


def imported_distributions(modules: Iterable[str] | None = None, *, own: Iterable[str | Path] = ()) -> dict[str, str]:
    """The versions of the distributions that provide these modules (default: all imported here), but the standard
    library, the project's own, and one whose metadata lies in a side's import root `own` (`pip install -e .`)."""
    names = list(sys.modules) if modules is None else modules  # a copy: another thread may import meanwhile
    providers = importlib.metadata.packages_distributions()
    roots = {Path(root).resolve() for root in own}
    found = {}
    for top in sorted({name.partition(".")[0] for name in names if name}):
        for name in providers.get(top, ()):
            try:
                dist = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue
            if not roots or Path(str(dist.locate_file(""))).resolve() not in roots:
                found[canonical_name(name)] = dist.version
    return found


def check_imported(imported: Mapping[str, str], side: SideEnvironment) -> tuple[str, ...]:
    """What a worker of `side` imported that is not that side's environment (nothing, for a shared one)."""
    if side.how == SHARED:
        return ()
    problems = []
    for name, version in sorted(imported.items()):
        expected = side.version(name)
        if expected is None:
            problems.append(f"{name} {version} is not installed in the {side.side} environment")
        elif expected != version:
            problems.append(f"{name} {version} was imported; the {side.side} environment has {expected}")
    return tuple(problems)
