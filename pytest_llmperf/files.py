"""Writing files so that nothing is lost: the one atomic write and the one lock of the plugin.

`write_text_atomic` writes a temporary file in the target's directory and `os.replace`s it, so a reader
or a crash sees the old file or the new one, never half of one. It writes through a symbolic link (the
link stays a link), keeps an existing file's mode (a new file gets the umask's default, as `open` would
give it), and removes its temporary file whatever interrupts it (Ctrl-C included).

`locked` serialises read-modify-write cycles between processes (two `--llmperf-update` runs of one
module at once): an exclusive `fcntl.flock` on a lock file beside the target, removed again on release.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no flock; writes stay atomic, concurrent updates are not serialised
    fcntl = None  # type: ignore[assignment]


def _umask_mode() -> int:
    """The mode a new file gets from `open`: 0o666 less the umask (read without changing it where /proc has it)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    mask = os.umask(0o022)  # no /proc: read it by setting it, then put it back
    os.umask(mask)
    return 0o666 & ~mask


def write_text_atomic(path: Path | str, text: str, *, fsync: bool = True) -> Path:
    """Replace the file at `path` (through a symlink: its target) with `text`; returns the file written."""
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = _umask_mode()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


@contextlib.contextmanager
def locked(path: Path | str) -> Iterator[None]:
    """Hold an exclusive lock for `path` (its lock file `.<name>.lock` beside it) while the block runs."""
    target = Path(os.path.realpath(path))
    lock_path = target.parent / f".{target.name}.lock"
    if fcntl is None:
        yield
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # The holder before us removes the lock file on release: locked an unlinked file, try again.
            try:
                same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)  # closing releases the flock


def finite_or_null(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None, for strict JSON (`allow_nan=False`)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value
