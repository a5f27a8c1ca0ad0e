"""The cost model (fit, overrides, start-up microbenchmark) and placement (budget, ranking, profile)."""

import json
import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from transformers import MixtralConfig  # noqa: E402

from pytest_llmperf.offload.costs import CostModel, LinearFit, fixed_costs, measure_costs  # noqa: E402
from pytest_llmperf.offload.placement import (GiB, PlacementError, Reserve, compute_reserve, place,  # noqa: E402
                                              plan_budget, profile_ranking, read_profile, round_robin_ranking,
                                              write_profile)

np = pytest.importorskip("numpy")


def test_linear_fit_recovers_the_line_and_never_goes_negative():
    fit = LinearFit.fit([1, 2, 4, 8], [1.5 + 0.25 * n for n in (1, 2, 4, 8)])
    assert fit.a_ms == pytest.approx(1.5) and fit.b_ms == pytest.approx(0.25)
    through_origin = LinearFit.fit([1, 2, 4], [0.1, 0.5, 1.3])  # would give a negative intercept
    assert through_origin.a_ms == 0 and through_origin.b_ms > 0
    flat = LinearFit.fit([1, 2, 4], [3.0, 2.0, 1.0])  # decreasing: noise, keep a constant
    assert flat.b_ms == 0 and flat.a_ms == pytest.approx(2.0)
    with pytest.raises(ValueError, match="two distinct"):
        LinearFit.fit([4, 4], [1.0, 2.0])


def test_overrides_replace_the_measured_costs_like_fiddler():
    measured = CostModel(cpu=LinearFit(1.0, 2.0), gpu=LinearFit(0.5, 0.1), h2d_bytes_per_s=1e9, expert_bytes=10**6)
    assert measured.cpu_ms(3) == pytest.approx(7.0)
    assert measured.fetch_ms(3) == pytest.approx(1.0 + 0.5 + 0.3)  # 1 MB at 1 GB/s, then the expert
    assert measured.resident_ms(3) == pytest.approx(0.8)
    fiddler = measured.with_overrides(latency_cpu=7, latency_gpu=70)
    assert (fiddler.cpu_ms(3), fiddler.fetch_ms(3), fiddler.resident_ms(3)) == (21, 70, 0)
    assert fiddler.with_overrides().cpu_ms(3) == pytest.approx(7.0)  # back to measured
    with pytest.raises(ValueError, match="latency_cpu"):
        measured.with_overrides(latency_cpu=-1)
    assert fixed_costs(7, 70).summary()["latency_gpu"] == 70


def test_measure_costs_on_this_machine_gives_a_usable_model():
    gu, dn = torch.randn(2 * 64, 32) * 0.02, torch.randn(32, 64) * 0.02
    costs = measure_costs(slow_weights=(gu, dn), fast_device="cpu", act=torch.nn.functional.silu,
                          token_counts=(1, 4, 16), rounds=3)
    assert costs.expert_bytes == (gu.numel() + dn.numel()) * 4
    assert costs.cpu.a_ms >= 0 and costs.cpu.b_ms >= 0 and costs.gpu.a_ms >= 0 and costs.gpu.b_ms >= 0
    assert len(costs.cpu.measured_ms) == 3 and all(v > 0 for v in costs.cpu.measured_ms)
    assert costs.h2d_bytes_per_s > 0 and math.isfinite(costs.fetch_copy_ms())


def _reserve(total=0):
    return Reserve(kv_cache_bytes=total, activation_bytes=0, staging_bytes=0)


def test_budget_is_the_smaller_of_user_budget_and_free_memory_minus_reserve():
    mb = 2**20
    b = plan_budget(total_experts=32, expert_bytes=10 * mb, free_bytes=200 * mb, reserve=_reserve(45 * mb),
                    user_budget_bytes=None)
    assert (b.n_experts, b.limited_by) == (15, "free memory")  # (200-45)/10
    b = plan_budget(total_experts=32, expert_bytes=10 * mb, free_bytes=200 * mb, reserve=_reserve(45 * mb),
                    user_budget_bytes=35 * mb)
    assert (b.n_experts, b.limited_by) == (3, "user budget")
    b = plan_budget(total_experts=4, expert_bytes=10 * mb, free_bytes=200 * mb, reserve=_reserve(0),
                    user_budget_bytes=None)
    assert (b.n_experts, b.limited_by) == (4, "all experts")
    b = plan_budget(total_experts=4, expert_bytes=10 * mb, free_bytes=10 * mb, reserve=_reserve(20 * mb),
                    user_budget_bytes=None)
    assert b.n_experts == 0 and b.budget_bytes == 0
    with pytest.raises(PlacementError, match="expert_budget_gb"):
        plan_budget(total_experts=4, expert_bytes=1, free_bytes=1, reserve=_reserve(), user_budget_bytes=-1)


