"""Seed 004: a week of hand-tuning Fiddler (Mixtral-8x7B on a 24 GB RTX 3090) through its knobs, as tests.

Each parametrised case is one of the seed's runs: TOKENIZERS_PARALLELISM, Fiddler's cost constants
latency_cpu / latency_gpu, and torch threads, plus our engine's own measured cost model. The reporter
writes the seed's runs table (knobs, prefill time, decode time, hit rate, tokens/s) into
reports/<device>.md under "Offload runs".

- cpu target: the embedded tiny Mixtral (fast = slow = cpu), with 7 of its 32 experts on the fast tier,
  the seed's 56/256 share; a short generation (16 prompt tokens, 8 new).
- GPU targets: a Mixtral-8x7B-shaped bf16 model with random weights made on the machine, its expert
  budget sized as on a 24 GB card (device_memory_gb=24), the seed's 5-token generation.
"""

import pytest


TINY_EXPERT_GB = 3 * 256 * 512 * 4 / 2**30  # one tiny-Mixtral expert in fp32
CPU_ENGINE = {"expert_budget_gb": 7 * TINY_EXPERT_GB}  # 7/32 experts resident, like Fiddler's 56/256
GPU_ENGINE = {"device_memory_gb": 24, "dtype": "bf16", "max_batch_size": 1, "max_seq_len": 512}

# (id, knobs): the seed's runs in its order. `threads` is the seed's 16/32/8 scaled to this machine.
SWEEP = [
    ("default", {"tokenizers_parallelism": False, "latency_cpu": 7, "latency_gpu": 70}),
    ("tokpar", {"tokenizers_parallelism": True, "latency_cpu": 7, "latency_gpu": 70}),
    ("cpu1-gpu1", {"tokenizers_parallelism": True, "latency_cpu": 1, "latency_gpu": 1}),
    ("cpu5-gpu1", {"tokenizers_parallelism": True, "latency_cpu": 5, "latency_gpu": 1}),
    ("cpu7-gpu1", {"tokenizers_parallelism": True, "latency_cpu": 7, "latency_gpu": 1}),
    ("cpu10-gpu1", {"tokenizers_parallelism": True, "latency_cpu": 10, "latency_gpu": 1}),
    ("cpu7-gpu1-threads1", {"tokenizers_parallelism": True, "latency_cpu": 7, "latency_gpu": 1, "threads": 1}),
    ("cpu7-gpu1-threads2", {"tokenizers_parallelism": True, "latency_cpu": 7, "latency_gpu": 1, "threads": 2}),
    ("measured-costs", {"tokenizers_parallelism": True}),  # ours: no override, the start-up measurement decides
]


@pytest.mark.llmperf(batch_sizes=[1], sequence_length=16, decode_length=8, group="seed004",
                     metrics=["prefill_ms", "decode_token_ms", "throughput_tokens_per_s", "hit_rate"])
@pytest.mark.parametrize("knobs", [k for _, k in SWEEP], ids=[i for i, _ in SWEEP])
def test_fiddler_knob_sweep(llmperf, llmperf_offload, knobs):  # noqa: F811
    if llmperf.on_gpu:
        engine = llmperf_offload("mixtral-8x7b", **GPU_ENGINE)
        llmperf.measure(engine, knobs=knobs, sequence_length=5, decode_length=5)
    else:
        engine = llmperf_offload("tiny-mixtral", threads=1, **CPU_ENGINE)
        llmperf.measure(engine, knobs=knobs)
