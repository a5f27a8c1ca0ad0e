"""A managed server process: free port on 127.0.0.1, health wait with a deadline, captured log, and a
process-tree stop (processes.py) that also runs when the pytest session is interrupted.

What "healthy" means is a callable the caller passes (an HTTP GET, a gRPC health check). Every `ServerProcess` is
tracked by the `ProcessRegistry` that started it; the registry is owned by a session fixture, which stops everything
at teardown (also after a failed test or Ctrl-C) and, while it lives, turns SIGTERM into a clean stop.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from .leftovers import SERVER_TMP_PREFIX, claim, left_behind_line, remove_left_work_dirs
from .measure.backend import BackendError
from .processes import LOG_TAIL_LINES, HealthCheck, die_with_parent, stop_tree, tail

ADDRESS_IN_USE = re.compile(r"EADDRINUSE|address already in use|os error 98|errno 98", re.IGNORECASE)


@dataclass
class ServerProcess:
    """One server started from an argv. Use `ProcessRegistry.start` to make one."""

    name: str  # e.g. "TGI", "vLLM": used in every error message
    argv: list[str]
    url: str
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    grace_s: float = 10.0
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    killed: list[int] = field(default_factory=list)  # pids that needed SIGKILL at stop
    tmp_dir: Path | None = None  # its TMPDIR, removed at stop (vLLM leaves its distributed-init file there)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def exited_within(self, seconds: float) -> bool:
        """True if the process has exited or exits within `seconds` (a crash closes its sockets a
        moment before the process can be reaped, so a connection error may come first)."""
        if self.popen is None:
            return False
        try:
            self.popen.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)

    def lost_its_port(self) -> bool:
        """True when the server has exited and its log says its address was in use (EADDRINUSE)."""
        return not self.alive() and ADDRESS_IN_USE.search(self.log_tail()) is not None

    def describe_failure(self, what: str, *, stopped_by_us: bool = False) -> str:
        """An error text naming the server, its URL, the command, the log, and the log's tail. A server we
        stopped has the exit code of our signal, which says nothing about it: then none is shown."""
        code = self.popen.poll() if self.popen and not stopped_by_us else None
        status = f" (exit code {code})" if code is not None else ""
        last = self.log_tail()
        return (
            f"{self.name} server at {self.url} {what}{status}.\n"
            f"  command: {' '.join(self.argv)}\n"
            f"  log: {self.log_path}\n"
            + (f"  last lines of the log:\n{_indent(last)}" if last else "  the log is empty")
        )

    def check_alive(self) -> None:
        """Raise BackendError with the log tail if the server has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise BackendError(self.describe_failure("has exited"))

    def wait_ready(self, healthy: HealthCheck, timeout_s: float, poll_s: float = 0.2) -> float:
        """Poll `healthy()` until it is true; return the seconds it took.

        Raises BackendError (and stops the process) if the process exits first or the deadline
        passes; the message carries the log's tail and how to give more time.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise BackendError(self.describe_failure("exited before it became healthy"))
            with contextlib.suppress(Exception):
                if healthy():
                    return time.monotonic() - self.started_at
            if time.monotonic() >= deadline:
                self.stop()
                raise BackendError(
                    self.describe_failure(
                        f"was not healthy after {timeout_s:g} s (the health deadline), so it was stopped. If it needs "
                        f"longer to load, raise the ini key llmperf_server_timeout",
                        stopped_by_us=True,
                    )
                )
            time.sleep(poll_s)

    def stop(self) -> None:
        """Stop the server and every process it started; safe to call twice."""
        if self.popen is None:
            return
        pid = self.popen.pid
        if self.popen.returncode is None:
            # Not reaped (running, or a zombie only we can reap): the pid is still this server's.
            self.killed = stop_tree(pid, self.grace_s, session=True)
        elif not psutil.pid_exists(pid):
            # Reaped: never signal the pid itself, another process may get the number. Its orphaned
            # children are still stopped: Linux reuses no pid while a live process has it as its
            # session id, so whatever is in that session is ours.
            self.killed = stop_tree(pid, self.grace_s, session=True, root=False)
        else:
            # Reaped and the number is taken again: then no process of ours is left in that session.
            self.killed = []
        with contextlib.suppress(Exception):
            self.popen.wait(timeout=5)
        self.remove_tmp_dir()

    def remove_tmp_dir(self) -> None:
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


class ProcessRegistry:
    """The servers a pytest session started. Owned by a session fixture; `stop_all()` at teardown.

    While `handle_signals()` is active, SIGTERM (and SIGHUP) stop every server and then raise
    KeyboardInterrupt, so pytest tears down and reports the session as interrupted.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.processes: list[ServerProcess] = []
        self.started = 0  # numbers the logs: a server started after another was stopped gets its own

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        url: str,
        env: Mapping[str, str] | None = None,
        log_name: str | None = None,
        grace_s: float = 10.0,
        cwd: str | Path | None = None,
    ) -> ServerProcess:
        """Start `argv` with stdout and stderr captured to a log file; it is stopped by `stop_all`. Unless `env`
        names a TMPDIR, the server gets a temporary directory of its own, removed when it stops: what a server
        leaves in its temp directory (vLLM: a `vllm_dist_<hex>` file per start) does not outlive it."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stem = log_name or name.lower()
        self.started += 1
        log_path = self.log_dir / f"{stem}-{self.started}.log"
        full_env = {**os.environ, **(env or {})}
        tmp_dir, left = (None, "") if "TMPDIR" in (env or {}) else self._tmp_dir(stem)
        if tmp_dir is not None:
            full_env["TMPDIR"] = str(tmp_dir)
        proc = ServerProcess(
            name=name,
            argv=[str(a) for a in argv],
            url=url,
            log_path=log_path,
            env=dict(env or {}),
            grace_s=grace_s,
            tmp_dir=tmp_dir,
        )
        with open(log_path, "wb") as log:
            log.write(f"$ {' '.join(proc.argv)}\n{left}".encode())
            log.flush()
            try:
                proc.popen = subprocess.Popen(
                    die_with_parent(proc.argv, env=full_env, cwd=cwd),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=full_env,
                    cwd=cwd,
                    start_new_session=True,
                )  # Ctrl-C reaches pytest only; we stop the server
            except OSError as exc:
                proc.remove_tmp_dir()
                raise BackendError(
                    f"cannot start the {name} server: {exc}.\n  command: {' '.join(proc.argv)}\n"
                    f"  Is the program installed and on PATH?"
                ) from exc
        proc.started_at = time.monotonic()
        self.processes.append(proc)
        return proc

    @staticmethod
    def _tmp_dir(stem: str) -> tuple[Path, str]:
        """A TMPDIR of the server's own, claimed by this process, and a line for the server's log naming those a
        killed pytest left, which are removed first (SIGKILL runs no cleanup)."""
        left = remove_left_work_dirs(prefix=SERVER_TMP_PREFIX)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f"{SERVER_TMP_PREFIX}{stem}-"))
        claim(tmp_dir)
        return tmp_dir, (left_behind_line("server temp directories", left) + "\n" if left else "")

    def stop(self, proc: ServerProcess) -> None:
        proc.stop()
        if proc in self.processes:
            self.processes.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()

    @contextlib.contextmanager
    def handle_signals(self) -> Iterator[None]:
        """Stop all servers on SIGTERM/SIGHUP, then interrupt pytest (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous: dict[signal.Signals, Any] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop_all()
            raise KeyboardInterrupt(f"llmperf: received {signal.Signals(signum).name}; servers stopped")

        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, on_signal)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
