"""The live cost model (online.py): it converges from a wrong start-up figure, never moves an override, probes
a tier the plans stopped using, and the engine's schedule follows it, at the token count it predicts."""

import math

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoModelForCausalLM, MixtralConfig  # noqa: E402

from pytest_llmperf.backends.models import tokenizer_for  # noqa: E402
from pytest_llmperf.measure.backend import FakeClock  # noqa: E402
from pytest_llmperf.offload import OffloadEngine, OffloadOptions  # noqa: E402
from pytest_llmperf.offload.costs import CostModel, LinearFit  # noqa: E402
from pytest_llmperf.offload.experts import FusedExpertsAdapter  # noqa: E402
from pytest_llmperf.offload.online import OnlineCosts, bucket  # noqa: E402
from pytest_llmperf.offload.scheduler import Scheduler  # noqa: E402

EXPERT = 3 * 32 * 64 * 4  # the small Mixtral below: gate_up [128, 32] + down [32, 64], fp32
COPY_MS, GPU_MS = 2.0, 0.1


def true_cpu_ms(n, slowdown=1.0):
    return slowdown * (0.1 + 0.3 * n)


def startup(cpu_factor):
    """Start-up costs with the CPU tier off by `cpu_factor`, the copy and the fast tier right."""
    return CostModel(cpu=LinearFit(0.1 * cpu_factor, 0.3 * cpu_factor), gpu=LinearFit(GPU_MS, 0.0),
                     h2d_bytes_per_s=EXPERT / (COPY_MS / 1000.0), expert_bytes=EXPERT)


def test_buckets_double():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [0, 1, 2, 2, 3, 3, 4, 4, 5]


@pytest.mark.parametrize("factor", [100.0, 0.01])
def test_the_estimate_converges_from_a_start_up_figure_100x_off_and_ignores_an_outlier(factor):
    live = OnlineCosts(startup(factor), window=8)
    assert live.cpu_ms(4) == pytest.approx(true_cpu_ms(4) * factor)
    live.observe("cpu", 1, true_cpu_ms(1))
    # One observation corrects every bucket: the unobserved ones take the tier's median ratio.
    assert live.cpu_ms(1) == pytest.approx(true_cpu_ms(1)) and live.cpu_ms(16) == pytest.approx(true_cpu_ms(16))
    for _ in range(7):
        live.observe("cpu", 1, true_cpu_ms(1))
    live.observe("cpu", 1, 50 * true_cpu_ms(1))  # a descheduled run
    assert live.cpu_ms(1) == pytest.approx(true_cpu_ms(1))
    assert live.fetch_ms(3) == pytest.approx(COPY_MS + GPU_MS)  # untouched tiers keep their start-up figure
    assert live.observations == {"cpu": 9, "copy": 0, "gpu": 0, "overlap": 0, "sequential": 0}


def test_a_changed_machine_moves_the_estimate_within_one_window():
    live = OnlineCosts(startup(1.0), window=8)
    for _ in range(8):
        live.observe("cpu", 2, true_cpu_ms(2))
    seen = []
    for _ in range(8):  # the machine gets 4x slower
        live.observe("cpu", 2, true_cpu_ms(2, slowdown=4))
        seen.append(live.cpu_ms(2) / true_cpu_ms(2))
    assert seen[0] == pytest.approx(1.0) and seen[-1] == pytest.approx(4.0)
    assert seen[4] == pytest.approx(4.0)  # the median flips once the new figures are the majority


def test_overrides_are_never_changed_by_observations_and_never_probed():
    fiddler = startup(1.0).with_overrides(latency_cpu=7, latency_gpu=70)
    live = OnlineCosts(fiddler)
    for tier in ("cpu", "copy", "gpu"):
        for _ in range(20):
            live.observe(tier, 1, 1000.0)
    assert (live.cpu_ms(3), live.fetch_ms(3), live.resident_ms(3)) == (21, 70, 0)
    assert sum(live.observations.values()) == 0 and not live.wants_probe("cpu")
    half = OnlineCosts(startup(1.0).with_overrides(latency_cpu=7))
    half.observe("cpu", 1, 1000.0)
    half.observe("copy", 0, 4 * COPY_MS)
    assert half.cpu_ms(2) == 14 and half.fetch_copy_ms() == pytest.approx(4 * COPY_MS)
    off = OnlineCosts(startup(1.0), enabled=False)
    off.observe("cpu", 1, 1000.0)
    assert off.cpu_ms(1) == pytest.approx(true_cpu_ms(1)) and off.snapshot()["fixed"] == ["cpu", "copy", "gpu"]


