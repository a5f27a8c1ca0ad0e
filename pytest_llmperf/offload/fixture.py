"""The `llmperf_offload` fixture: start the offload engine for a model and options, as a backend.

    def test_x(llmperf, llmperf_offload):
        llmperf.measure(llmperf_offload("tiny-mixtral", expert_budget_gb=0.011))

Keyword arguments are `OffloadOptions` fields; unset ones come from the `llmperf_offload_*` ini keys,
then the engine's defaults. Engines are kept for the session (start-up loads the model and measures
the cost model) and all are closed at teardown, also when a test failed. On CUDA, starting another
engine closes the previous one first, so two large models never share the device. An embedded
GPU-sized name (`mixtral-8x7b`) on a GPU target is made in memory with random weights: its checkpoint
would not fit on the disk of the machines it runs on.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..extras import HF, require
from ..orchestrate.fixtures import SESSION_KEY, fail_unless_cuda
from ..orchestrate.options import OPTIONS_BY_NAME
from ..warning import current_test_file, warn_at

if TYPE_CHECKING:
    from .backend import OffloadBackend

#: OffloadOptions fields that have a session-wide option (ini `llmperf_offload_<name>`).
SESSION_OPTIONS = ("expert_budget_gb", "device_memory_gb", "popularity")


def session_defaults(config: pytest.Config) -> dict[str, Any]:
    values = {name: OPTIONS_BY_NAME["offload_" + name].value(config) for name in SESSION_OPTIONS}
    return {k: v for k, v in values.items() if v is not None}


def _relocated(caught: list[warnings.WarningMessage], test_file: Path | None) -> None:
    """The engine's start-up warnings (a cost model measured on a busy machine, costs.py) again, located at the
    test that started it rather than at the engine's own code; others as they were raised."""
    from .costs import CostWarning

    for w in caught:
        if issubclass(w.category, CostWarning) and test_file is not None:
            warn_at(f"llmperf_offload: {w.message}", test_file, 0, category=w.category)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


@pytest.fixture(scope="session")
def llmperf_offload(request: pytest.FixtureRequest) -> Iterator[Callable[..., OffloadBackend]]:
    """Start our MoE offload engine: `llmperf_offload("tiny-mixtral", expert_budget_gb=..., ...)`."""
    session = request.config.stash[SESSION_KEY]
    defaults = session_defaults(request.config)
    started: dict[tuple[Any, ...], OffloadBackend] = {}

    def start(model: str = "tiny-mixtral", **options: Any) -> OffloadBackend:
        require("llmperf_offload", HF)
        from ..backends.models import ModelError
        from ..measure.backend import BackendError
        from .experts import OffloadError

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                backend = _start(model, options)
        except (BackendError, ModelError, OffloadError) as exc:  # a user's mistake: one line, no traceback
            pytest.fail(f"llmperf_offload({model!r}): {exc}", pytrace=False)
        _relocated(caught, current_test_file(request.config.rootpath))
        return backend

    def _start(model: str, options: dict[str, Any]) -> OffloadBackend:
        from ..backends.models import CPU_SIZED, EMBEDDED, tokenizer_for
        from .backend import OffloadBackend
        from .engine import OffloadEngine, OffloadOptions

        fields = {f.name for f in dataclasses.fields(OffloadOptions)}
        unknown = sorted(set(options) - fields)
        if unknown:
            raise pytest.UsageError(
                f"llmperf_offload got unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}"
            )
        merged = {**defaults, **options}
        merged.setdefault("fast_device", "cpu" if session.device == "cpu" else "cuda")
        merged.setdefault("dtype", "fp32" if merged["fast_device"] == "cpu" else "bf16")
        fail_unless_cuda(session, str(merged["fast_device"]), f"llmperf_offload({model!r})")
        opts = OffloadOptions(**merged)
        key = (model, tuple(sorted(dataclasses.asdict(opts).items())))
        if key in started:
            return started[key]
        if opts.fast_device.startswith("cuda"):
            for other in list(started):
                started.pop(other).close()
        mapped = model in session.settings.model
        if model in EMBEDDED and model not in CPU_SIZED and not mapped and opts.fast_device.startswith("cuda"):
            config = EMBEDDED[model]()
            engine = OffloadEngine.from_config(config, tokenizer_for(config.vocab_size), opts, name=model)
            backend = OffloadBackend.from_engine(engine, name=model)
        else:
            path = session.resolve_model(model, build_device="cpu")
            backend = OffloadBackend(path, opts, name=model)
        started[key] = backend
        return backend

    try:
        yield start
    finally:
        for backend in started.values():
            backend.close()
