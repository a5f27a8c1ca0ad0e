"""Seed 000 on a TGI server: TGI's benchmark experiment (bloomz-7b1-mt, sequence length 1024,
decode length 8, batch sizes 1-32, 10 runs, 1 warmup) measured through TGI's HTTP API.

Runs where a TGI server can be had: attach with --llmperf-tgi-url=URL (ini llmperf_tgi_url), or have
text-generation-launcher on PATH (or -o llmperf_tgi_launcher=PATH) and a GPU. Otherwise skipped with the
reason. The model: --llmperf-model-id-style override via the LLMPERF_TGI_MODEL_ID environment variable
(default: the seed's bigscience/bloomz-7b1-mt).
"""

import os

import pytest

from pytest_llmperf.backends.tgi import seed_launcher_args
from tgi_available import require_tgi

# Registered by the plugin once it imports pytest_llmperf.servers.fixtures; harmless twice.

MODEL_ID = os.environ.get("LLMPERF_TGI_MODEL_ID", "bigscience/bloomz-7b1-mt")


@pytest.mark.llmperf(batch_sizes=[1, 2, 4, 8, 16, 32], sequence_length=1024, decode_length=8, runs=10, warmups=1)
def test_tgi_seed000(llmperf, llmperf_tgi, request):
    attached = require_tgi(request.config)
    if attached:
        server = llmperf_tgi(model_id=None)
    else:
        args = seed_launcher_args(MODEL_ID, num_shard=1, sequence_length=1024, decode_length=8).to_json()
        args.pop("model_id")
        server = llmperf_tgi(model_id=MODEL_ID, **args)
    llmperf.measure(server)