def test_bad_window_and_probe_interval_name_the_option():
    with pytest.raises(ValueError, match="online_window"):
        OnlineCosts(startup(1.0), window=0)
    with pytest.raises(ValueError, match="online_probe_every"):
        OnlineCosts(startup(1.0), probe_every=0)


def test_an_unused_tier_is_probed_once_per_interval_with_the_smallest_expert():
    live = OnlineCosts(startup(100.0), probe_every=4)
    scheduler = Scheduler(live, "makespan")
    counts, resident = [0, 5, 1, 3], [True, False, False, False]
    plan = scheduler.plan(counts, resident)  # CPU looks 100x dear: all fetched, but never observed: probe
    assert plan.cpu == (2,) and plan.fetch == (1, 3) and live.probes == 1
    probes_at = lambda n: [i + 1 for i in range(n) if scheduler.plan(counts, resident).cpu]  # noqa: E731
    assert probes_at(8) == [8] and live.probes == 2  # no answer came back: the interval doubled, 4 -> 8
    live.observe("cpu", 1, 100 * true_cpu_ms(1))  # the probe's answer: the CPU tier really is that dear
    assert probes_at(16) == [16]  # so it stays unused, and the next probe waits twice as long again
    live.observe("cpu", 1, 100 * true_cpu_ms(1))  # the answer to the probe at 16 ...
    live.observe("cpu", 1, 100 * true_cpu_ms(1))  # ... and one that is no probe's: the plans use the tier
    assert probes_at(4) == [4]  # back to the short interval


class Timed(FusedExpertsAdapter):
    """Every expert advances the injected clock by its true cost: CPU-tier experts (slow-tier storage) by
    `true_cpu_ms(tokens, slowdown)`, fast-tier ones by GPU_MS. The outputs are the real ones."""

    clock: FakeClock
    slow_ptrs: frozenset
    slowdown = 1.0

    @classmethod
    def run(cls, module, x, gate_up, down):
        on_cpu = gate_up.untyped_storage().data_ptr() in cls.slow_ptrs
        ms = true_cpu_ms(x.shape[0], cls.slowdown) if on_cpu else GPU_MS
        cls.clock.advance(int(ms * 1e6))
        return FusedExpertsAdapter.run(module, x, gate_up, down)


def timed_engine(costs, **options):
    config = MixtralConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    clock = FakeClock(step=0)
    opts = OffloadOptions(fast_device="cpu", threads=1, expert_budget_gb=3.5 * EXPERT / 2**30, **options)
    engine = OffloadEngine.from_model(model, tokenizer_for(300), opts, costs=costs, clock=clock)
    layer = engine.layers[0]
    assert layer.resident == [True, True, False, False]
    slow = frozenset(lay.slow_gate_up.untyped_storage().data_ptr() for lay in engine.layers)
    adapter = type("T", (Timed,), {"clock": clock, "slow_ptrs": slow})
    for lay in engine.layers:
        lay.adapter = adapter
    staging, real_copy = engine.runtime.staging, engine.runtime.staging.copy

    def timed_copy(slot, gate_up, down):
        clock.advance(int(COPY_MS * 1e6))
        real_copy(slot, gate_up, down)

    staging.copy = timed_copy
    return engine, layer, adapter


def lone_expert(layer, n):
    """Layer 0's forward with non-resident expert 2 given exactly n tokens (and resident expert 0 too)."""
    engine_stats = layer.runtime.stats
    engine_stats.reset()
    with torch.inference_mode():
        layer.forward(torch.randn(n, 32), torch.tensor([[2, 0]] * n), torch.tensor([[0.75, 0.25]] * n))
    return "cpu" if engine_stats.cpu_expert_calls else "fetch"


def predicted_crossover(costs, upto=20):
    """The smallest token count the live model sends to the fast tier (fetch) rather than the CPU."""
    return next((n for n in range(1, upto + 1) if costs.cpu_ms(n) >= costs.fetch_ms(n)), upto + 1)


