"""The cache of built environments: one directory per key, so that a rerun, and every pull request against the same
main, reuses what an earlier job built.

The key is a digest of what defines an environment (the interpreter's identity, the side's normalized dependency
inputs, the build's flags, uv's version, the platform, the plugin installed into it). A directory is built while
its lock is held (two jobs never build one at once: the second waits, then reuses it) and is ready only once its
marker is written, last and atomically: a build that was killed leaves a directory without one, which the next
builder removes first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..files import locked, write_text_atomic

MARKER = "llmperf-env.json"
#: Wheels of what the controller runs (wheels.py), beside the environments.
WHEELS = ".wheels"


def default_env_dir() -> Path:
    """${XDG_CACHE_HOME:-~/.cache}/pytest-llmperf/envs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-llmperf" / "envs"


def key_of(parts: Mapping[str, Any]) -> str:
    """The cache key: a digest of the canonical JSON of what defines the environment."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def python_in(directory: Path) -> Path:
    """The interpreter of the environment at `directory`."""
    return directory / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def ready(directory: Path, key: str) -> dict[str, Any] | None:
    """The marker of a ready environment at `directory` built for `key`, or None (not built, half built, another)."""
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


def touch(directory: Path) -> None:
    """Note a reuse (prune keeps the newest used)."""
    with contextlib.suppress(OSError):
        os.utime(directory / MARKER)


@contextlib.contextmanager
def building(directory: Path) -> Iterator[None]:
    """Hold the lock of `directory` while the block builds or reuses it."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with locked(directory):
        yield


def discard(directory: Path) -> None:
    """Remove what a killed or stale build left (call holding the lock)."""
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.exists():
        shutil.rmtree(directory)


def prune(root: Path, keep: int, *, spare: tuple[Path, ...] = ()) -> list[Path]:
    """Remove all but the `keep` most recently used environments under `root` (and those in `spare`); each is
    removed holding its lock, so a job building or reusing it is never pulled from under. The removed paths."""
    entries = []
    for child in root.iterdir() if root.is_dir() else ():
        marker = child / MARKER
        if child.is_dir() and not child.name.startswith(".") and marker.exists():
            entries.append((marker.stat().st_mtime, child))
    entries.sort(reverse=True)
    removed = []
    for _, child in entries[keep:]:
        if any(child.samefile(s) for s in spare if s.exists()):
            continue
        with locked(child):
            discard(child)
        removed.append(child)
    return removed
