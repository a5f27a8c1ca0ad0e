"""What an environment holds, and what a worker actually ran.

`probe(python)`: one subprocess of that interpreter (isolated: -I) prints its identity, its marker environment and
its installed distributions (importlib.metadata): their versions, a digest of their files (a wheel rebuilt under
the same version holds other files) and whether those are intact. `imported_distributions(modules)`: in the calling
process, the installed versions of the distributions behind a set of imported top-level modules (a worker sends these;
the stored baseline's fingerprint keeps them). `check_imported`: whether what a worker imported is the side's
environment, so that one side is never measured in the other's. Standard library only: a worker imports this.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import EnvironmentsError
from .records import SHARED, SideEnvironment, canonical_name

#: Run by the probed interpreter: stdlib only, isolated from PYTHONPATH and the user's site-packages. The marker
#: environment is PEP 508's, written out as packaging.markers.default_environment() computes it.
PROBE = r"""
import hashlib, importlib.metadata, importlib.util, json, os, platform, sys
impl = sys.implementation
version = "{0.major}.{0.minor}.{0.micro}".format(impl.version)
if impl.version.releaselevel != "final":
    version += impl.version.releaselevel[0] + str(impl.version.serial)
markers = {
    "implementation_name": impl.name, "implementation_version": version, "os_name": os.name,
    "platform_machine": platform.machine(), "platform_release": platform.release(),
    "platform_system": platform.system(), "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform,
}
installed, contents, damaged, local = {}, {}, [], []
for dist in importlib.metadata.distributions() if sys.argv[1:] != ["--no-installed"] else ():
    name = dist.metadata["Name"]
    if name and name not in installed:
        installed[name], own = dist.version, []
        for item in dist.files or ():  # intact: every file its RECORD sizes is there, at that size
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
print(json.dumps({
    "executable": sys.executable, "base_executable": getattr(sys, "_base_executable", sys.executable),
    "version": sys.version, "implementation": impl.name, "cache_tag": impl.cache_tag,
    "magic": importlib.util.MAGIC_NUMBER.hex(), "markers": markers, "installed": installed, "contents": contents,
    "damaged": damaged, "local": local,
}))
"""


@dataclass(frozen=True)
class Probe:
    """An interpreter as it reported itself."""

    executable: str
    base_executable: str
    identity: Mapping[str, str]  # what makes two interpreters the same one (pyperformance's recipe)
    markers: Mapping[str, str]  # PEP 508 marker environment
    installed: Mapping[str, str] = field(default_factory=dict)  # canonical name -> version
    contents: Mapping[str, str] = field(default_factory=dict)  # canonical name -> digest of its files (RECORD)
    damaged: tuple[str, ...] = ()  # files that a distribution's RECORD lists but that are missing or changed in size
    local: tuple[str, ...] = ()  # distributions installed from a local directory

    @property
    def python_version(self) -> str:
        """'CPython 3.11.7'."""
        return f"{self.markers['platform_python_implementation']} {self.markers['python_full_version']}"


def probe(python: str, *, installed: bool = True, timeout: float = 120.0) -> Probe:
    """Ask the interpreter `python` what it is and (unless `installed` is false) what it has installed: one
    subprocess."""
    command = [python, "-I", "-c", PROBE, *([] if installed else ["--no-installed"])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvironmentsError(f"{python} could not be run as a Python interpreter: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise EnvironmentsError(f"{python} could not be run as a Python interpreter (exit {done.returncode}): {tail}")
    data: dict[str, Any] = json.loads(done.stdout)
    identity = {k: str(data[k]) for k in ("version", "implementation", "cache_tag", "magic")}
    identity["executable"] = str(data["base_executable"])
    found = {canonical_name(name): version for name, version in data["installed"].items()}
    contents = {canonical_name(name): digest for name, digest in data["contents"].items()}
    return Probe(str(data["executable"]), str(data["base_executable"]), identity, data["markers"], found, contents,
                 tuple(data["damaged"]), tuple(data["local"]))  # fmt: skip


def installed_here() -> dict[str, str]:
    """The distributions this process can import (canonical name -> version; the first found wins, as imports do)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical_name(name), dist.version)
    return found


def imported_distributions(modules: Iterable[str] | None = None, *, own: Iterable[str | Path] = ()) -> dict[str, str]:
    """The installed versions (canonical name -> version) of the distributions that provide these modules (default:
    every module imported in this process); the standard library and modules of no distribution (the project's own,
    from its checkout) are left out. `own`: a side's import roots; a distribution whose metadata lies directly in
    one (the egg-info that setuptools writes into src/ at `pip install -e .`) is the project itself, not a
    dependency, and is left out too."""
    names = list(sys.modules) if modules is None else modules  # a copy: another thread may import meanwhile
    tops = {name.partition(".")[0] for name in names if name}
    providers = importlib.metadata.packages_distributions()
    roots = {Path(root).resolve() for root in own}
    found = {}
    for top in sorted(tops):
        for name in providers.get(top, ()):
            try:
                dist = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue
            if roots and Path(str(dist.locate_file(""))).resolve() in roots:
                continue
            found[canonical_name(name)] = dist.version
    return found


def check_imported(imported: Mapping[str, str], side: SideEnvironment) -> tuple[str, ...]:
    """What a worker of `side` imported that is not that side's environment: a distribution at another version, or
    one the environment does not have. Empty: the worker ran the side's environment (always, for a shared one: both
    sides run it, there is no other to mix up)."""
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
