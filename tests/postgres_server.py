"""A real PostgreSQL server for the history store's tests: Debian's `postgresql` package, started by the tests.

Its binaries live in /usr/lib/postgresql/<version>/bin (not on PATH). `initdb` refuses to run as root, as sessions
and CI here run: as root the server runs as the package's `postgres` user (runuser), in a temporary directory it
owns, on a free port of 127.0.0.1, and is stopped at the end of the session (also when a test failed or the run was
interrupted). Without the binaries the tests skip saying what to install, except under CI (CI set), where a missing
server fails: .ci/run installs it, and a skipped PostgreSQL test must not pass CI in silence.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

INSTALL = "apt-get install -y postgresql"


def binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@contextmanager
def postgres_server() -> Iterator[str]:
    """A running server's URL (database `postgres`, user `postgres`, trust authentication on 127.0.0.1)."""
    bin_dir = binaries()
    if bin_dir is None:
        message = f"PostgreSQL's server binaries are not installed ({INSTALL})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: CI must run the PostgreSQL tests (.ci/run installs it)", pytrace=False)
        pytest.skip(message)
    top = Path(tempfile.mkdtemp(prefix="llmperf-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(top, user.pw_uid, user.pw_gid)
    data, port = top / "data", _free_port()
    env = {**os.environ, "LC_ALL": "C.UTF-8"}

    def run(*args: str) -> None:
        subprocess.run(_as_server_user(list(args)), check=True, capture_output=True, env=env, timeout=120, cwd=top)

    started = False
    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-p {port} -k {top} -c listen_addresses=127.0.0.1 -c fsync=off"
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(top / "log"), "-w", "start")
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            subprocess.run(
                _as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                capture_output=True,
                env=env,
                timeout=60,
                cwd=top,
            )
        shutil.rmtree(top, ignore_errors=True)


def fresh_database(server_url: str, name: str) -> str:
    """A new empty database on the server; its URL."""
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}"')
        db.execute(f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + f"/{name}"
