"""Fixtures that start in-process backends. Each owns its backends and closes them at teardown.

Light on purpose (the plugin imports it): a backend and its libraries are imported when the fixture
is used, after `extras.require` has checked they are installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ..extras import HF, require
from .session import SESSION_KEY, LLMPerfSession

if TYPE_CHECKING:
    from ..backends.hf import HFBackend
    from .benchmark import Benchmark


def fail_unless_cuda(session: LLMPerfSession, device: str, what: str) -> None:
    """A GPU target on a machine without CUDA: one line naming the option and the fix, not torch's traceback."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        from ..backends.hf import cuda_missing

        origin = (
            f"--llmperf-device={session.device} is a GPU target"
            if session.device != "cpu"
            else f"{what} asks for {device}"
        )
        pytest.fail(cuda_missing(origin, torch), pytrace=False)


@pytest.fixture
def llmperf(request: pytest.FixtureRequest) -> Benchmark:
    """Measure a backend with this test's scenario and gate it against the baseline: `llmperf.measure(backend)`."""
    session = request.config.stash[SESSION_KEY]
    if session.recorder is not None:  # a worker process (plugin.py decided it at configure time)
        from .benchmark import WorkerBenchmark

        return WorkerBenchmark(session, request.node, session.recorder)
    from .benchmark import LocalBenchmark

    return LocalBenchmark(session, request.node)


@pytest.fixture(scope="session")
def llmperf_hf(request: pytest.FixtureRequest) -> Iterator[Callable[..., HFBackend]]:
    """Start an in-process transformers model: `llmperf_hf("tiny-llama", dtype="fp32")`.

    The model is an embedded name, a name mapped with --llmperf-model, or a local directory. Loaded
    models are kept for the session (loading is slow), except on CUDA, where loading another model
    frees the previous one first. All are closed at the end of the session.
    """
    session = request.config.stash[SESSION_KEY]
    loaded: dict[tuple[Any, ...], HFBackend] = {}

    def start(
        model: str = "tiny-llama", *, dtype: str = "fp32", device: str | None = None, **model_kwargs: Any
    ) -> HFBackend:
        require("llmperf_hf", HF)
        from ..backends.hf import HFBackend
        from ..backends.models import ModelError
        from ..measure.backend import BackendError

        device = device or ("cpu" if session.device == "cpu" else "cuda")
        key = (model, dtype, device, tuple(sorted(model_kwargs.items())))
        if key not in loaded:
            if device.startswith("cuda"):
                for other in [k for k in loaded if k[2].startswith("cuda")]:
                    loaded.pop(other).close()
            fail_unless_cuda(session, device, f"llmperf_hf({model!r})")
            try:
                path = session.resolve_model(model, build_device=device)
                loaded[key] = HFBackend(path, name=model, dtype=dtype, device=device, model_kwargs=model_kwargs)
            except (BackendError, ModelError) as exc:  # a user's mistake: one line, no traceback
                pytest.fail(f"llmperf_hf({model!r}): {exc}", pytrace=False)
        return loaded[key]

    try:
        yield start
    finally:
        for backend in loaded.values():
            backend.close()