def test_the_schedule_flips_from_fetch_to_cpu_and_back_where_the_observed_costs_cross():
    # The per-expert rule (Fiddler's schedule) with measured costs, CPU 100x too dear at start-up.
    engine, layer, adapter = timed_engine(startup(100.0), schedule="fiddler", online_probe_every=1000)
    with engine:
        assert predicted_crossover(engine.costs) == 1  # everything would be fetched
        assert lone_expert(layer, 1) == "cpu"  # the first plan probes the unobserved CPU tier ...
        assert lone_expert(layer, 1) == "fetch"  # ... the next one the copy tier, now unused and unobserved
        assert engine.costs.probes == 2
        # One observation later the model is right: 0.1 + 0.3n < 2.0 + 0.1 up to n = 6.
        true_cross = next(n for n in range(1, 20) if true_cpu_ms(n) >= COPY_MS + GPU_MS)
        assert predicted_crossover(engine.costs) == true_cross == 7
        for n in range(1, 13):
            expected = "cpu" if n < predicted_crossover(engine.costs) else "fetch"
            assert lone_expert(layer, n) == expected, f"{n} tokens"
        # Back: the CPU gets 10x slower (a neighbour). Every CPU run is observed; the 3-4 token bucket flips
        # once the slow figures are the majority of its window, and the model predicts fetch everywhere.
        adapter.slowdown = 10.0
        decisions = [lone_expert(layer, 3) for _ in range(8)]
        flip = decisions.index("fetch")
        assert decisions[:flip] == ["cpu"] * flip and set(decisions[flip:]) == {"fetch"} and flip <= 8 // 2
        assert engine.costs.cpu_ms(3) >= engine.costs.fetch_ms(3)
        assert engine.costs.probes == 2  # no further probe: each tier was in use or observed meanwhile


@pytest.mark.parametrize("factor", [100.0, 0.01])
def test_a_generation_from_a_wrong_start_decodes_like_the_correctly_costed_engine(factor):
    """Same prompt, same routing: once the live model has corrected the CPU tier (prefill's probe or its
    first observations), every decode step takes exactly as long as with the right start-up costs; without
    the correction every one is slower. Batch 16 so decode experts get 3-12 tokens, on both sides of the
    crossover (7); Fiddler's rule runs the tiers one after the other, as the injected clock counts them."""
    ids = torch.randint(4, 300, (16, 12), generator=torch.Generator().manual_seed(1))
    steps, live = {}, {}
    for name, costs, online in (("right", startup(1.0), True), ("wrong", startup(factor), True),
                                ("uncorrected", startup(factor), False)):
        engine, _, _ = timed_engine(costs, schedule="fiddler", online_probe_every=1000, online_costs=online)
        with engine:
            out = engine.generate(ids, 6)
            steps[name] = out.decode_steps_ns
            live[name] = engine.costs
            assert (out.counters["costs.observations"] > 0) == online
            assert out.counters["costs.cpu_scale"] == pytest.approx(1 / factor if name == "wrong" else 1.0)
    assert live["wrong"].cpu_ms(1) == pytest.approx(true_cpu_ms(1))
    assert steps["wrong"] == steps["right"]
    assert all(u >= r for u, r in zip(steps["uncorrected"], steps["right"]))
    assert sum(steps["uncorrected"]) > sum(steps["right"])


def test_overrides_stay_fixed_through_a_generation_and_the_report_shows_the_live_model():
    engine, _, _ = timed_engine(startup(100.0), latency_cpu=7.0)
    with engine:
        out = engine.generate(torch.randint(4, 300, (2, 12)), 4)
        assert engine.costs.cpu_ms(5) == 35 and out.counters["costs.cpu_scale"] == 1.0
        live = engine.report()["costs"]["live"]
        assert live["fixed"] == ["cpu"] and live["observations"]["cpu"] == 0
        assert live["observations"]["gpu"] > 0 and engine.report()["costs"]["source"] == "injected"
        engine.set_costs(latency_cpu=7, latency_gpu=70, schedule="fiddler")  # Fiddler's rule: nothing learns
        out = engine.generate(torch.randint(4, 300, (2, 12)), 4)
        assert out.counters["costs.observations"] == 0 and out.counters["costs.probes"] == 0
        assert (engine.costs.cpu_ms(2), engine.costs.fetch_ms(2)) == (14, 70)
        assert math.isfinite(out.counters["costs.fetch_1tok_ms"])


def test_bad_online_options_name_the_option():
    from pytest_llmperf.offload import OffloadError

    for options, match in [(OffloadOptions(online_costs="yes"), "online_costs='yes'"),
                           (OffloadOptions(online_window=0), "online_window=0"),
                           (OffloadOptions(online_probe_every=1.5), "online_probe_every=1.5")]:
        with pytest.raises(OffloadError, match=match):
            options.validated()


