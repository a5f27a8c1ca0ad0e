"""The `llmperf_jetstream` fixture: start a JetStream server from a command line or attach to one."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from ..extras import JETSTREAM, require
from ..measure.backend import BackendError
from ..orchestrate.options import OPTIONS_BY_NAME
from ..processes import LOOPBACK, ProcessRegistry
from .pool import Launch, ServerPool, fill, option, server_timeout

if TYPE_CHECKING:
    from ..backends.jetstream import JetStreamBackend


@pytest.fixture(scope="session")
def llmperf_jetstream(
    request: pytest.FixtureRequest, llmperf_servers: ProcessRegistry
) -> Iterator[Callable[..., JetStreamBackend]]:
    """Start a JetStream server from a command line (or attach with --llmperf-jetstream-url).

    `llmperf_jetstream(["python", "run_server.py", "--port", "{port}", ...], model="llama-3-8b",
    device="TPU v5e-8", dtype="bfloat16", server_batch_size=128, cache_length=2048,
    max_input_length=1024, max_output_length=1024)`: the seed-002 columns are recorded as given.
    Readiness is the Orchestrator's HealthCheck (`is_live`).
    """
    config = request.config
    pool = ServerPool(llmperf_servers, "jetstream")

    def start(
        command: Sequence[str] | None = None,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        **backend_kwargs: Any,
    ) -> JetStreamBackend:
        require("llmperf_jetstream", JETSTREAM)
        from ..backends.jetstream import JetStreamBackend
        from ..backends.jetstream import health_check as jetstream_health

        target = option(config, "jetstream_url")
        if target:
            key: tuple[Any, ...] = ("attach", target, tuple(sorted((k, str(v)) for k, v in backend_kwargs.items())))
            if key not in pool.attached:
                pool.attached[key] = JetStreamBackend(
                    target, source=OPTIONS_BY_NAME["jetstream_url"].cli, **backend_kwargs
                )
            backend = pool.attached[key]
            assert isinstance(backend, JetStreamBackend)
            return backend
        if not command:
            raise BackendError(
                "llmperf_jetstream needs a command to start the JetStream server, or "
                "--llmperf-jetstream-url=HOST:PORT to attach to a running one"
            )
        key = (
            tuple(command),
            tuple(sorted((env or {}).items())),
            tuple(sorted((k, str(v)) for k, v in backend_kwargs.items())),
        )
        reused = pool.reuse(key)
        if reused is not None:
            assert isinstance(reused, JetStreamBackend)
            return reused

        def build(chosen: int) -> Launch:
            addr = f"{LOOPBACK}:{chosen}"

            def healthy() -> bool:
                with contextlib.suppress(Exception):
                    return jetstream_health(addr, timeout_s=1.0)
                return False

            return fill(command, chosen), f"grpc://{addr}", healthy

        process = pool.start("JetStream", build, port=port, timeout_s=server_timeout(config, timeout_s), env=env)

        def make() -> JetStreamBackend:  # the backend for the server just started
            return JetStreamBackend(process.url, process=process, **backend_kwargs)

        return pool.adopt(key, process, make)  # type: ignore[return-value]

    try:
        yield start
    finally:
        pool.close()