def test_reserve_grows_with_batch_and_sequence_and_counts_the_kv_cache_exactly():
    cfg = MixtralConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    r = compute_reserve(cfg, max_batch_size=2, max_seq_len=100, dtype_bytes=2, expert_bytes=1000)
    assert r.kv_cache_bytes == 2 * 2 * 2 * 16 * 200 * 2  # k and v, layers, kv heads, head dim, tokens, bytes
    assert r.staging_bytes == 2000
    bigger = compute_reserve(cfg, max_batch_size=4, max_seq_len=100, dtype_bytes=2, expert_bytes=1000)
    assert bigger.total > r.total


def test_round_robin_spreads_any_budget_evenly_over_layers():
    ranking = round_robin_ranking(4, 8)
    resident = place(ranking, 6, 4, 8)
    assert [sum(r) for r in resident] == [2, 2, 1, 1]
    assert sorted(ranking) == [(l, e) for l in range(4) for e in range(8)]


def test_profile_round_trip_and_ranking(tmp_path):
    counts = np.zeros((2, 4))
    counts[1, 3], counts[0, 2], counts[1, 0] = 50, 20, 20
    path = write_profile(tmp_path / "p.json", counts, model="m", tokens=45)
    loaded = read_profile(path, num_layers=2, num_experts=4)
    assert (loaded == counts).all()
    ranking = profile_ranking(loaded)
    assert ranking[:3] == [(1, 3), (1, 0), (0, 2)]  # a tie keeps round-robin order: (1,0) comes before (0,2)
    resident = place(ranking, 2, 2, 4)
    assert resident == [[False] * 4, [True, False, False, True]]


def test_bad_profiles_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(PlacementError, match="does not exist.*calibrate"):
        read_profile(tmp_path / "none.json", num_layers=2, num_experts=4)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlacementError, match="bad.json is not readable JSON"):
        read_profile(bad, num_layers=2, num_experts=4)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(PlacementError, match="is not a pytest-llmperf/expert-popularity"):
        read_profile(bad, num_layers=2, num_experts=4)
    good = write_profile(tmp_path / "g.json", np.ones((3, 4)), model="m", tokens=1)
    with pytest.raises(PlacementError, match=r"shape \(3, 4\).*\(2, 4\)"):
        read_profile(good, num_layers=2, num_experts=4)
    assert GiB == 2**30


def test_start_up_rounds_are_interleaved_in_rotating_order_and_the_estimate_ignores_a_busy_minority():
    from pytest_llmperf.offload.costs import _interleaved_ms, robust_ms

    order = []
    points = [(lambda i=i: order.append(i), lambda: None) for i in range(3)]
    ticks = iter(range(1000))
    samples = _interleaved_ms(points, 3, timer=lambda: next(ticks) / 1000.0)
    assert samples.shape == (3, 3)
    assert order == [0, 1, 2, 0, 1, 2, 1, 2, 0, 2, 0, 1]  # warm-up, then each round starts one later
    quiet = np.full((20, 2), 1.0)
    quiet[::3] = 100.0  # a third of the rounds disturbed (a neighbour thread, another process)
    assert list(robust_ms(quiet)) == [1.0, 1.0]


def test_a_busy_or_noisy_start_up_measurement_warns_with_its_figures():
    from pytest_llmperf.offload.costs import Calibration, calibration_warning

    cpu = LinearFit(0.05, 0.01)
    quiet = Calibration(rounds=20, estimator="p25", spread=0.1, fit_error=0.1, foreign_cores=0.1,
                        sibling_cores=0.0, seconds=0.3)
    assert calibration_warning(quiet, cpu, 0.07) is None
    busy = calibration_warning(replace(quiet, sibling_cores=0.9), cpu, 0.07)
    assert "busy (0.10 cores of other processes, 0.90 of other threads" in busy and "0.0600 ms at 1 token" in busy
    assert "spread widely (interquartile range 80%" in calibration_warning(replace(quiet, spread=0.8), cpu, 0.07)
    assert "misses a measured point by 70%" in calibration_warning(replace(quiet, fit_error=0.7), cpu, 0.07)


def test_the_linear_fit_weighs_relative_error_so_the_one_token_point_is_not_sacrificed():
    tokens = [1, 2, 4, 8, 16, 32]
    ms = [0.06, 0.065, 0.08, 0.1, 0.2, 0.37]  # the shape measured for a tiny-Mixtral expert: flat, then linear
    fit = LinearFit.fit(tokens, ms)
    assert abs(fit(1) - 0.06) / 0.06 < 0.25
    unweighted_b, unweighted_a = np.polyfit(tokens, ms, 1)
    assert abs(fit(1) - 0.06) < abs(unweighted_a + unweighted_b - 0.06)
