"""The `llmperf_tgi` fixture: start `text-generation-launcher` or attach to a TGI server."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from ..extras import TGI, require
from ..measure.backend import BackendError
from ..orchestrate.options import OPTIONS_BY_NAME
from ..processes import LOOPBACK, ProcessRegistry, free_port
from .pool import Launch, ServerPool, http_ok, option, server_timeout

if TYPE_CHECKING:
    from ..backends.tgi import TGIBackend


@pytest.fixture(scope="session")
def llmperf_tgi(
    request: pytest.FixtureRequest, llmperf_servers: ProcessRegistry
) -> Iterator[Callable[..., TGIBackend]]:
    """Start `text-generation-launcher` (or attach with --llmperf-tgi-url) and return a TGI backend.

    `llmperf_tgi(model_id="bigscience/bloomz-7b1-mt", num_shard=2, quantize="bitsandbytes",
    max_input_tokens=1000, max_total_tokens=1512, max_batch_total_tokens=32000, ...)`; any
    `TGILauncherArgs` field is a keyword, `extra_args=[...]` are appended to the command line.
    `deterministic=True` says greedy decoding on this server repeats itself, so changed outputs fail.
    """
    config = request.config
    pool = ServerPool(llmperf_servers, "tgi")

    def start(
        model_id: str | None = None,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        require_full_length: bool = True,
        deterministic: bool = False,
        timeout_s: float | None = None,
        **launcher: Any,
    ) -> TGIBackend:
        require("llmperf_tgi", TGI)
        from ..backends.tgi import TGIBackend, TGILauncherArgs

        url = option(config, "tgi_url")
        if url:
            key: tuple[Any, ...] = ("attach", url, require_full_length, deterministic)
            if key not in pool.attached:
                pool.attached[key] = TGIBackend(
                    url,
                    require_full_length=require_full_length,
                    deterministic=deterministic,
                    source=OPTIONS_BY_NAME["tgi_url"].cli,
                )
            backend = pool.attached[key]
            assert isinstance(backend, TGIBackend)
            served = backend.info.get("model_id")
            if model_id is not None and served != model_id:
                raise BackendError(
                    f"the TGI server at {url} (from --llmperf-tgi-url) serves {served!r}, this test "
                    f"asks for {model_id!r}. Attach to a server with that model, or unset the URL"
                )
            return backend
        if model_id is None:
            raise BackendError("llmperf_tgi needs model_id=... to start a server (or --llmperf-tgi-url to attach)")
        if "extra_args" in launcher:
            launcher["extra_args"] = tuple(launcher["extra_args"])
        args = TGILauncherArgs(model_id=model_id, **launcher)
        key = (args, tuple(sorted((env or {}).items())), require_full_length, deterministic)
        reused = pool.reuse(key)
        if reused is not None:
            assert isinstance(reused, TGIBackend)
            return reused
        program = option(config, "tgi_launcher")
        found = shutil.which(program)
        if found is None:
            raise BackendError(
                f"TGI: {program!r} not found (llmperf_tgi_launcher). Install "
                "text-generation-inference, point the ini key llmperf_tgi_launcher at the launcher, or attach to "
                "a running server with --llmperf-tgi-url=URL"
            )

        def build(chosen: int) -> Launch:
            base = f"http://{LOOPBACK}:{chosen}"
            uds = llmperf_servers.log_dir / f"tgi-{llmperf_servers.started + 1}-shard"
            argv = args.argv(
                found,
                host=LOOPBACK,
                port=chosen,
                prometheus_port=free_port(),
                shard_uds_path=str(uds),
                master_port=free_port(),
            )
            return argv, base, http_ok(f"{base}/health")

        process = pool.start("TGI", build, port=port, timeout_s=server_timeout(config, timeout_s), env=env)

        def make() -> TGIBackend:  # the backend for the server just started
            return TGIBackend(
                process.url,
                launcher_args=args,
                process=process,
                require_full_length=require_full_length,
                deterministic=deterministic,
            )

        return pool.adopt(key, process, make)  # type: ignore[return-value]

    try:
        yield start
    finally:
        pool.close()
