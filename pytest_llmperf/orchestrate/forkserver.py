"""The controller's half of the fork server (zygote.py is the server's): start it once per campaign, have it fork
the workers, hear when they exit.

A worker of a small test spent most of its round importing torch and transformers (docs/notes/noise.md, "Workers
forked from a server"); forked from a process that has imported them, it starts in a fraction of that. The server
imports only what is installed in site-packages, which both sides share; each worker imports its side's project
itself after the fork, in its side's directory, with its side's PYTHONPATH and environment. A forked worker is
otherwise the worker `python -c WORKER_MAIN ...` would be: its own process, session and log, its own descriptors
for the turns (passed over the socket), stopped with its tree like any other. `-o llmperf_worker_start=exec` starts
every worker from scratch instead (a campaign also falls back to that when the server cannot start: it says so).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..measure.memory import steady_malloc_env
from ..processes import die_with_parent, stop_tree, tail

#: What the server always imports before it forks: the workers are pytest.
BASE_PRELOAD = ("pytest",)
#: And where a due test builds a torch model (a plugin fixture below, or torch already imported here, by a conftest or
#: a test module): the libraries whose import made most of such a worker's start-up. transformers' model classes
#: load lazily, so their shared machinery is named.
TORCH_PRELOAD = (
    "numpy",
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.generation",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
)
TORCH_FIXTURES = frozenset({"llmperf_hf", "llmperf_offload"})
ZYGOTE = Path(__file__).with_name("zygote.py")
#: Runs the server file by path: not as part of the package, whose copy on either side it must not import.
SERVER_MAIN = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"
#: Seconds the server may take to import PRELOAD (a fresh environment compiles torch's files first).
START_TIMEOUT_S = 300.0
BUFFER = 1 << 16


class ForkServerError(RuntimeError):
    """The server could not start, or stopped answering; the message holds its log tail."""


class ForkedProcess:
    """A worker forked by the server: the part of subprocess.Popen the manager uses (pid, args, poll, wait)."""

    def __init__(self, server: ForkServer, pid: int, args: Sequence[str]) -> None:
        self.server = server
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump(0)
        return self.returncode

    def wait(self, timeout: float | None = None, clock: Callable[[], float] = time.monotonic) -> int:
        deadline = None if timeout is None else clock() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - clock()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.server.pump(left)
        return self.returncode


class ForkServer:
    """The running server: `spawn` a worker, `close` when the campaign ends."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, log: Path) -> None:
        self.proc = proc
        self.sock = sock
        self.log = log
        self.imported: list[str] = []
        self.skipped: dict[str, str] = {}
        self.children: dict[int, ForkedProcess] = {}
        self.exits: dict[int, int] = {}  # exits heard before their spawn's answer was read
        self.answers: list[dict[str, Any]] = []
        self.requests = 0  # requests sent so far (each in a file of its own)

    @classmethod
    def start(
        cls, work_dir: Path, env: Mapping[str, str], modules: Sequence[str], python: str = sys.executable
    ) -> ForkServer:
        """Start the server of the environment of `python` in `work_dir` with `env` (what every worker shares: the
        allocator's settings are read when a process starts); it imports `modules` while the caller goes on
        (`ready` waits for it). One server per environment: a worker forked from it runs what it imported."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log = work_dir / ("forkserver.log" if python == sys.executable else f"forkserver-{abs(hash(python))}.log")
        argv = [python, "-c", SERVER_MAIN, str(ZYGOTE), str(theirs.fileno()), json.dumps(list(modules))]
        with open(log, "wb") as handle:
            try:
                proc = subprocess.Popen(
                    die_with_parent(argv, env=env, cwd=work_dir),
                    cwd=work_dir,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,
                )
            finally:
                theirs.close()
        return cls(proc, ours, log)

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> ForkServer:
        """Wait until the server has imported its modules; ForkServerError if it failed or took too long."""
        answer = self._answer(timeout_s)
        if "ready" not in answer:
            raise ForkServerError(f"the fork server answered {answer!r}")
        self.imported, self.skipped = answer["ready"], answer.get("skipped", {})
        return self

    def spawn(
        self,
        command: Sequence[str],
        args: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        pythonpath: Sequence[str],
        log_fd: int,
        fds_env: Mapping[str, Sequence[int]],
    ) -> ForkedProcess:
        """Fork a worker: `command` (`python -c WORKER_MAIN ARGS...`, exec'd instead where the side has a module of
        the same name as one the server imported) in `cwd` with `env`, its output to `log_fd`, and the descriptors
        of `fds_env` under new numbers, each variable naming them comma-separated."""
        fds = [log_fd, *(fd for group in fds_env.values() for fd in group)]
        request = {
            "argv": list(args),
            "command": list(command),
            "cwd": str(cwd),
            "env": dict(env),
            "pythonpath": list(pythonpath),
            "fd_env": {name: len(group) for name, group in fds_env.items()},
        }
        # The request goes in a file, the socket carries its path: a worker's environment can be larger than one
        # datagram (a conftest that sets large variables; SOCK_SEQPACKET refuses it as "Message too long").
        self.requests += 1
        path = self.log.parent / f"forkserver-request-{self.requests}.json"
        path.write_text(json.dumps(request), encoding="utf-8")
        try:
            socket.send_fds(self.sock, [json.dumps({"file": str(path)}).encode()], fds)
        except OSError as exc:
            raise ForkServerError(self._died(f"took no request ({exc})")) from None
        answer = self._answer(30.0)
        path.unlink(missing_ok=True)
        if "spawned" not in answer:
            raise ForkServerError(f"the fork server could not start a worker: {answer.get('error', answer)}")
        pid = int(answer["spawned"])
        child = ForkedProcess(self, pid, command)
        if pid in self.exits:
            child.returncode = self.exits.pop(pid)
        self.children[pid] = child
        return child

    def pump(self, timeout: float | None) -> None:
        """Read what the server said within `timeout` seconds (None: until it says something); exits are
        given to their processes, answers kept for `_answer`."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        while ready:
            data = self.sock.recv(BUFFER)
            if not data:
                self._lost()
                return
            message = json.loads(data)
            if "exit" in message:
                pid, code = int(message["exit"]), int(message["code"])
                if pid in self.children:
                    self.children[pid].returncode = code
                else:
                    self.exits[pid] = code
            else:
                self.answers.append(message)
            ready, _, _ = select.select([self.sock], [], [], 0)

    def _answer(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
        deadline = clock() + timeout_s
        while not self.answers:
            left = deadline - clock()
            if left <= 0:
                raise ForkServerError(self._died(f"did not answer within {timeout_s:g} s"))
            if self.proc.poll() is not None:
                raise ForkServerError(self._died(f"exited with code {self.proc.returncode}"))
            self.pump(min(left, 0.5))
        return self.answers.pop(0)

    def _lost(self) -> None:
        """The server is gone: its workers got SIGTERM with it (PR_SET_PDEATHSIG); stop what is left of them."""
        for child in self.children.values():
            if child.returncode is None:
                stop_tree(child.pid, grace_s=5, session=True)
                child.returncode = -signal.SIGTERM
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            raise ForkServerError(self._died("closed its socket")) from None
        raise ForkServerError(self._died(f"exited with code {code}"))

    def _died(self, what: str) -> str:
        return f"the fork server (llmperf_worker_start=fork) {what}; its log ends with:\n{tail(self.log)}"

    def close(self) -> None:
        """Stop the server and any worker of it still running (Ctrl-C; a campaign that ends has none)."""
        for child in self.children.values():
            if child.returncode is None:
                stop_tree(child.pid, grace_s=5, session=True)
        self.sock.close()
        stop_tree(self.proc.pid, grace_s=5, session=True)
        self.proc.wait()


def preload_for(
    fixturenames: Iterable[Iterable[str]], modules: Iterable[ModuleType], loaded: Mapping[str, ModuleType]
) -> list[str]:
    """What the server imports for tests using `fixturenames` (one list per test), defined in `modules` (their test
    modules and conftests), `loaded` being sys.modules: a job of server backends, or of a user's own Backend that
    does not use torch, does not pay for importing it. Torch is wanted where a test uses a plugin fixture that
    builds a torch model, or where one of `modules`, or a module one of them takes names from, refers to torch."""
    torch = any(TORCH_FIXTURES.intersection(names) for names in fixturenames)
    for module in modules:
        if torch:
            break
        names = vars(module)
        sources = {_source(value) for value in names.values()} - {module.__name__, ""}
        torch = _refers_to_torch(names) or any(s in loaded and _refers_to_torch(vars(loaded[s])) for s in sources)
    return [*BASE_PRELOAD, *(TORCH_PRELOAD if torch else ())]


def _source(value: object) -> str:
    """The module a name was taken from: a module's own name, else the module that defined the object."""
    try:
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
    except Exception:
        return ""
    return name if isinstance(name, str) else ""


def _refers_to_torch(names: Mapping[str, object]) -> bool:
    return any(_source(value).partition(".")[0] == "torch" for value in list(names.values()))


def server_env(malloc: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment the server starts with: the controller's, unbuffered, with the allocator's settings
    (llmperf_malloc; glibc reads them when a process starts, so the forked workers have them from the server)."""
    env = {**environ, "PYTHONUNBUFFERED": "1"}
    if malloc == "steady":
        env.update(steady_malloc_env())
    return env
