"""Seed 002's dated throughput log."""

from __future__ import annotations

import json

import pytest

from pytest_llmperf.measure.records import BatchResult, BenchmarkResult, RunSample
from pytest_llmperf.report.throughput_log import (ThroughputRow, append_row, append_rows, log_paths, read_log,
                                                  render_table)
from pytest_llmperf.report.throughput_log import rows_from_result

ROW = ThroughputRow("2024-04-24", "TPU v5e-8", "bfloat16", 128, 2048, 1024, 1024, 8249.4)


def test_render_matches_seed_002_layout():
    text = render_table([ROW, ThroughputRow("2024-04-24", "TPU v5e-8", "int8", 256, 2048, 1024, 1024, 10873)])
    lines = text.splitlines()
    assert lines[0] == ("Date | Device | dtype | batch size | cache length | max input length | max output length | "
                        "throughput (token/s)")
    assert set(lines[1].replace(" | ", "")) == {"-"}
    assert lines[2] == "2024-04-24 | TPU v5e-8 | bfloat16 | 128 | 2048 | 1024 | 1024 | 8249"
    assert lines[3].endswith("| 10873")


def test_append_grows_the_log_per_target_and_keeps_order(tmp_path):
    append_row(tmp_path, "cpu", "Llama 3 - 8B", ROW)
    later = ThroughputRow("2024-05-10", "cpu", "float32", 4, None, 32, 8, 12.0)
    md, js = append_rows(tmp_path, "cpu", "Llama 3 - 8B", [later])
    append_row(tmp_path, "cpu", "Gemma - 2B", later)
    assert (md, js) == log_paths(tmp_path, "cpu")
    log = read_log(js)
    assert list(log) == ["Llama 3 - 8B", "Gemma - 2B"] and log["Llama 3 - 8B"] == [ROW, later]
    text = md.read_text()
    assert text.index("## Llama 3 - 8B") < text.index("2024-04-24") < text.index("2024-05-10") < text.index("## Gemma")
    assert "2024-05-10 | cpu | float32 | 4 |  | 32 | 8 | 12" in text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_unreadable_or_foreign_log_is_refused(tmp_path):
    _, js = log_paths(tmp_path, "cpu")
    js.write_text("{nope")
    with pytest.raises(ValueError, match="not readable JSON.*fix or remove it"):
        append_row(tmp_path, "cpu", "x", ROW)
    js.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(ValueError, match="schema_version 99"):
        read_log(js)


def test_rows_from_a_result_take_the_median_throughput():
    def sample(e2e_ms):
        return RunSample(batch_size=2, token_times_ns=[[1], [1]], end_to_end_ns=int(e2e_ms * 1e6), generated_tokens=20)

    result = BenchmarkResult(
        key="t", nodeid="m::t", module="m", scenario={"sequence_length": 16, "decode_length": 10},
        backend={"device": "cpu", "dtype": "float32", "cache_length": 64},
        batches=[BatchResult(2, samples=[sample(100), sample(200), sample(400)]), BatchResult(4, error="boom")])
    rows = rows_from_result(result, "2026-01-02")
    assert rows == [ThroughputRow("2026-01-02", "cpu", "float32", 2, 64, 16, 10, 100.0)]  # 20 tokens / 0.2 s
