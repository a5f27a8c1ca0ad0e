"""A user's mistake with a device or a model directory: one line naming the option or path and the fix,
never torch's or transformers' traceback."""

import pytest

pytest.importorskip("transformers")
# Imported before pytester's in-process runs: a lazy first import inside one is dropped after it (test_hf_gate).
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM,  # noqa: E402,F401
                          MixtralForCausalLM, PreTrainedTokenizerFast)

from pytest_llmperf.backends.models import EMBEDDED, tokenizer_for  # noqa: E402

HF_TEST = """
import pytest

@pytest.mark.llmperf(batch_sizes=[1], runs=5, warmups=0)
def test_model(llmperf, {fixture}):
    llmperf.measure({fixture}({model!r}))
"""


@pytest.fixture
def project(pytester, monkeypatch, model_cache, addopts):
    addopts(f"--llmperf-cache-dir={model_cache}")
    pytester.makeini("[pytest]\n")
    return pytester


@pytest.fixture
def run(run):
    return run.without("--llmperf-device")


def one_line_failure(result, expected):
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert expected in text, text
    assert "Traceback" not in text and "INTERNALERROR" not in text and "site-packages" not in text


@pytest.mark.skipif("__import__('torch').cuda.is_available()", reason="needs a machine without CUDA")
@pytest.mark.parametrize(("fixture", "model"), [("llmperf_hf", "tiny-llama"), ("llmperf_offload", "tiny-mixtral")])
def test_gpu_target_without_cuda(project, run, fixture, model):
    project.makepyfile(test_model=HF_TEST.format(fixture=fixture, model=model))
    result = run("--llmperf-device=a100")
    one_line_failure(result, "--llmperf-device=a100 is a GPU target, but torch")
    result.stdout.fnmatch_lines(["*sees no CUDA device on this machine. Run it on the GPU machine, or measure "
                                 "the cpu target: --llmperf-device=cpu*"])


def test_model_directory_without_tokenizer(project, run, tmp_path):
    model_dir = tmp_path / "no-tokenizer"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(EMBEDDED["tiny-llama"]().to_json_string())
    project.makepyfile(test_model=HF_TEST.format(fixture="llmperf_hf", model=str(model_dir)))
    result = run("--llmperf-device=cpu")
    one_line_failure(result, f"llmperf_hf('{model_dir}'): cannot load a tokenizer from {model_dir}")
    result.stdout.fnmatch_lines([f"*save them there with tokenizer.save_pretrained('{model_dir}')*"])


def test_model_directory_without_weights(project, run, tmp_path):
    model_dir = tmp_path / "no-weights"
    config = EMBEDDED["tiny-llama"]()
    tokenizer_for(config.vocab_size).save_pretrained(model_dir)
    (model_dir / "config.json").write_text(config.to_json_string())
    project.makepyfile(test_model=HF_TEST.format(fixture="llmperf_hf", model=str(model_dir)))
    result = run("--llmperf-device=cpu")
    one_line_failure(result, f"cannot load the model from {model_dir}")


def test_unknown_model_name(project, run):
    project.makepyfile(test_model=HF_TEST.format(fixture="llmperf_hf", model="tiny-lama"))
    result = run("--llmperf-device=cpu")
    one_line_failure(result, "llmperf_hf('tiny-lama'): unknown model 'tiny-lama'")


def test_bad_dtype(project, run):
    project.makepyfile(test_model=HF_TEST.format(fixture="llmperf_hf", model="tiny-llama")
                       .replace("llmperf_hf('tiny-llama')", "llmperf_hf('tiny-llama', dtype='fp8')"))
    result = run("--llmperf-device=cpu")
    one_line_failure(result, "dtype 'fp8' is not one of fp32, fp16, bf16, int8")


def test_offload_bad_option_value(project, run):
    project.makepyfile(test_model=HF_TEST.format(fixture="llmperf_offload", model="tiny-mixtral")
                       .replace("llmperf_offload('tiny-mixtral')", "llmperf_offload('tiny-mixtral', schedule='fast')"))
    result = run("--llmperf-device=cpu")
    one_line_failure(result, "llmperf_offload('tiny-mixtral'): offload option schedule='fast'")
