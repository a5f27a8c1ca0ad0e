"""The knob sweep that seed 004 did by hand, as parametrised tests: torch threads and TOKENIZERS_PARALLELISM."""

import pytest
from every_core import every_core_marks


@pytest.mark.llmperf(batch_sizes=[1], sequence_length=128, decode_length=8)
@pytest.mark.parametrize("tokenizers_parallelism", [False, True], ids=["tokpar-off", "tokpar-on"])
@pytest.mark.parametrize("threads", [pytest.param(n, id=f"threads{n}", marks=every_core_marks(n)) for n in (1, 2)])
def test_threads_and_tokenizer_parallelism(llmperf, llmperf_hf, threads, tokenizers_parallelism):
    backend = llmperf_hf("llama-2-7b" if llmperf.on_gpu else "tiny-llama", dtype="bf16" if llmperf.on_gpu else "fp32")
    llmperf.measure(backend, knobs={"threads": threads, "tokenizers_parallelism": tokenizers_parallelism})
