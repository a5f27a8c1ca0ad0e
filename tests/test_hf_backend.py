"""The in-process transformers backend on the embedded models (fp32 on CPU)."""

import os
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the hf extra is not installed: pip install pytest-llmperf[hf]")

from pytest_llmperf.measure.backend import BackendError, GenerationRequest  # noqa: E402
from pytest_llmperf.backends.hf import HFBackend  # noqa: E402
from pytest_llmperf.backends.models import EMBEDDED, ModelError, make_prompt, resolve_model  # noqa: E402


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-bloom", "tiny-mixtral"])
def backend(request, model_cache):
    path = resolve_model(request.param, local_models={}, cache_dir=Path(model_cache))
    with HFBackend(path, name=request.param) as b:
        yield b


@pytest.mark.slow  # generate on each embedded model, twice: 3-30 s (torch's threads wait out a busy machine)
def test_manual_kv_cache_loop_yields_the_tokens_of_generate(backend):
    request = GenerationRequest(batch_size=2, sequence_length=24, decode_length=6, prompt=make_prompt(24))
    with warnings.catch_warnings():  # transformers' cache API as this version has it: no deprecated call
        warnings.filterwarnings("error", category=FutureWarning)
        warnings.filterwarnings("error", message=".*deprecated.*")
        sample = backend.generate(request)
    assert torch.equal(backend.last_tokens, backend.reference_generate(request))
    assert len(sample.decode_steps_ns) == 5 and sample.prefill_ns > 0
    assert sample.generated_tokens == 12 and len(sample.token_times_ns) == 2
    assert sample.token_times_ns[0][0] == sample.tokenize_ns + sample.prefill_ns


def test_knobs_apply_and_restore(backend):
    before = (torch.get_num_threads(), os.environ.get("TOKENIZERS_PARALLELISM"))
    with backend.apply_knobs({"threads": 1, "tokenizers_parallelism": True}):
        assert torch.get_num_threads() == 1 and os.environ["TOKENIZERS_PARALLELISM"] == "true"
        assert backend.describe()["threads"] == 1
    assert (torch.get_num_threads(), os.environ.get("TOKENIZERS_PARALLELISM")) == before
    with pytest.raises(BackendError, match="no knob"):
        with backend.apply_knobs({"latency_cpu": 7}):
            pass


def test_embedded_models_are_cached_and_about_20m_parameters(backend, model_cache):
    path = resolve_model(backend.name, local_models={}, cache_dir=Path(model_cache))
    assert path == backend.model_path  # built once, found again
    assert 15e6 < backend.describe()["parameters"] < 25e6


def test_unknown_model_names_the_fix(tmp_path):
    with pytest.raises(ModelError, match="--llmperf-model nope=/path"):
        resolve_model("nope", local_models={}, cache_dir=tmp_path)
    with pytest.raises(ModelError, match="no such directory"):
        resolve_model("tiny-llama", local_models={"tiny-llama": str(tmp_path / "missing")}, cache_dir=tmp_path)
    assert "mixtral-8x7b" in EMBEDDED


def test_int8_without_bitsandbytes_is_a_clear_error(model_cache):
    # bitsandbytes is a GPU path; here only the message when it is absent is checked
    try:
        import bitsandbytes  # noqa: F401
        pytest.skip("bitsandbytes is installed")
    except ImportError:
        pass
    path = resolve_model("tiny-llama", local_models={}, cache_dir=Path(model_cache))
    with pytest.raises(BackendError, match="pip install bitsandbytes"):
        HFBackend(path, dtype="int8")
