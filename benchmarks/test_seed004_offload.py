"""Seed 004: a week of hand-tuning Fiddler (Mixtral-8x7B on a 24 GB RTX 3090) through its knobs, as tests.

The seed tuned Fiddler's own knobs, so its runs here run Fiddler's policy, `schedule="fiddler"`: each
non-resident expert where it alone is cheaper under latency_cpu / latency_gpu, the CPU and GPU experts one
after the other. Each `fiddler-*` case is one of the seed's runs: TOKENIZERS_PARALLELISM, the cost
constants latency_cpu / latency_gpu, and torch threads. Next to them, `ours-measured-costs` runs our own
policy: `makespan` with the cost model measured at start-up and corrected from the engine's own timings
while it runs (online_costs), overlapping the tiers where that is measured to pay. The reporter writes
all of them (knobs, prefill time, decode time, hit rate, tokens/s) into reports/<device>.md under
"Offload runs", so ours and Fiddler's sit in one table. Benchmarks measured apart are compared across
minutes of a shared machine, so `test_ours_vs_fiddler_interleaved` measures ours and Fiddler's default in
the same runs, side by side, and the report's "Policy pairs" gives their paired ratio with its interval.

- cpu target: the embedded tiny Mixtral (fast = slow = cpu), with 7 of its 32 experts on the fast tier,
  the seed's 56/256 share; a short generation (16 prompt tokens, 8 new). Threads: 1 for every run, and
  one thread run at 2 (this is a 2-core machine; a thread run at 1 would repeat `fiddler-cpu7-gpu1`).
- GPU targets: a Mixtral-8x7B-shaped bf16 model with random weights made on the machine, its expert
  budget sized as on a 24 GB card (device_memory_gb=24), the seed's 5-token generation. Threads: the
  seed's 16, and its thread runs at 32 and 8, each capped at the physical cores; a thread run whose
  capped count equals the default is left out (it would repeat `fiddler-cpu7-gpu1`).
"""

from typing import Any

import pytest
from every_core import every_core_marks

from pytest_llmperf.orchestrate.fixtures import SESSION_KEY
from pytest_llmperf.offload.engine import physical_cores

TINY_EXPERT_GB = 3 * 256 * 512 * 4 / 2**30  # one tiny-Mixtral expert in fp32
CPU_ENGINE = {"expert_budget_gb": 7 * TINY_EXPERT_GB}  # 7/32 experts resident, like Fiddler's 56/256
GPU_ENGINE = {"device_memory_gb": 24, "dtype": "bf16", "max_batch_size": 1, "max_seq_len": 512}

# The seed's runs in its order: (id, TOKENIZERS_PARALLELISM, latency_cpu, latency_gpu).
SEED_RUNS = [("default", False, 7, 70), ("tokpar", True, 7, 70), ("cpu1-gpu1", True, 1, 1),
             ("cpu5-gpu1", True, 5, 1), ("cpu7-gpu1", True, 7, 1), ("cpu10-gpu1", True, 10, 1)]


def thread_counts(on_gpu: bool, cores: int) -> tuple[int, list[int]]:
    """The default thread count and the thread runs' counts (the seed's 7/1 run at other counts)."""
    if not on_gpu:
        return 1, [2]  # the seed's 16 -> 1; its 8 and 32 -> 1 and 2, and 1 is the default
    default = min(16, cores)
    return default, sorted({min(n, cores) for n in (32, 8)} - {default})


def sweep(on_gpu: bool, cores: int) -> list[tuple[str, dict[str, Any]]]:
    default, others = thread_counts(on_gpu, cores)
    runs = [(f"fiddler-{name}", {"schedule": "fiddler", "tokenizers_parallelism": tokpar, "latency_cpu": cpu,
                                 "latency_gpu": gpu, "threads": default})
            for name, tokpar, cpu, gpu in SEED_RUNS]
    runs += [(f"fiddler-cpu7-gpu1-threads{n}", {"schedule": "fiddler", "tokenizers_parallelism": True,
                                                "latency_cpu": 7, "latency_gpu": 1, "threads": n}) for n in others]
    # Ours: no cost override, the start-up measurement decides, CPU and fast tier overlapped.
    runs.append(("ours-measured-costs", {"schedule": "makespan", "tokenizers_parallelism": True, "threads": default}))
    return runs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The thread counts depend on the target and the machine, so the cases are made at collection.
    if "knobs" in metafunc.fixturenames:
        runs = sweep(metafunc.config.stash[SESSION_KEY].device != "cpu", physical_cores())
        metafunc.parametrize("knobs", [pytest.param(k, id=i, marks=every_core_marks(k["threads"])) for i, k in runs])


@pytest.mark.llmperf(batch_sizes=[1], sequence_length=16, decode_length=8, group="seed004",
                     metrics=["prefill_ms", "decode_token_ms", "throughput_tokens_per_s", "hit_rate"])
def test_fiddler_knob_sweep(llmperf, llmperf_offload, knobs):
    # Started with the default thread count, so the cost model is measured with the threads it runs with.
    threads = thread_counts(llmperf.on_gpu, physical_cores())[0]
    if llmperf.on_gpu:
        engine = llmperf_offload("mixtral-8x7b", threads=threads, **GPU_ENGINE)
        llmperf.measure(engine, knobs=knobs, sequence_length=5, decode_length=5)
    else:
        engine = llmperf_offload("tiny-mixtral", threads=threads, **CPU_ENGINE)
        llmperf.measure(engine, knobs=knobs)


@pytest.mark.llmperf(batch_sizes=[1], sequence_length=16, decode_length=8, group="seed004",
                     metrics=["decode_token_ms", "pair.ratio"])
def test_ours_vs_fiddler_interleaved(llmperf, llmperf_offload):
    """Ours (`makespan`, costs measured at start-up and corrected while running) and Fiddler's policy at the
    seed's default 7/70, measured in the same process, one right after the other in every run, the order
    alternating. The report's "Policy pairs" gives their paired ratio with its 95% interval; `pair.ratio`
    (ours / Fiddler's decode tokens/s) is gated like any metric."""
    from pytest_llmperf.offload.backend import PairedPolicies

    threads = thread_counts(llmperf.on_gpu, physical_cores())[0]
    if llmperf.on_gpu:
        backend, shape = llmperf_offload("mixtral-8x7b", threads=threads, **GPU_ENGINE), {"sequence_length": 5,
                                                                                           "decode_length": 5}
    else:
        backend, shape = llmperf_offload("tiny-mixtral", threads=threads, **CPU_ENGINE), {}
    pair = PairedPolicies(backend, ("ours-measured-costs", {"schedule": "makespan"}),
                          ("fiddler-default", {"schedule": "fiddler", "latency_cpu": 7, "latency_gpu": 70}))
    llmperf.measure(pair, **shape)