def test_the_makespan_schedule_runs_a_layer_sequentially_once_overlapped_layers_are_seen_to_cost_more():
    live = OnlineCosts(startup(1.0), modes=True, probe_every=1000)
    for tier, n, ms in (("cpu", 2, true_cpu_ms(2)), ("copy", 0, COPY_MS), ("gpu", 2, GPU_MS)):
        live.observe(tier, n, ms)  # the tiers are known: no tier probes below
    scheduler = Scheduler(live, "makespan")
    counts, resident = [2, 2, 2, 0], [True, False, False, False]  # one resident expert, two CPU candidates
    first, second = scheduler.plan(counts, resident), scheduler.plan(counts, resident)
    assert not first.sequential and second.sequential and live.probes == 2  # each mode probed once
    assert first.cpu == second.cpu == (1, 2) and first.resident == (0,)
    overlapped = replace_plan(first, sequential=False)
    # Overlapped layers observed at 3x their plan (hand-off, GIL), sequential ones at their plan.
    for _ in range(4):
        live.observe_layer("overlap", 6, overlapped.makespan_ms, 3 * overlapped.makespan_ms)
        live.observe_layer("sequential", 6, second.makespan_ms, second.makespan_ms)
    plan = scheduler.plan(counts, resident)
    assert plan.sequential and plan.makespan_ms * live.scale("sequential", 6) < \
        overlapped.makespan_ms * live.scale("overlap", 6)
    for _ in range(8):  # the hand-off got cheap: overlapped layers now take what they plan
        live.observe_layer("overlap", 6, overlapped.makespan_ms, overlapped.makespan_ms)
    assert not scheduler.plan(counts, resident).sequential
    # CPU experts with nothing beside them run inline: there is nothing to overlap them with.
    alone = scheduler.plan([0, 2, 2, 0], resident)
    assert alone.cpu and not alone.fetch and not alone.resident and alone.sequential
    # Modes learn nothing from plans priced in an override's units.
    fixed = OnlineCosts(startup(1.0).with_overrides(latency_cpu=7, latency_gpu=70), modes=True)
    fixed.observe_layer("overlap", 6, 1.0, 3.0)
    assert fixed.scale("overlap", 6) == 1.0 and not Scheduler(fixed).plan(counts, resident).sequential


def replace_plan(plan, **changes):
    from dataclasses import replace

    return replace(plan, **changes)


def test_an_engine_whose_worker_hand_off_is_dear_learns_to_run_layers_sequentially():
    """Injected clock: every hand-off to the CPU worker costs 3 ms. The makespan plans assume overlap for
    free; the layers' wall times say otherwise, and after the probes the layers with work on both sides
    run one side after the other, with the same tokens as before."""
    engine, _, _ = timed_engine(startup(1.0), schedule="makespan", online_probe_every=1000)
    with engine:
        clock, submit = engine.layers[0].runtime.clock, engine.runtime.worker.submit

        def dear_submit(fn):
            clock.advance(3_000_000)
            return submit(fn)

        engine.runtime.worker.submit = dear_submit
        ids = torch.randint(4, 300, (16, 12), generator=torch.Generator().manual_seed(1))
        first = engine.generate(ids, 6)
        later = engine.generate(ids, 6)
        assert engine.costs.observations["overlap"] >= 1 and engine.costs.observations["sequential"] >= 1
        assert engine.costs.scale("overlap", 48) > engine.costs.scale("sequential", 48)
        assert later.counters["costs.sequential_plans"] > 0 and later.counters["cpu_expert_calls"] > 0
        assert torch.equal(first.tokens, later.tokens)
        assert sum(later.decode_steps_ns) < sum(first.decode_steps_ns)


def test_a_probe_answer_replaces_what_an_unused_tier_knew():
    """A busy spell inflated the CPU tier 50x and the plans stopped using it: the first probe's answer
    (the CPU is fine again) brings it back at once, instead of one window entry per probe."""
    live = OnlineCosts(startup(1.0), window=8, probe_every=2)
    for _ in range(8):
        live.observe("cpu", 1, 50 * true_cpu_ms(1))
    scheduler = Scheduler(live, "makespan")
    counts, resident = [0, 1, 1, 0], [True, False, False, False]
    assert [scheduler.plan(counts, resident).cpu for _ in range(2)] == [(), (1,)]  # the probe, at the interval
    live.observe("cpu", 1, true_cpu_ms(1))  # its answer
    assert live.cpu_ms(1) == pytest.approx(true_cpu_ms(1)) and scheduler.plan(counts, resident).cpu
