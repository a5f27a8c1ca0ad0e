"""Processes and their trees: free ports on 127.0.0.1, a log's tail, a child that dies with its parent, and a
process-tree stop (SIGTERM, then SIGKILL after a grace period); SIGTERM turned into KeyboardInterrupt while a
campaign or a server runs.

On these, the managed server process (`ServerProcess`): a free port, a health wait with a deadline, a captured log,
and the process-tree stop, which also runs when the pytest session is interrupted.

What "healthy" means is a callable the caller passes (an HTTP GET, a gRPC health check). Every `ServerProcess` is
tracked by the `ProcessRegistry` that started it; the registry is owned by a session fixture, which stops everything
at teardown (also after a failed test or Ctrl-C) and, while it lives, turns SIGTERM into a clean stop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from .files import SERVER_TMP_PREFIX, claim, left_behind_line, remove_left_work_dirs
from .measure.backend import BackendError

LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 40

HealthCheck = Callable[[], bool]


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    """True when something already listens on host:port (a bind attempt fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind (tokio, http.server, grpc): a connection in TIME_WAIT from an earlier
        # server on this port does not stop them, so it must not read as taken either.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def port_owner(port: int) -> str:
    """'pid N (name)' of the process listening on `port`, when the OS tells us; '' otherwise."""
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                with contextlib.suppress(psutil.Error):
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                return f"pid {conn.pid}"
    return ""


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


#: The few lines a child runs before the real program (Linux): ask the kernel for SIGTERM when its parent dies,
#: then exec the program in this same process (same pid, same session). argv: parent pid, program path, argv.
_DEATH_SIGNAL_SHIM = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(128 + int(signal.SIGTERM))  # the parent died before the call: as if the signal had come
try:
    os.execv(sys.argv[2], sys.argv[3:])
except OSError as exc:
    sys.stderr.write(f"cannot execute {sys.argv[2]}: {exc}\\n")
    os._exit(127)
"""


def die_with_parent(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None
) -> list[str]:
    """`argv` made to get SIGTERM if pytest itself dies (even by SIGKILL): on Linux, run through a short shim
    that sets PR_SET_PDEATHSIG and execs the program; `argv` as it is elsewhere.

    Not a `preexec_fn`: with one, subprocess must fork() instead of vfork(), and fork() runs the atfork
    handlers of every library loaded here. gRPC's (the JetStream backend's channels, while their threads are
    busy) then restart gRPC's pollers in the child, whose descriptors the child closes before exec: the child
    aborted with "epoll_wait error: Bad file descriptor" or segfaulted, 89 of 300 spawns beside a streaming
    channel (tests/test_server_jetstream.py). vfork() runs no atfork handler. A program that cannot be found
    raises FileNotFoundError here, as Popen would.
    """
    argv = [str(a) for a in argv]
    if not sys.platform.startswith("linux") or not argv:
        return argv
    program = argv[0]
    if os.sep in program:
        path = program if os.path.isabs(program) else os.path.join(str(cwd or os.getcwd()), program)
        found = path if os.access(path, os.X_OK) and os.path.isfile(path) else None
    else:
        found = shutil.which(program, path=(env if env is not None else os.environ).get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or executable", program)
    return [sys.executable, "-I", "-S", "-c", _DEATH_SIGNAL_SHIM, str(os.getpid()), os.path.abspath(found), *argv]


def session_members(sid: int) -> list[psutil.Process]:
    """Processes in the session `sid` (a server started with start_new_session has sid = its pid)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != os.getpid() and os.getsid(proc.pid) == sid:
                found.append(proc)
    return found


def stop_tree(pid: int, grace_s: float = 10.0, *, session: bool = False, root: bool = True) -> list[int]:
    """SIGTERM a process and all its descendants, SIGKILL whatever is left after `grace_s`.

    Returns the pids that had to be killed. Children are listed before the parent is signalled,
    so processes the parent spawned are found even if it exits first and they get re-parented.
    With `session`, `pid` is also a session id (the process was started with start_new_session)
    and every process still in that session is stopped too: the children of a server that
    crashed, which psutil can no longer find through it. With `root=False` only those session
    members are stopped, never the process `pid` names (it was reaped; the number may be reused).
    """
    procs: list[psutil.Process] = []
    if root:
        with contextlib.suppress(psutil.NoSuchProcess):
            top = psutil.Process(pid)
            procs = [top, *top.children(recursive=True)]
    if session:  # orphans: descendants whose parent died were re-parented, but keep the session
        procs += [p for p in session_members(pid) if p.pid not in {q.pid for q in procs}]
    procs = [p for p in procs if _running(p)]
    if not procs:
        return []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    alive = [p for p in alive if _running(p)]  # a zombie has exited; its parent just has not reaped it
    # A process may have spawned more children while shutting down.
    for proc in list(alive):
        with contextlib.suppress(psutil.NoSuchProcess):
            alive.extend(c for c in proc.children(recursive=True) if c not in alive and _running(c))
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in alive]


def stop_inheriting(variable: str, prefix: str, grace_s: float = 5.0) -> list[str]:
    """Stop every process whose environment's `variable` starts with `prefix`, and its tree: what a worker started
    and left behind, in a session of its own too (an environment is inherited where a session is not). 'pid
    (command)' of each."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != os.getpid() and proc.environ().get(variable, "").startswith(prefix) and _running(proc):
                found.append((proc.pid, " ".join(proc.cmdline())[:80]))
    for pid, _ in found:
        stop_tree(pid, grace_s)
    return [f"{pid} ({command})" for pid, command in found]


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While it is active, SIGTERM (a cancelled CI job) stops like Ctrl-C: the caller's cleanup runs (worker
    processes stopped, a worktree removed). In the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
