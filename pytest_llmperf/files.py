"""Writing files so that nothing is lost: the one atomic write and the one lock of the plugin.

`write_text_atomic` (and `write_atomic`, for bytes or a writer such as a zip file) writes a temporary file in the
target's directory and `os.replace`s it, so a reader or a crash sees the old file or the new one, never half of
one. It writes through a symbolic link (the link stays a link), keeps an existing file's mode (a new file gets the
umask's default, as `open` would give it), and removes its temporary file whatever interrupts it (Ctrl-C included).
It refuses
(`WriteRefused`) a link to nothing (it would create a file wherever the link points, outside the project)
and a read-only file (someone protected it: replacing it in its writable directory would be silent).

`locked` serialises read-modify-write cycles between processes (two `--llmperf-update` runs of one
module at once): an exclusive `fcntl.flock` on a lock file beside the target, removed again on release.
Holding it, it removes the temporary files of the target that a writer killed mid-write (SIGKILL: no
handler runs) left behind, and yields their paths, so the caller can say so.

The temporary directories of a controlling pytest process, and what one that was killed left behind: a campaign's
work directory (worker logs and results), an A/B comparison's worktree and a started server's TMPDIR
(processes.py) are removed when the pytest process that made them ends, also on Ctrl-C and SIGTERM. SIGKILL runs
no cleanup: the directory stays. Each is claimed with an owner file (the process id and its start time); the next
run removes the directories whose owner is gone, and says so (a server's, in the next server's log). A directory
without an owner file is left alone: whose it is cannot be told.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import psutil

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


class WriteRefused(OSError):
    """A file that must not be written as asked (a link to nothing, a read-only file); the message says the fix."""


def _temporary_pattern(name: str) -> re.Pattern[str]:
    """The names of write_text_atomic's temporary files for `name` (tempfile.mkstemp's 8 random characters)."""
    return re.compile(rf"\.{re.escape(name)}\.[A-Za-z0-9_]{{8}}\.tmp")


def check_writable(path: Path | str) -> Path:
    """The file that writing `path` would replace (through a symlink: its target), or WriteRefused saying why
    it must not be written."""
    path = Path(path)
    target = Path(os.path.realpath(path))
    if path.is_symlink() and not target.exists():
        raise WriteRefused(
            f"{path} is a symbolic link to {os.readlink(path)}, which does not exist; writing through "
            "it would create that file. Fix the link or remove it"
        )
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        return target
    if not mode & 0o222 or not os.access(target, os.W_OK):
        raise WriteRefused(
            f"{target} is read-only (mode {mode:04o}), so it was not replaced. Make it writable "
            f"(chmod u+w {target}) to let pytest-llmperf write it"
        )
    return target


def write_atomic(
    path: Path | str, write: Callable[[IO[Any]], object], *, text: bool = True, fsync: bool = True
) -> Path:
    """Replace the file at `path` (through a symlink: its target) with what `write` writes to the handle it is given
    (text, UTF-8, or bytes); returns the file written."""
    target = check_writable(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = _umask_mode()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w" if text else "wb", encoding="utf-8" if text else None) as handle:
            write(handle)
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


def write_text_atomic(path: Path | str, text: str, *, fsync: bool = True) -> Path:
    """Replace the file at `path` (through a symlink: its target) with `text`; returns the file written."""
    return write_atomic(path, lambda handle: handle.write(text), fsync=fsync)


def remove_left_temporaries(path: Path | str) -> list[Path]:
    """Remove the temporary files of `path` that an interrupted writer left (call holding its lock)."""
    target = Path(os.path.realpath(path))
    pattern = _temporary_pattern(target.name)
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(target.parent):
            if pattern.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def locked(path: Path | str) -> Iterator[list[Path]]:
    """Hold an exclusive lock for `path` (its lock file `.<name>.lock` beside it) while the block runs; yields the
    temporary files of `path` a killed writer had left, removed (every writer of `path` holds this lock)."""
    target = Path(os.path.realpath(path))
    lock_path = target.parent / f".{target.name}.lock"
    if fcntl is None:
        yield []
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
        yield remove_left_temporaries(target)
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


def strict_json(document: Any, *, indent: int | None = 1) -> str:
    """A JSON file's text: sorted keys, indented (`indent=None`: on one line, by json's C encoder, several times
    faster for a large document), NaN and infinities as null (strict readers refuse them)."""
    import json

    return json.dumps(finite_or_null(document), indent=indent, sort_keys=True, default=str, allow_nan=False) + "\n"


OWNER = "owner.pid"
WORKERS_PREFIX = "llmperf-workers-"
SERVER_TMP_PREFIX = "llmperf-server-"


def claim(directory: Path) -> None:
    """Mark `directory` as this process's."""
    with contextlib.suppress(psutil.Error):
        (directory / OWNER).write_text(f"{os.getpid()} {psutil.Process().create_time():.3f}")
        return
    (directory / OWNER).write_text(str(os.getpid()))


def owner_gone(directory: Path) -> int | None:
    """The process id that claimed `directory` when that process is gone (its number may be taken again by
    another: its start time tells them apart); None while it runs, or when the directory has no owner file."""
    try:
        fields = (directory / OWNER).read_text().split()
        pid = int(fields[0])
        started = float(fields[1]) if len(fields) > 1 else None
    except (OSError, ValueError, IndexError):
        return None
    try:
        process = psutil.Process(pid)
        if started is None or abs(process.create_time() - started) < 0.01:
            return None
    except psutil.NoSuchProcess:
        return pid
    except psutil.Error:
        return None
    return pid


def remove_left_work_dirs(base: Path | None = None, prefix: str = WORKERS_PREFIX) -> list[tuple[Path, int]]:
    """Remove the directories named `prefix`... under `base` (the temp dir) whose owner was killed; (dir, pid)."""
    base = Path(base or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            if not entry.name.startswith(prefix) or not entry.is_dir() or entry.is_symlink():
                continue
            pid = owner_gone(entry)
            if pid is not None:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append((entry, pid))
    return removed


def left_behind_line(what: str, removed: list[tuple[Path, int]]) -> str:
    """The line that says what a killed run left and this one removed."""
    listed = ", ".join(f"{path} (pid {pid})" for path, pid in removed)
    return f"llmperf: removed {len(removed)} {what} that a killed pytest-llmperf run left: {listed}"
