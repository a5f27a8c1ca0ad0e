"""Wheels of what the controller runs, so that each side's environment gets the same plugin without an index.

`plugin_wheel`: this plugin, from the package directory the controller imported (an editable install too), with its
installed metadata (the pytest11 entry point). `repack`: an installed distribution (pytest, numpy, ...) back into a
wheel from its RECORD, for the plugin's requirements that a side's environment lacks. Each is written once into a
directory named by its content and reused; a wheel is written to a temporary file and renamed, so a reader never
sees half of one.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from ..files import write_atomic
from .cache import touch
from .errors import EnvironmentsError

PLUGIN = "pytest-llmperf"
#: Files of an installed .dist-info that an installer wrote (not the package's): left out of a repacked wheel.
_INSTALLER_FILES = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}


def _escaped(name: str) -> str:
    """A distribution name as a wheel's file name spells it."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    return info


def write_wheel(path: Path, files: Iterable[tuple[str, bytes]], dist_info: str) -> Path:
    """Write the wheel `path` holding `files` (archive name, bytes) and a RECORD under `dist_info`; atomic."""

    def write(handle: IO[bytes]) -> None:
        with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED) as archive:
            record = []
            for name, data in files:  # a fixed date: the same files make the same bytes (inputs.py compares them)
                archive.writestr(_entry(name), data)
                record.append(f"{name},{_record_hash(data)},{len(data)}")
            record.append(f"{dist_info}/RECORD,,")
            archive.writestr(_entry(f"{dist_info}/RECORD"), "\n".join(record) + "\n")

    return write_atomic(path, write, text=False, fsync=False)  # made again from its sources if a crash loses it


def _package_files(package: Path) -> list[tuple[str, Path]]:
    found = []
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
            found.append((f"{package.name}/{path.relative_to(package).as_posix()}", path))
    return found


def plugin_files() -> tuple[importlib.metadata.Distribution, list[tuple[str, bytes]]]:
    """The controller's pytest-llmperf: its distribution and the files of its wheel (package, then metadata)."""
    import pytest_llmperf

    try:
        dist = importlib.metadata.distribution(PLUGIN)
    except importlib.metadata.PackageNotFoundError:
        raise EnvironmentsError(
            f"{PLUGIN} is imported from {Path(pytest_llmperf.__file__).parent} but not installed, so it cannot be "
            "installed into the sides' environments: install it (pip install -e .)"
        ) from None
    if dist.version != pytest_llmperf.__version__:
        raise EnvironmentsError(
            f"the imported pytest_llmperf ({pytest_llmperf.__version__}, {Path(pytest_llmperf.__file__).parent}) is "
            f"not the installed {PLUGIN} {dist.version}: reinstall it"
        )
    package = Path(pytest_llmperf.__file__).parent
    files = [(name, path.read_bytes()) for name, path in _package_files(package)]
    dist_info = f"{_escaped(PLUGIN)}-{dist.version}.dist-info"
    metadata = dist.read_text("METADATA") or dist.read_text("PKG-INFO")  # PKG-INFO: a source tree's .egg-info
    if metadata is None:
        raise EnvironmentsError(f"the installed {PLUGIN} {dist.version} has no metadata: reinstall it")
    files.append((f"{dist_info}/METADATA", metadata.encode()))
    for name in ("entry_points.txt", "top_level.txt"):
        text = dist.read_text(name)
        if text is not None:
            files.append((f"{dist_info}/{name}", text.encode()))
    wheel = "Wheel-Version: 1.0\nGenerator: pytest-llmperf\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files.append((f"{dist_info}/WHEEL", wheel.encode()))
    return dist, files


def plugin_wheel(into: Path, *, write: bool = True) -> tuple[str, Path]:
    """The controller's pytest-llmperf as a wheel under `into`, written once per content (unless not `write`: a
    cache that is only read): (its version and a digest of its content, the wheel)."""
    dist, files = plugin_files()
    digest = hashlib.sha256(b"".join(name.encode() + b"\0" + data for name, data in files)).hexdigest()[:16]
    path = into / f"plugin-{digest}" / f"{_escaped(PLUGIN)}-{dist.version}-py3-none-any.whl"
    if write and not path.exists():
        write_wheel(path, files, f"{_escaped(PLUGIN)}-{dist.version}.dist-info")
    elif write:
        touch(path.parent)
    return f"{dist.version}-{digest}", path


def repack(dist: importlib.metadata.Distribution, into: Path) -> Path:
    """The installed distribution `dist` as a wheel under `into` (its files from RECORD, scripts aside: an installer
    writes them again from entry_points.txt); EnvironmentsError for one that cannot be repacked (no RECORD, an
    editable install)."""
    name, version = dist.metadata["Name"], dist.version
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if dist.files is None or (direct.get("dir_info") or {}).get("editable"):
        raise EnvironmentsError(f"{name} {version} cannot be repacked into a wheel (no RECORD, or installed editable)")
    wheel = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    record = dist.read_text("RECORD") or ""
    digest = hashlib.sha256(record.encode()).hexdigest()[:16]
    path = into / f"{_escaped(name)}-{digest}" / f"{_escaped(name)}-{version}-{tags[0] if tags else 'py3-none-any'}.whl"
    if path.exists():
        touch(path.parent)
        return path

    def files() -> Iterable[tuple[str, bytes]]:
        for item in dist.files or ():
            parts = item.parts
            if parts[0] == ".." or "__pycache__" in parts or item.suffix == ".pyc":
                continue
            if parts[0].endswith(".dist-info") and len(parts) == 2 and parts[1] in _INSTALLER_FILES:
                continue
            yield item.as_posix(), Path(str(dist.locate_file(item))).read_bytes()

    dist_info = next((p.parts[0] for p in dist.files if p.parts[0].endswith(".dist-info")), f"{name}.dist-info")
    return write_wheel(path, files(), dist_info)
