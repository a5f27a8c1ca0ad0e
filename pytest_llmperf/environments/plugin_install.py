"""This plugin in a side's environment: the controller's own pytest-llmperf and the requirements the side lacks, from
wheels of the controller's distributions, each written once into a directory named by its content."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ..files import write_atomic
from .cache import touch
from .records import EnvironmentsError

PLUGIN = "pytest-llmperf"
#: Files of an installed .dist-info that an installer wrote, not the package: left out of a repacked wheel.
_INSTALLER_FILES = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}
_WHEEL = "Wheel-Version: 1.0\nGenerator: pytest-llmperf\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def controller_version() -> str:
    return importlib.metadata.version(PLUGIN)


def _escaped(name: str) -> str:
    """A distribution name as a wheel's file name spells it."""
    return canonicalize_name(name).replace("-", "_")


def write_wheel(path: Path, files: Iterable[tuple[str, bytes]], dist_info: str) -> Path:
    """Write the wheel `path` holding `files` (archive name, bytes) and a RECORD under `dist_info`; atomic."""

    def entry(name: str) -> zipfile.ZipInfo:  # a fixed date: the same files make the same bytes (inputs.py)
        info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        return info

    def write(handle: IO[bytes]) -> None:
        with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED) as archive:
            record = []
            for name, data in files:
                archive.writestr(entry(name), data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                record.append(f"{name},sha256={digest},{len(data)}")
            archive.writestr(entry(f"{dist_info}/RECORD"), "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n")

    return write_atomic(path, write, text=False, fsync=False)  # made again from its sources if a crash loses it


def _wheel(path: Path, files: Callable[[], Iterable[tuple[str, bytes]]], dist_info: str, write: bool = True) -> Path:
    """The wheel at `path`, written unless there already, touched if it is; neither where the cache is only read."""
    if write and path.exists():
        touch(path.parent)
    elif write:
        write_wheel(path, files(), dist_info)
    return path


def plugin_wheel(into: Path, *, write: bool = True) -> tuple[str, Path]:
    """The controller's pytest-llmperf, from the package directory it imported: (its version-digest, its wheel)."""
    import pytest_llmperf

    package = Path(pytest_llmperf.__file__).parent
    try:
        dist = importlib.metadata.distribution(PLUGIN)
    except importlib.metadata.PackageNotFoundError:
        raise EnvironmentsError(f"{PLUGIN} is imported from {package} but not installed, so it cannot be installed "
                                "into the sides' environments: install it (pip install -e .)") from None  # fmt: skip
    if dist.version != pytest_llmperf.__version__:
        raise EnvironmentsError(f"the imported pytest_llmperf ({pytest_llmperf.__version__}, {package}) is not the "
                                f"installed {PLUGIN} {dist.version}: reinstall it")  # fmt: skip
    metadata = dist.read_text("METADATA") or dist.read_text("PKG-INFO")  # PKG-INFO: a source tree's .egg-info
    if metadata is None:
        raise EnvironmentsError(f"the installed {PLUGIN} {dist.version} has no metadata: reinstall it")
    files = [(f"{package.name}/{path.relative_to(package).as_posix()}", path.read_bytes())
             for path in sorted(package.rglob("*"))
             if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo")]  # fmt: skip
    info = f"{_escaped(PLUGIN)}-{dist.version}.dist-info"
    files += [(f"{info}/{name}", text.encode()) for name in ("entry_points.txt", "top_level.txt")
              if (text := dist.read_text(name)) is not None]  # fmt: skip
    files += [(f"{info}/METADATA", metadata.encode()), (f"{info}/WHEEL", _WHEEL.encode())]
    digest = hashlib.sha256(b"".join(name.encode() + b"\0" + data for name, data in files)).hexdigest()[:16]
    path = into / f"plugin-{digest}" / f"{_escaped(PLUGIN)}-{dist.version}-py3-none-any.whl"
    return f"{dist.version}-{digest}", _wheel(path, lambda: files, info, write)


def repack(dist: importlib.metadata.Distribution, into: Path) -> Path:
    """The installed `dist` as a wheel, from its RECORD (scripts aside: an installer writes them again)."""
    name, version = dist.metadata["Name"], dist.version
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if dist.files is None or (direct.get("dir_info") or {}).get("editable"):
        raise EnvironmentsError(f"{name} {version} cannot be repacked into a wheel (no RECORD, or installed editable)")
    wheel = (dist.read_text("WHEEL") or "").splitlines()
    tags = [line.split(":", 1)[1].strip() for line in wheel if line.startswith("Tag:")]
    digest = hashlib.sha256((dist.read_text("RECORD") or "").encode()).hexdigest()[:16]
    path = into / f"{_escaped(name)}-{digest}" / f"{_escaped(name)}-{version}-{tags[0] if tags else 'py3-none-any'}.whl"

    def files() -> Iterable[tuple[str, bytes]]:
        for item in dist.files or ():
            parts = item.parts
            if parts[0] == ".." or "__pycache__" in parts or item.suffix == ".pyc":
                continue
            if parts[0].endswith(".dist-info") and len(parts) == 2 and parts[1] in _INSTALLER_FILES:
                continue
            yield item.as_posix(), Path(str(dist.locate_file(item))).read_bytes()

    dist_info = next((p.parts[0] for p in dist.files if p.parts[0].endswith(".dist-info")), f"{name}.dist-info")
    return _wheel(path, files, dist_info)


def requirement_closure(name: str = PLUGIN, have: Mapping[str, str] | None = None) -> dict[str, str]:
    """The controller's installed distributions that `name` needs, transitively, without extras (canonical name ->
    version), leaving out those in `have` (and what only they need)."""
    have, environment = have or {}, {**{k: str(v) for k, v in default_environment().items()}, "extra": ""}
    found: dict[str, str] = {}
    queue = [name]
    while queue:
        dist = importlib.metadata.distribution(queue.pop())
        for text in dist.requires or ():
            requirement = Requirement(text)
            needed = canonicalize_name(requirement.name)
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            if needed in found or needed in have or needed == PLUGIN:
                continue
            try:
                found[needed] = importlib.metadata.version(needed)
            except importlib.metadata.PackageNotFoundError:
                raise EnvironmentsError(f"{dist.metadata['Name']} needs {requirement}, which is not installed here: "
                                        "reinstall pytest-llmperf") from None  # fmt: skip
            queue.append(needed)
    return found


def install(
    run: Callable[..., Any], python: Path, installed: Mapping[str, str], wheel: Path, wheels_dir: Path, flags: list[str]
) -> None:
    """Install `wheel` and the requirements that `installed` lacks into `python`'s environment with uv's `run`."""
    side_own = {name: version for name, version in installed.items() if name != PLUGIN}
    missing = requirement_closure(have=side_own)
    links, from_index = [str(wheel.parent)], []
    for name in missing:
        try:
            links.append(str(repack(importlib.metadata.distribution(name), wheels_dir).parent))
        except EnvironmentsError:  # an editable install here: from the index (or uv's cache) instead
            from_index.append(name)
    constraints = python.parent.parent / "llmperf-constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(side_own.items())))
    version = controller_version()
    args = ["pip", "install", "--python", str(python), "--reinstall-package", PLUGIN, "-c", str(constraints)]
    args += [] if from_index else ["--no-index"]
    args += [item for link in sorted(set(links)) for item in ("--find-links", link)]
    args += [*flags, f"{PLUGIN}=={version}", *(f"{name}=={v}" for name, v in sorted(missing.items()))]
    run(args, what=f"installing {PLUGIN} {version} into {python.parent.parent}")
