"""Temporary directories of a controlling pytest process, and what one that was killed left behind.

A campaign's work directory (worker logs and results), an A/B comparison's worktree and a started server's TMPDIR
(server_process.py) are removed when the pytest process that made them ends, also on Ctrl-C and SIGTERM. SIGKILL runs
no cleanup: the directory stays. Each is claimed with an owner file (the process id and its start time); the next
run removes the directories whose owner is gone, and says so (a server's, in the next server's log). A directory
without an owner file is left alone: whose it is cannot be told.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import psutil

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
