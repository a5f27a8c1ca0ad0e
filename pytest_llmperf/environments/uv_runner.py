"""uv, found and run: each uv in a process group of its own that dies with the controller (docs/environments.md,
"The cache"). An inherited UV_NO_CONFIG would hide the side's [tool.uv], a VIRTUAL_ENV another environment: dropped."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BuildFailed, CannotBuild

INSTALL_UV = "install uv (pip install uv; it is on PyPI) or name it with the uv argument"
DROPPED = ("VIRTUAL_ENV", "UV_NO_CONFIG", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")
#: Run by the controller's Python -I -S; argv: the controller's pid, then the command. The kernel tells it when the
#: controller dies, even by SIGKILL (PR_SET_PDEATHSIG, Linux); it then kills its group, uv's children with it.
SUPERVISOR = """\
import ctypes, os, signal, subprocess, sys
def stop(*_):
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, stop)
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    stop()
code = subprocess.call(sys.argv[2:])
sys.exit(code if code >= 0 else 128 - code)
"""
LINUX = sys.platform.startswith("linux")


@dataclass(frozen=True)
class Uv:
    path: str
    version: str  # e.g. "0.13.9"
    running: set[subprocess.Popen[str]] = field(default_factory=set, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def stop(self) -> None:
        """Kill every uv this one runs, from any thread: the controller stops waiting for them."""
        with self._lock:
            for proc in list(self.running):
                _kill_group(proc)

    def run(
        self,
        args: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        timeout: float = 3600.0,
        what: str = "",
        side: str | None = None,
        hold: Sequence[int] = (),
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run `uv ARGS` in `cwd`, inheriting `hold` (an entry's lock); BuildFailed with the command and uv's words."""
        environ = {**{k: v for k, v in os.environ.items() if k not in DROPPED}, **(env or {})}
        command, what = [self.path, *args], what or "uv"
        settings = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items()]
        shown = f"cd {shlex.quote(str(cwd))} && " + " ".join([*settings, shlex.join(command)])
        supervised = [sys.executable, "-I", "-S", "-c", SUPERVISOR, str(os.getpid())] if LINUX else []
        try:
            proc = subprocess.Popen([*supervised, *command], cwd=cwd, env=environ, text=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
                                    pass_fds=tuple(hold))  # fmt: skip
        except OSError as exc:
            raise BuildFailed(f"{what} could not start: {exc}", side=side, fix=INSTALL_UV) from None
        with self._lock:
            self.running.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc, wait=True)
            raise BuildFailed(f"{what} took more than {timeout:g} s:\n    {shown}", side=side) from None
        except BaseException:  # Ctrl-C, SIGTERM as KeyboardInterrupt: nothing of it goes on writing into the cache
            _kill_group(proc, wait=True)
            raise
        finally:
            with self._lock:
                self.running.discard(proc)
        if check and proc.returncode != 0:
            said = "\n".join(f"    {line}" for line in err.strip().splitlines()[-15:])
            raise BuildFailed(
                f"{what} failed (exit {proc.returncode}):\n    {shown}\n  uv said:\n{said}",
                side=side,
                fix="make it buildable here: an index reachable (or the packages in uv's cache, or find-links with "
                "the wheels), and a lock that resolves on this machine",
            )
        return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[str], wait: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if wait:
        proc.wait()


def find_uv(explicit: str | Path | None = None) -> Uv:
    """uv: `explicit`, else the one on PATH, else the uv Python package's; CannotBuild when none runs."""
    candidates = [str(explicit)] if explicit else [c for c in (shutil.which("uv"), _bundled()) if c]
    for path in candidates:
        try:
            words = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout.split()
        except (OSError, subprocess.SubprocessError):
            continue
        if len(words) >= 2 and words[0] == "uv":
            return Uv(path, words[1])
    where = f"{explicit} does not run" if explicit else "uv is not installed (not on PATH, no uv Python package)"
    raise CannotBuild(where, fix=INSTALL_UV)


def _bundled() -> str | None:
    """The uv binary of the `uv` Python package installed here, whether or not its bin is on PATH."""
    try:
        import uv

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError, AttributeError):
        return None
