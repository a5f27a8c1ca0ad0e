"""Servers in the report: seed 000's latency and throughput rows from token arrivals, and seed
001's sweep grid with one labelled column per shard count / quantization."""

from __future__ import annotations

import pytest

from pytest_llmperf.measure import metrics
from pytest_llmperf.report import markdown as report
from pytest_llmperf.measure.records import BatchResult, BenchmarkResult, RunSample

MS = 1_000_000
SCENARIO = {"sequence_length": 16, "decode_length": 3, "runs": 1, "warmups": 0, "knobs": {}}


def server_sample() -> RunSample:
    # two concurrent requests: first tokens at 10 and 20 ms, last at 15 and 21 ms
    return RunSample(2, [[10 * MS, 12 * MS, 15 * MS], [20 * MS, 21 * MS]], 21 * MS, generated_tokens=5)


def test_server_values_give_seed_000s_rows():
    values = metrics.run_values(server_sample())
    assert values["first_to_last_token_ms"] == pytest.approx((5 + 1) / 2)  # per request, then the mean
    assert values["ttft_tokens_per_s"] == pytest.approx(2 / 0.015)  # batch / mean TTFT (15 ms)
    assert values["itl_tokens_per_s"] == pytest.approx(2 / 0.002)  # batch / ITL (2 ms)
    for name in ("first_to_last_token_ms", "ttft_tokens_per_s", "itl_tokens_per_s"):
        assert metrics.METRICS[name].definition


def test_backends_with_a_prefill_split_keep_their_own_rows():
    split = RunSample(1, [[10 * MS, 12 * MS]], 12 * MS, prefill_ns=10 * MS, decode_steps_ns=[2 * MS])
    values = metrics.run_values(split)
    assert "decode_total_ms" in values
    assert not {"first_to_last_token_ms", "ttft_tokens_per_s", "itl_tokens_per_s"} & set(values)


def result(name: str, backend: dict, group: str | None = None) -> BenchmarkResult:
    return BenchmarkResult(key=name, nodeid=f"t.py::{name}", module="t.py", scenario=SCENARIO, backend=backend,
                           batches=[BatchResult(2, samples=[server_sample()])], group=group)


def step_rows(section: str, index: int) -> list[list[str]]:
    """The first cells of each row of the section's `index`-th Step table (0 latency, 1 throughput)
    that starts a step."""
    tables = [t for t in section.split("\n\n") if t.startswith("| Step")]
    assert len(tables) == 2
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in tables[index].splitlines()[2:]]
    return [r for r in rows if r[0]]


def test_server_section_has_seed_000s_shape_with_honest_labels():
    section = report.benchmark_section(result("test_tgi", {"backend": "tgi", "model": "m", "dtype": "auto"}))
    latency = step_rows(section, 0)
    assert [r[0] for r in latency] == ["Time to first token", "Inter-token latency", "Time per output token",
                                       "Decode (total)", "End to end"]
    assert latency[3][2] == "3.00 ms"  # Decode (total) average
    throughput = step_rows(section, 1)
    assert [r[0] for r in throughput] == ["Prefill (batch / TTFT)", "Decode (batch / ITL)",
                                          "End to end (tokens / E2E)"]
    assert throughput[1][2] == "1000.00 tokens/secs"


def test_sweep_grid_columns_name_the_shard_count_and_quantization():
    members = [result(f"test_tp[{n}]", {"backend": "tgi", "model": "bloomz", "dtype": "auto",
                                        "variant": f"num_shard={n} quantize={q}"}, group="seed001")
               for n, q in ((1, "none"), (8, "none"), (8, "bitsandbytes"))]
    grid = report.grid_sections(members)[0]
    header = grid.split("tokens/sec | msec/token\n")[1].splitlines()[0]
    columns = [c.strip() for c in header.strip("|").split("|")][1:]
    assert columns == ["bloomz auto num_shard=1 quantize=none", "bloomz auto num_shard=8 quantize=none",
                       "bloomz auto num_shard=8 quantize=bitsandbytes"]
