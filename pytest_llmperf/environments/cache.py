"""The cache of built environments: one directory per key, built holding its lock, ready once its marker is written
(last, atomically), reused by later jobs, pruned when unused (docs/environments.md, "The cache")."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..files import write_text_atomic

try:
    import fcntl
except ImportError:  # Windows: no lock (nor a uv that could outlive its build there)
    fcntl = None  # type: ignore[assignment]

MARKER = "llmperf-env.json"
#: Wheels of what the controller runs (plugin_install.py), beside the environments.
WHEELS = ".wheels"
#: An entry (or wheel) no job used for this long is removed by the next job that builds one: rebuilt from uv's warm
#: cache it costs seconds (docs/environments.md), kept it fills a runner's disk.
UNUSED_DAYS = 14


def default_env_dir() -> Path:
    """${XDG_CACHE_HOME:-~/.cache}/pytest-llmperf/envs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-llmperf" / "envs"


def key_of(parts: Mapping[str, Any]) -> str:
    """A digest of the canonical JSON of what defines the environment (build.key_parts)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def python_in(directory: Path) -> Path:
    """The interpreter of the environment at `directory`."""
    return directory / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def writable(root: Path) -> bool:
    """Whether this job can build into the cache at `root` (made if missing)."""
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
    return os.access(root, os.W_OK | os.X_OK)


def ready(directory: Path, key: str) -> dict[str, Any] | None:
    """The marker of the ready environment at `directory` built for `key`, or None."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("key") != key or not python_in(directory).exists():
        return None
    return marker


def mark_ready(directory: Path, key: str, record: Mapping[str, Any]) -> None:
    """Write the marker: the last step of a build."""
    write_text_atomic(directory / MARKER, json.dumps({"key": key, "built_at": time.time(), **record}, indent=1))


def touch(path: Path) -> None:
    """Note a reuse of an entry or a wheel (prune removes what no job used for long)."""
    with contextlib.suppress(OSError):
        os.utime(path / MARKER if (path / MARKER).exists() else path)


@contextlib.contextmanager
def entry_lock(directory: Path, *, wait: bool = True) -> Iterator[int | None]:
    """Hold the lock of the entry `directory` (`.<name>.lock` beside it); yields its descriptor, for a builder's uv to
    inherit (None, not waiting, where another holds it). The file stays: a process that inherited it may hold it."""
    fd, locked = os.open(directory.parent / f".{directory.name}.lock", os.O_RDWR | os.O_CREAT, 0o666), True
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                locked = False
        yield fd if locked else None
    finally:
        os.close(fd)  # the last holder's close releases the flock


def discard(directory: Path) -> None:
    """Remove an entry (call holding its lock)."""
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.exists():
        shutil.rmtree(directory)


def _used(path: Path) -> float:
    """When an entry was last built or reused (its marker's time; what a killed build left: its own), or a wheel."""
    try:
        return (path / MARKER if (path / MARKER).exists() else path).stat().st_mtime
    except FileNotFoundError:  # removed meanwhile (another job pruning)
        return math.inf


def prune(root: Path, *, days: float = UNUSED_DAYS, now: float | None = None) -> list[Path]:
    """Remove (and return) what no job used for `days`; an entry that a job builds or reuses meanwhile stays."""
    cutoff = (time.time() if now is None else now) - days * 86400
    wheels = sorted((root / WHEELS).iterdir()) if (root / WHEELS).is_dir() else []
    removed = [path for path in wheels if _used(path) < cutoff]  # a build touches the wheels it uses first
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir() or _used(entry) >= cutoff:
            continue
        with entry_lock(entry, wait=False) as fd:
            if fd is not None and _used(entry) < cutoff:  # not reused (nor removed) while this looked
                discard(entry)
                removed.append(entry)
    return removed
