"""uv, the tool that builds the environments: found, asked its version, run.

uv reads its configuration as usual (UV_* variables, uv.toml, the side's own [tool.uv]): the user's index and
find-links settings hold. Nothing here sets UV_NO_CONFIG, and an inherited one is dropped for a build, since it would
hide the side's [tool.uv] (its find-links, its sources); VIRTUAL_ENV is dropped too, so that uv acts only on the
environment it is given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import BuildFailed, CannotBuild

#: How to get uv, for the message when it is missing.
INSTALL_UV = "install uv (pip install uv; it is on PyPI) or name it with the uv argument"
#: Variables of the controller's environment that must not reach a build.
DROPPED = ("VIRTUAL_ENV", "UV_NO_CONFIG", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")


@dataclass(frozen=True)
class Uv:
    path: str
    version: str  # e.g. "0.13.9"

    def run(
        self,
        args: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        timeout: float = 3600.0,
        what: str = "",
    ) -> subprocess.CompletedProcess[str]:
        """Run `uv ARGS` in `cwd`; BuildFailed with the end of what uv said when it fails."""
        environ = {k: v for k, v in os.environ.items() if k not in DROPPED}
        environ.update(env or {})
        command = [self.path, *args]
        try:
            done = subprocess.run(command, cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BuildFailed(f"{what or 'uv'} took more than {timeout:g} s: {' '.join(command)}") from None
        except OSError as exc:
            raise BuildFailed(f"{what or 'uv'} could not start: {exc}", fix=INSTALL_UV) from None
        if done.returncode != 0:
            said = "\n".join(f"    {line}" for line in done.stderr.strip().splitlines()[-15:])
            raise BuildFailed(
                f"{what or 'uv'} failed (exit {done.returncode}) in {cwd}: {' '.join(command[1:])}\n  uv said:\n{said}",
                fix="make it buildable here: an index reachable (or the packages in uv's cache, or find-links with "
                "the wheels), and a lock that resolves on this machine",
            )
        return done


def _bundled() -> str | None:
    """The uv binary of the `uv` Python package installed here, whether or not its bin is on PATH."""
    try:
        import uv

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError, AttributeError):
        return None


def find_uv(explicit: str | Path | None = None) -> Uv:
    """uv: `explicit`, else the one on PATH, else the uv Python package's; CannotBuild when none runs."""
    candidates = [str(explicit)] if explicit else [c for c in (shutil.which("uv"), _bundled()) if c]
    for path in candidates:
        try:
            done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        words = done.stdout.split()
        if done.returncode == 0 and len(words) >= 2 and words[0] == "uv":
            return Uv(path, words[1])
    where = f"{explicit} does not run" if explicit else "uv is not installed (not on PATH, no uv Python package)"
    raise CannotBuild(where, fix=INSTALL_UV)
