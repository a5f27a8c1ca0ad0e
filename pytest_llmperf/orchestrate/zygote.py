"""The fork server's own process: import the heavy libraries both sides share once, then fork a worker per request.

A worker process spent most of its start-up importing torch and transformers (4-5 s of a 6.5 s round of a small
test; docs/notes/noise.md, "Workers forked from a server"), the same files for both sides. This process imports
them once per campaign, then forks each worker from there (orchestrate/forkserver.py is the controller's half). Only
modules installed in this interpreter's site-packages are imported here: they are identical on both sides. The
project under test (an editable install, a side's checkout, PYTHONPATH) is imported by each worker after the fork,
from its own side.

Run as a file (`runpy.run_path`), never imported as part of the package: this process must not import the
pytest-llmperf of either side. Standard library only.

Messages are JSON over a SOCK_SEQPACKET socket, descriptors beside them (SCM_RIGHTS):
    -> {"file": PATH} + [log, fds...]    PATH holds the request (a worker's environment may outgrow a datagram):
       {"argv": [...], "command": [...], "cwd": DIR, "env": {...}, "pythonpath": [...], "fd_env": {NAME: COUNT}}
       (command: the worker's whole command line, exec'd where this side shadows a module here)
    <- {"ready": [modules imported], "skipped": {module: why}}   once, first
    <- {"spawned": PID} or {"error": TEXT}                         for each request, in order
    <- {"exit": PID, "code": CODE}                                 when a worker exits (a signal: -SIGNUM)
"""

import atexit
import ctypes
import importlib
import importlib.machinery
import importlib.util
import json
import os
import select
import signal
import site
import socket
import sys
import sysconfig
import traceback
import types
import warnings
from dataclasses import dataclass

BUFFER = 1 << 16  # a message names the file that holds its request
MAX_FDS = 16
PR_SET_PDEATHSIG = 1


def shared_dirs() -> list[str]:
    """Where modules identical on both sides live: this interpreter's site-packages (and the user's, if enabled)."""
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    dirs.update(getattr(site, "getsitepackages", list)())  # absent in some old virtualenvs
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return sorted(os.path.realpath(d) + os.sep for d in dirs)


def within(path: str, shared: list[str]) -> bool:
    return os.path.realpath(path).startswith(tuple(shared))


def preload(modules: list[str]) -> tuple[list[str], dict[str, str]]:
    """Import each of `modules` that is installed in site-packages; (imported, {skipped: why})."""
    imported, skipped, shared = [], {}, shared_dirs()
    for name in modules:
        top = name.partition(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError) as exc:
            skipped[name] = f"not importable ({exc})"
            continue
        origin = spec.origin if spec is not None else None
        if origin is None:
            skipped[name] = "not installed"
        elif not within(origin, shared):
            skipped[name] = f"not from site-packages ({origin}): a side may import its own"
        else:
            try:
                importlib.import_module(name)
            except Exception as exc:
                skipped[name] = f"import failed ({type(exc).__name__}: {exc})"
            else:
                imported.append(name)
    return imported, skipped


def send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


@dataclass
class Server:
    """This process, as its forked workers see it."""

    sock: socket.socket
    wake: tuple[int, int]  # the pipe SIGCHLD writes to
    base_path: list[str]  # sys.path without its leading "": what a side's own entries go before, as PYTHONPATH does
    preloaded: set[str]  # top-level names imported here from site-packages (with what they imported)
    pid: int


def serve(sock: socket.socket, base_path: list[str], preloaded: set[str]) -> None:
    """Fork a worker per request, report each exit, until the controller closes its end."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears of every exit
    signal.set_wakeup_fd(wake_w)
    server = Server(sock, (wake_r, wake_w), base_path, preloaded, os.getpid())
    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            reap(sock)
        if sock.fileno() in ready:
            data, fds, _, _ = socket.recv_fds(sock, BUFFER, MAX_FDS)
            if not data:  # the controller is gone: its workers die with this process (PR_SET_PDEATHSIG)
                return
            request = json.loads(data)
            with open(request["file"], encoding="utf-8") as handle:  # the request itself: see the docstring
                request = json.load(handle)
            try:
                with warnings.catch_warnings():  # 3.12+: "multi-threaded, fork() may deadlock"; torch's idle threads
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError as exc:
                send(sock, {"error": f"fork failed: {exc}"})
                pid = -1
            if pid == 0:
                worker(request, fds, server)  # never returns
            for fd in fds:
                os.close(fd)
            if pid > 0:
                send(sock, {"spawned": pid})


def reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def worker(request: dict, fds: list[int], server: Server) -> None:
    """In the forked child: become the worker `python -c WORKER_MAIN ARGV...` (request["command"]) would be, in its
    side's directory; or exec that command, where the side's directory or PYTHONPATH has a module of the same name
    as one imported here (a checkout that vendors transformers must measure its own)."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != server.pid:  # the server died before the line above
            os._exit(1)
        server.sock.close()
        for fd in server.wake:
            os.close(fd)
        log, *passed = fds
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        env = dict(request["env"])
        for name, count in request["fd_env"].items():  # descriptors arrive under new numbers: name them
            env[name] = ",".join(str(fd) for fd in passed[:count])
            passed = passed[count:]
        os.chdir(request["cwd"])
        if shadowed := shadowing(server.preloaded, [os.getcwd(), *request["pythonpath"]]):
            print(f"llmperf: this side has its own {', '.join(shadowed)}: the worker starts from scratch", flush=True)
            for fd in fds[1:]:
                os.set_inheritable(fd, True)
            os.execve(request["command"][0], request["command"], env)
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = ["", *request["pythonpath"], *server.base_path]
        importlib.invalidate_caches()
        sys.argv = ["-c", *request["argv"]]
        sys.modules["__main__"] = types.ModuleType("__main__")  # as `python -c` has it: no file (multiprocessing)
        import pytest

        code = int(pytest.main())  # not console_main: deprecated in pytest 9.2 (an error under -W error)
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def shadowing(preloaded: set[str], dirs: list[str]) -> list[str]:
    """The names imported here that a module in `dirs` (the side's directory and PYTHONPATH) would shadow. A plain
    directory (a namespace package) does not: a regular package later on sys.path wins over it."""
    found = {name: importlib.machinery.PathFinder.find_spec(name, dirs) for name in preloaded}
    return sorted(name for name, spec in found.items() if spec is not None and spec.has_location)


def imported_from(shared: list[str]) -> set[str]:
    """Top-level names of the modules imported from site-packages (`shared`) in this process."""
    names = set()
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if "." not in name and origin and within(origin, shared):
            names.add(name)
    return names


def main(fd: int, modules: list[str]) -> None:
    sock = socket.socket(fileno=fd)
    base_path = [p for p in sys.path if p != ""]
    imported, skipped = preload(modules)
    send(sock, {"ready": imported, "skipped": skipped})
    serve(sock, base_path, imported_from(shared_dirs()))


if __name__ == "__main__":
    main(int(sys.argv[1]), json.loads(sys.argv[2]))
