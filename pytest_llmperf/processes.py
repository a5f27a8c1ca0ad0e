"""Processes and their trees: free ports on 127.0.0.1, a log's tail, a child that dies with its parent, and a
process-tree stop (SIGTERM, then SIGKILL after a grace period); SIGTERM turned into KeyboardInterrupt while a
campaign or a server runs.

server_process.py builds the managed server process (health wait, log, registry) on these.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

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
