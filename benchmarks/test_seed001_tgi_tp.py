"""Seed 001 on TGI: the seed-000 experiment swept over tensor parallelism (--num-shard 1/2/4/8,
sequence length 1024), and the seed's quantization experiment: 8 shards, sequence length 100,
without quantization and with bitsandbytes. Needs the launcher (the shard count is a launcher
argument): shard counts beyond the visible GPUs are skipped with the reason; with only
--llmperf-tgi-url the sweep is skipped (an attached server's shard count cannot be changed).
"""

import os

import pytest

from pytest_llmperf.backends.tgi import seed_launcher_args
from tgi_available import require_tgi, visible_gpus

# Registered by the plugin once it imports pytest_llmperf.servers.fixtures; harmless twice.

MODEL_ID = os.environ.get("LLMPERF_TGI_MODEL_ID", "bigscience/bloomz-7b1-mt")
SIZES = {"batch_sizes": [1, 2, 4, 8, 16, 32], "decode_length": 8, "runs": 10, "warmups": 1}
TP_SEQUENCE = 1024  # seed 001 "# Tensor Parallel (TP) - N GPUs"
QUANTIZE_SEQUENCE, QUANTIZE_SHARDS = 100, 8  # seed 001 "## Sequence Length 100", under "TP - 8 GPUs"


def _start(llmperf_tgi, request, num_shard, quantize, sequence_length):
    if require_tgi(request.config):
        pytest.skip("the shard/quantize sweep starts its own servers; an attached server (--llmperf-tgi-url) "
                    "cannot change --num-shard or --quantize")
    gpus = visible_gpus()
    if num_shard > max(gpus, 1):  # one shard also runs on CPU (require_tgi allowed that explicitly)
        pytest.skip(f"--num-shard {num_shard} needs {num_shard} GPUs; {gpus} visible")
    args = seed_launcher_args(MODEL_ID, num_shard=num_shard, quantize=quantize, sequence_length=sequence_length,
                              decode_length=SIZES["decode_length"]).to_json()
    args.pop("model_id")
    return llmperf_tgi(model_id=MODEL_ID, **args)


@pytest.mark.llmperf(**SIZES, sequence_length=TP_SEQUENCE, group="seed001-tp")
@pytest.mark.parametrize("num_shard", [1, 2, 4, 8])
def test_tgi_tensor_parallel(llmperf, llmperf_tgi, request, num_shard):
    llmperf.measure(_start(llmperf_tgi, request, num_shard, None, TP_SEQUENCE))


@pytest.mark.llmperf(**SIZES, sequence_length=QUANTIZE_SEQUENCE, group="seed001-quantize")
@pytest.mark.parametrize("quantize", [None, "bitsandbytes"], ids=["no-quantization", "bitsandbytes"])
def test_tgi_quantize(llmperf, llmperf_tgi, request, quantize):
    llmperf.measure(_start(llmperf_tgi, request, QUANTIZE_SHARDS, quantize, QUANTIZE_SEQUENCE))
