"""Seed 000: TGI's benchmark experiment (prefill and decode over a batch sweep) on in-process models.

cpu target: the embedded ~20M-parameter BLOOM and Llama in fp32 at CPU-friendly sizes.
GPU targets: bloomz-7b1-mt and Llama-2-7B shapes in bf16 at the seed's sizes (sequence length
1024, decode length 8, batch sizes 1-32); pass real weights with --llmperf-model NAME=PATH.
"""

import pytest

# One torch thread on the cpu target: with 2 threads on this shared 2-core machine, one test's timings
# moved up to 3.1x between sessions of unchanged code, with 1 thread at most 1.32x
# (docs/notes/noise.md, "What moved the timings of unchanged code, and what did not").
CPU_SIZES = {"batch_sizes": [1, 2, 4], "sequence_length": 128, "decode_length": 8, "knobs": {"threads": 1}}
GPU_SIZES = {"batch_sizes": [1, 2, 4, 8, 16, 32], "sequence_length": 1024, "decode_length": 8}
MODELS = {"bloom": ("tiny-bloom", "bloomz-7b1-mt"), "llama": ("tiny-llama", "llama-2-7b")}


# Runs per worker process: the default (1 warmup and 3 runs in each of --llmperf-processes workers, each reduced
# to its median); the processes, not the runs, are what the gate compares (docs/notes/noise.md,
# "Real jobs on this VM").
@pytest.mark.parametrize("family", sorted(MODELS))
def test_prefill_decode(llmperf, llmperf_hf, family):
    cpu_model, gpu_model = MODELS[family]
    if llmperf.on_gpu:
        llmperf.measure(llmperf_hf(gpu_model, dtype="bf16"), **GPU_SIZES)
    else:
        llmperf.measure(llmperf_hf(cpu_model, dtype="fp32"), **CPU_SIZES)
