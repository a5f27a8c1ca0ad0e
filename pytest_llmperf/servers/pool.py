"""What every server fixture shares: the pool that starts, reuses and stops one kind's server, and the
helpers that build a launch (command line, URL, health check) on a port."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from ..measure.backend import Backend, BackendError
from ..orchestrate.options import OPTIONS_BY_NAME
from ..processes import LOOPBACK, ProcessRegistry, ServerProcess, free_port, port_in_use, port_owner

START_TRIES = 3  # starts on fresh free ports when a server loses its port to another process

#: What `ServerPool.start` needs to start a server on a port: (argv, url, health check).
Launch = tuple[list[str], str, Callable[[], bool]]


def option(config: pytest.Config, name: str) -> Any:
    return OPTIONS_BY_NAME[name].value(config)


def http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        import httpx

        return httpx.get(url, timeout=2).status_code == 200

    return check


def http_command(command: Sequence[str], health_path: str) -> Callable[[int], Launch]:
    """A command line with `{host}`/`{port}`, as `ServerPool.start` builds it per port."""

    def build(chosen: int) -> Launch:
        base = f"http://{LOOPBACK}:{chosen}"
        return fill(command, chosen), base, http_ok(base + health_path)

    return build


def fill(command: Sequence[str], port: int) -> list[str]:
    """The command with `{host}` and `{port}` filled in (other braces, e.g. JSON, left alone)."""
    return [str(a).replace("{host}", LOOPBACK).replace("{port}", str(port)) for a in command]


def pick_port(name: str, port: int | None) -> int:
    """`port` if it is free (a clear error naming who holds it otherwise), or a free one."""
    if port is None:
        return free_port()
    if port_in_use(port):
        owner = port_owner(port)
        raise BackendError(
            f"cannot start the {name} server on {LOOPBACK}:{port}: the port is taken"
            + (f" by {owner}" if owner else "")
            + ". Stop that process or leave port= unset "
            "to get a free port"
        )
    return port


class ServerPool:
    """The servers and backends of one fixture kind; one live server at a time, reused by key."""

    def __init__(self, registry: ProcessRegistry, kind: str) -> None:
        self.registry = registry
        self.kind = kind
        self.key: Any = None
        self.backend: Backend | None = None
        self.process: ServerProcess | None = None
        self.attached: dict[Any, Backend] = {}

    def reuse(self, key: Any) -> Backend | None:
        if self.backend is not None and self.key == key and (self.process is None or self.process.alive()):
            return self.backend
        self.release()
        return None

    def adopt(self, key: Any, process: ServerProcess, make: Callable[[], Backend]) -> Backend:
        """Keep the backend made for a server just started; if making it fails, stop that server first."""
        try:
            backend = make()
        except BaseException:
            self.registry.stop(process)
            raise
        return self.keep(key, backend, process)

    def keep(self, key: Any, backend: Backend, process: ServerProcess | None) -> Backend:
        self.key, self.backend, self.process = key, backend, process
        return backend

    def start(
        self,
        name: str,
        build: Callable[[int], Launch],
        *,
        port: int | None,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
    ) -> ServerProcess:
        """Start `build(port)` and wait until it is healthy; stopped again if it is not.

        Without a fixed `port`, another process can take the free port we picked before the server
        binds it: when the server exits saying its address is in use, it is started again on a new
        free port (START_TRIES tries in all).
        """
        tries = 1 if port is not None else START_TRIES
        for attempt in range(1, tries + 1):
            argv, url, healthy = build(pick_port(name, port))
            process = self.registry.start(name, argv, url=url, env=env, log_name=self.kind)
            try:
                process.wait_ready(healthy, timeout_s)
                return process
            except BackendError as exc:
                self.registry.stop(process)
                if not (tries > 1 and process.lost_its_port()):
                    raise
                if attempt == tries:
                    raise BackendError(
                        f"{exc}\n  The port was taken before the server could bind it, on each of "
                        f"{tries} free ports tried; something on this machine grabs ports quickly. "
                        "Pass port= to choose one"
                    ) from exc
            except BaseException:
                self.registry.stop(process)
                raise
        raise AssertionError("unreachable")  # the loop returns or raises

    def release(self) -> None:
        if self.backend is not None:
            self.backend.close()
        if self.process is not None:
            self.registry.stop(self.process)
        self.key = self.backend = self.process = None

    def close(self) -> None:
        self.release()
        for backend in self.attached.values():
            backend.close()
        self.attached.clear()


def server_timeout(config: pytest.Config, timeout_s: float | None) -> float:
    return float(timeout_s if timeout_s is not None else option(config, "server_timeout"))
