"""Seed 002 on JetStream: throughput at the server's batch size, logged per target and date.

Attach to a running JetStream server with --llmperf-jetstream-url=HOST:PORT, or have the fixture
start one with LLMPERF_JETSTREAM_COMMAND (a command line with {port}; e.g. JetStream's own mock server,
"python scripts/jetstream_mock_server.py --port {port}", as tox -e jetstream does), and describe it
with the environment (seed 002's columns): LLMPERF_JETSTREAM_MODEL, _DEVICE, _DTYPE, _BATCH_SIZE,
_CACHE_LENGTH, _MAX_INPUT, _MAX_OUTPUT. Skipped without either.
"""

import os
import shlex

import pytest

from tgi_available import require_jetstream

# Registered by the plugin once it imports pytest_llmperf.servers.fixtures; harmless twice.


def env_int(name, default):
    return int(os.environ.get(name, default))


BATCH = env_int("LLMPERF_JETSTREAM_BATCH_SIZE", 128)


# runs=5, one look: 3 runs per side can never reach alpha 0.01 (smallest Mann-Whitney p 0.05).
@pytest.mark.llmperf(batch_sizes=[BATCH], sequence_length=env_int("LLMPERF_JETSTREAM_MAX_INPUT", 1024),
                     decode_length=env_int("LLMPERF_JETSTREAM_MAX_OUTPUT", 1024), runs=5, max_runs=5, warmups=1,
                     metrics=["throughput_tokens_per_s"])
def test_jetstream_seed002(llmperf, llmperf_jetstream, request):
    command = os.environ.get("LLMPERF_JETSTREAM_COMMAND", "")
    require_jetstream(request.config, command)
    server = llmperf_jetstream(
        shlex.split(command) or None,
        model=os.environ.get("LLMPERF_JETSTREAM_MODEL", "llama-3-8b"),
        device=os.environ.get("LLMPERF_JETSTREAM_DEVICE", "unknown"),
        dtype=os.environ.get("LLMPERF_JETSTREAM_DTYPE", "bfloat16"),
        server_batch_size=BATCH, cache_length=env_int("LLMPERF_JETSTREAM_CACHE_LENGTH", 2048),
        max_input_length=env_int("LLMPERF_JETSTREAM_MAX_INPUT", 1024),
        max_output_length=env_int("LLMPERF_JETSTREAM_MAX_OUTPUT", 1024), require_full_length=False)
    llmperf.measure(server)
