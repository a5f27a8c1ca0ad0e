"""The engine on a CPU-only machine (fast = slow = cpu): same logits and tokens as HF eager under every
policy, budget respected, counters equal to counts by hand, the worker thread used, failures surfaced."""

import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoModelForCausalLM, MixtralConfig, Qwen2MoeConfig  # noqa: E402

from pytest_llmperf.measure.backend import FakeClock  # noqa: E402
from pytest_llmperf.backends.models import resolve_model, tokenizer_for  # noqa: E402
from pytest_llmperf.offload import OffloadEngine, OffloadError, OffloadOptions, fixed_costs  # noqa: E402
from pytest_llmperf.offload.backend import OffloadBackend  # noqa: E402
from pytest_llmperf.offload.costs import CostModel, LinearFit  # noqa: E402
from pytest_llmperf.offload.experts import FusedExpertsAdapter  # noqa: E402

def opts(**kw):
    """Engine options for tests: cpu tiers, one torch thread (two threads on a busy 2-core machine can be
    100x slower: OpenMP workers spin against the other load)."""
    return OffloadOptions(**{"fast_device": "cpu", "threads": 1, **kw})


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # for the HF reference model
    yield
    torch.set_num_threads(before)


EXPERT_BYTES = 3 * 256 * 512 * 4  # tiny-mixtral: gate_up [1024, 256] + down [256, 512], fp32
# (name, options, injected costs): injected costs keep decisions independent of this machine's speed.
POLICIES = {
    "all-fast": (opts(), None),
    "all-slow": (opts(expert_budget_gb=0, schedule="cpu"), None),
    "mixed": (opts(expert_budget_gb=7 * EXPERT_BYTES / 2**30), fixed_costs(7, 70)),
    "forced-fetch": (opts(expert_budget_gb=0, schedule="fetch"), None),
    "fiddler-sequential": (opts(expert_budget_gb=7 * EXPERT_BYTES / 2**30,
                                          schedule="fiddler"), fixed_costs(7, 70)),
    "no-overlap": (opts(expert_budget_gb=10 * EXPERT_BYTES / 2**30, overlap=False),
                   fixed_costs(1, 1)),
}


@pytest.fixture(scope="module")
def tiny_path(model_cache):
    return resolve_model("tiny-mixtral", local_models={}, cache_dir=Path(model_cache))


@pytest.fixture(scope="module")
def reference(tiny_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    model.set_experts_implementation("eager")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 16000, (2, 24), generator=g)
    with torch.inference_mode():
        logits = model(ids).logits
        tokens = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                                min_new_tokens=6, do_sample=False)[:, ids.shape[1]:]
    return ids, logits, tokens


def _costs(costs):
    return {"costs": costs} if costs is not None else {}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_logits_and_greedy_tokens_equal_hf_eager(tiny_path, reference, policy):
    options, costs = POLICIES[policy]
    ids, ref_logits, ref_tokens = reference
    with OffloadEngine(tiny_path, options, **_costs(costs)) as engine:
        with torch.inference_mode():
            logits = engine.model(ids).logits
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
        out = engine.generate(ids, 6)
        assert torch.equal(out.tokens, ref_tokens)
        c = out.counters
        if policy == "all-fast":
            assert c["hit_rate"] == 1.0 and c["cpu_expert_calls"] == 0 and c["fetches"] == 0
        elif policy == "all-slow":
            assert c["hit_rate"] == 0.0 and c["cpu_expert_calls"] > 0 and c["fetches"] == 0
        elif policy == "forced-fetch":
            assert c["cpu_expert_calls"] == 0 and c["fetches"] > 0
            assert c["h2d_bytes"] == c["fetches"] * EXPERT_BYTES and c["fetch_ms"] > 0
        else:
            assert 0 < c["hit_rate"] < 1 and c["cpu_expert_calls"] > 0


def _capture_routing(engine):
    """Hook every router: the top-k expert indices each layer saw, in call order."""
    seen, hooks = [], []
    for site in engine.sites:
        router = engine.model.get_submodule(site.name.rsplit(".", 1)[0]).gate
        hooks.append(router.register_forward_hook(
            lambda mod, args, out, layer=site.layer: seen.append((layer, out[2].clone()))))
    return seen, hooks


def test_counters_equal_a_count_by_hand(tiny_path, reference):
    ids = reference[0]
    # Fiddler's schedule with its 7/70 costs: a non-resident expert runs on CPU exactly below 10 tokens.
    options = opts(expert_budget_gb=9 * EXPERT_BYTES / 2**30, schedule="fiddler")
    with OffloadEngine(tiny_path, options, costs=fixed_costs(7, 70)) as engine:
        seen, hooks = _capture_routing(engine)
        out = engine.generate(ids, 5)
        for h in hooks:
            h.remove()
        layers = engine.num_layers
        assert len(seen) == 5 * layers  # prefill + 4 decode steps
        hits = [[0, 0] for _ in range(layers)]
        totals = [[0, 0] for _ in range(layers)]
        cpu_calls = fetches = 0
        for i, (layer, idx) in enumerate(seen):
            phase = 0 if i < layers else 1
            flat = idx.reshape(-1).tolist()
            totals[layer][phase] += len(flat)
            hits[layer][phase] += sum(engine.resident[layer][e] for e in flat)
            for e in set(flat):
                if not engine.resident[layer][e]:
                    n = flat.count(e)
                    cpu_calls += n < 10
                    fetches += n >= 10
        c = out.counters
        assert c["hit_rate"] == pytest.approx(sum(map(sum, hits)) / sum(map(sum, totals)))
        assert c["decode_hit_rate"] == pytest.approx(sum(h[1] for h in hits) / sum(t[1] for t in totals))
        for layer in range(layers):
            assert c[f"hit_rate.layer{layer}"] == pytest.approx(sum(hits[layer]) / sum(totals[layer]))
        assert (c["cpu_expert_calls"], c["fetches"]) == (cpu_calls, fetches)
        assert cpu_calls > 0 and fetches > 0  # both sides of the rule were exercised
        assert c["h2d_bytes"] == c["fetches"] * EXPERT_BYTES
        assert sum(sum(r) for r in engine.resident) == 9


def test_expert_time_and_fetch_time_are_disjoint(tiny_path, reference):
    """Injected clock: a fast-tier expert run takes 1 ms, a staging copy 10 ms; nothing else takes time."""
    clock = FakeClock(step=0)
    runs, copies = [], []

    class Timed(FusedExpertsAdapter):
        @staticmethod
        def run(module, x, gate_up, down):
            runs.append(x.shape[0])
            clock.advance(1_000_000)
            return FusedExpertsAdapter.run(module, x, gate_up, down)

    options = opts(expert_budget_gb=7 * EXPERT_BYTES / 2**30, schedule="fetch")
    with OffloadEngine(tiny_path, options, costs=fixed_costs(7, 70), clock=clock) as engine:
        staging, real_copy = engine.runtime.staging, engine.runtime.staging.copy

        def slow_copy(slot, gate_up, down):
            copies.append(slot)
            clock.advance(10_000_000)
            real_copy(slot, gate_up, down)

        staging.copy = slow_copy
        for layer in engine.layers:
            layer.adapter = Timed
        out = engine.generate(reference[0], 3)
    c = out.counters
    assert c["fetches"] == len(copies) > 0 and c["cpu_expert_calls"] == 0
    assert c["fetch_ms"] == pytest.approx(10 * len(copies))
    assert c["gpu_expert_ms"] == pytest.approx(len(runs))  # the copies are not counted a second time
    assert c["gpu_expert_ms"] + c["fetch_ms"] <= out.step_times_ns[-1] / 1e6 + 1e-6


def test_costs_7_and_70_under_fiddler_run_a_lone_non_resident_expert_on_cpu_exactly_below_10_tokens():
    """The rule at the engine level, for every token count 1..20: CPU calls and fetches counted, and the
    layer's output equal to the experts run by hand."""
    config = MixtralConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    experts = model.model.layers[0].mlp.experts
    gate_up, down = experts.gate_up_proj.detach().clone(), experts.down_proj.detach().clone()
    expert = 3 * 32 * 64 * 4
    options = opts(expert_budget_gb=3.5 * expert / 2**30, schedule="fiddler")
    with OffloadEngine.from_model(model, tokenizer_for(300), options, costs=fixed_costs(7, 70)) as engine:
        layer = engine.layers[0]
        assert layer.resident == [True, True, False, False]  # round robin over 2 layers: experts 0, 1 here
        for n in range(1, 21):
            hidden = torch.randn(n, 32)
            index = torch.tensor([[2, 0]] * n)  # non-resident expert 2 gets exactly n tokens
            weights = torch.tensor([[0.75, 0.25]] * n)
            engine.stats.reset()
            with torch.inference_mode():
                out = layer.forward(hidden, index, weights)
            calls = (engine.stats.cpu_expert_calls, engine.stats.fetches)
            assert calls == ((1, 0) if n < 10 else (0, 1)), f"{n} tokens"
            expected = sum(w * FusedExpertsAdapter.run(experts, hidden, gate_up[e], down[e])
                           for e, w in ((2, 0.75), (0, 0.25)))
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_budget_is_respected_and_reported(tiny_path):
    budget = 5.5 * EXPERT_BYTES / 2**30
    with OffloadEngine(tiny_path, opts(expert_budget_gb=budget),
                       costs=fixed_costs(7, 70)) as engine:
        fast_bytes = sum(l.fast_gate_up.numel() * 4 + l.fast_down.numel() * 4
                         for l in engine.layers if l.fast_gate_up is not None)
        assert fast_bytes == 5 * EXPERT_BYTES <= budget * 2**30
        report = engine.report()
        assert report["budget"]["n_fast_experts"] == 5 and report["budget"]["limited_by"] == "user budget"
        assert report["fast_experts_per_layer"] == [2, 1, 1, 1]  # round robin
        assert report["costs"]["latency_cpu"] == 7
        # The module's own expert weights are gone: the tiers hold the only copy.
        assert all(site.module.gate_up_proj.numel() == 0 for site in engine.sites)


def test_the_cost_model_is_measured_on_slow_tier_storage(tiny_path, monkeypatch):
    seen = []

    def spy(*, slow_weights, fast_device, act):
        seen.append(slow_weights)
        return fixed_costs(1, 1, EXPERT_BYTES)

    monkeypatch.setattr("pytest_llmperf.offload.engine.measure_costs", spy)
    # 29 of 32 experts, round robin: layer 0 holds all 8, layers 1-3 keep expert 7 on the slow tier.
    with OffloadEngine(tiny_path, opts(expert_budget_gb=29 * EXPERT_BYTES / 2**30)) as engine:
        assert engine.layers[0].slow_gate_up is None
        gu, dn = seen[-1]
        assert gu.data_ptr() == engine.layers[1].slow_gate_up[0].data_ptr()  # what a fetch copies from
        assert dn.data_ptr() == engine.layers[1].slow_down[0].data_ptr()
    with OffloadEngine(tiny_path, opts()) as engine:  # all resident: a host copy, not the fast tier itself
        gu, dn = seen[-1]
        assert gu.data_ptr() != engine.layers[0].fast_gate_up[0].data_ptr()
        torch.testing.assert_close(gu, engine.layers[0].fast_gate_up[0])
        torch.testing.assert_close(dn, engine.layers[0].fast_down[0])


def test_reserve_gb_replaces_kv_and_activations_and_staging_comes_on_top(tiny_path):
    with OffloadEngine(tiny_path, opts(reserve_gb=0.25), costs=fixed_costs(1, 1)) as engine:
        reserve = engine.budget.reserve
        assert (reserve.kv_cache_bytes, reserve.activation_bytes) == (2**28, 0)
        assert reserve.staging_bytes == 2 * EXPERT_BYTES and reserve.total == 2**28 + 2 * EXPERT_BYTES


def test_emulated_device_memory_limits_the_budget(tiny_path):
    # A "card" holding the non-expert weights, the reserve and room for exactly 3 experts.
    probe = OffloadEngine(tiny_path, opts(expert_budget_gb=0), costs=fixed_costs(1, 1))
    non_expert = sum(p.numel() * p.element_size() for p in probe.model.parameters())
    non_expert += sum(b.numel() * b.element_size() for b in probe.model.buffers())
    reserve = probe.budget.reserve.total
    probe.close()
    card = (non_expert + reserve + 3.5 * EXPERT_BYTES) / 2**30
    with OffloadEngine(tiny_path, opts(device_memory_gb=card),
                       costs=fixed_costs(1, 1)) as engine:
        assert engine.budget.n_experts == 3 and engine.budget.limited_by == "free memory"


def test_cpu_experts_run_on_the_worker_thread_and_a_failure_is_an_error_not_a_hang(tiny_path, reference):
    ids = reference[0]
    threads = set()

    class Spy(FusedExpertsAdapter):
        @staticmethod
        def run(module, x, gate_up, down):
            threads.add(threading.current_thread().name)
            return FusedExpertsAdapter.run(module, x, gate_up, down)

    class Broken(FusedExpertsAdapter):
        @staticmethod
        def run(module, x, gate_up, down):
            if threading.current_thread().name.startswith("llmperf-offload-cpu"):
                raise RuntimeError("simulated CPU kernel failure")
            return FusedExpertsAdapter.run(module, x, gate_up, down)

    options = opts(expert_budget_gb=0, schedule="cpu", cpu_timeout_s=30)
    with OffloadEngine(tiny_path, options, costs=fixed_costs(7, 70)) as engine:
        for layer in engine.layers:
            layer.adapter = Spy
        engine.generate(ids, 2)
        assert any(name.startswith("llmperf-offload-cpu") for name in threads)
        for layer in engine.layers:
            layer.adapter = Broken
        with pytest.raises(OffloadError, match="CPU expert of MoE layer 0 failed: RuntimeError: simulated"):
            engine.generate(ids, 2)
        for layer in engine.layers:  # the worker survives a failed job
            layer.adapter = FusedExpertsAdapter
        assert engine.generate(ids, 2).tokens.shape == (2, 2)


def test_a_stuck_cpu_expert_times_out_once_and_close_does_not_wait_for_it(tiny_path, reference):
    release = threading.Event()
    started = []

    class Stuck(FusedExpertsAdapter):
        @staticmethod
        def run(module, x, gate_up, down):
            if threading.current_thread().name.startswith("llmperf-offload-cpu"):
                started.append(time.perf_counter())
                release.wait(120)
            return FusedExpertsAdapter.run(module, x, gate_up, down)

    timeout = 1.0
    options = opts(expert_budget_gb=0, schedule="cpu", cpu_timeout_s=timeout)
    engine = OffloadEngine(tiny_path, options, costs=fixed_costs(7, 70))
    engine.layers[0].adapter = Stuck
    try:
        with pytest.raises(OffloadError, match="did not finish within 1.0 s"):
            engine.generate(reference[0], 1)
        # Waited out once: the error comes before a second timeout could have passed.
        assert time.perf_counter() - started[0] < 2 * timeout
        # The stuck job still holds the worker: later calls fail at once instead of queueing behind it.
        with pytest.raises(OffloadError, match="close it and start a new one"):
            engine.generate(reference[0], 1)
        assert len(started) == 1
        before = time.perf_counter()
        engine.close()  # fixture teardown calls this: it must not wait for the stuck job
        assert time.perf_counter() - before < 5 * timeout
        assert not release.is_set() and engine._closed
    finally:
        release.set()


def test_set_costs_keeps_the_start_up_overrides_it_is_not_given(tiny_path):
    measured = CostModel(cpu=LinearFit(0.5, 0.25), gpu=LinearFit(0.1, 0.01), h2d_bytes_per_s=1e9,
                         expert_bytes=EXPERT_BYTES)
    with OffloadEngine(tiny_path, opts(expert_budget_gb=0, latency_gpu=70), costs=measured) as engine:
        costs = lambda: (engine.costs.latency_cpu, engine.costs.latency_gpu)  # noqa: E731
        assert costs() == (None, 70)
        engine.set_costs(latency_cpu=7)
        assert costs() == (7, 70) and (engine.costs.cpu_ms(9), engine.costs.fetch_ms(9)) == (63, 70)
        engine.set_costs(latency_gpu=1, schedule="fiddler")
        assert costs() == (None, 1) and engine.costs.cpu_ms(4) == pytest.approx(1.5)  # measured cpu again
        engine.set_costs()
        assert costs() == (None, 70) and engine.runtime.scheduler.schedule == "fiddler"
        # The same through the backend's knobs, which the seed-004 suite uses.
        with OffloadBackend.from_engine(engine).apply_knobs({"latency_cpu": 7}):
            assert costs() == (7, 70)
        assert costs() == (None, 70)


def test_a_failed_run_leaves_the_phase_at_prefill(tiny_path, reference):
    ids = reference[0]
    with OffloadEngine(tiny_path, opts(), costs=fixed_costs(1, 1)) as engine:
        def fail_in_decode(*args):
            if engine.runtime.phase == "decode":
                raise RuntimeError("simulated failure in a decode step")

        hook = engine.model.model.layers[0].register_forward_pre_hook(fail_in_decode)
        with pytest.raises(RuntimeError, match="decode step"):
            engine.generate(ids, 3)
        hook.remove()
        assert engine.runtime.phase == "prefill"
        engine.stats.reset()
        with torch.inference_mode():
            engine.model(ids)  # a direct call counts as prefill, not as decode
        top_k = engine.model.config.num_experts_per_tok
        assert engine.stats.assignments[1].sum() == 0
        assert engine.stats.assignments[0].sum() == ids.numel() * top_k * engine.num_layers


def test_calibrated_profile_beats_round_robin_on_the_same_input(tiny_path, reference, tmp_path):
    ids = reference[0]
    budget = 6 * EXPERT_BYTES / 2**30
    with OffloadEngine(tiny_path, opts(expert_budget_gb=budget),
                       costs=fixed_costs(7, 70)) as engine:
        rr = engine.generate(ids, 4).counters["hit_rate"]
        profile = engine.calibrate([ids], 4, tmp_path / "popularity.json")
        counts = engine.stats.assignments.sum(axis=0)
    with OffloadEngine(tiny_path, opts(expert_budget_gb=budget,
                                                 popularity=str(profile)), costs=fixed_costs(7, 70)) as engine:
        assert engine.report()["ranking"].startswith("profile")
        top = sorted(((counts[l, e], l, e) for l in range(4) for e in range(8)), reverse=True)[:6]
        assert all(engine.resident[l][e] for _, l, e in top)
        assert engine.generate(ids, 4).counters["hit_rate"] >= rr


def test_threads_are_set_for_generate_and_restored(tiny_path, reference):
    before = torch.get_num_threads()  # 1, from the module fixture
    with OffloadEngine(tiny_path, opts(threads=2), costs=fixed_costs(1, 1)) as engine:
        seen = []
        hook = engine.model.model.layers[0].register_forward_hook(lambda *a: seen.append(torch.get_num_threads()))
        engine.generate(reference[0][:1, :4], 1)
        hook.remove()
        assert seen == [2]
    assert torch.get_num_threads() == before
    engine.close()  # twice is fine
    with pytest.raises(OffloadError, match="closed"):
        engine.generate(reference[0], 1)


def test_main_thread_and_worker_share_the_threads_while_they_overlap_on_the_cpu(tiny_path, reference):
    seen = {"main": set(), "worker": set(), "attention": set()}

    class Spy(FusedExpertsAdapter):
        @staticmethod
        def run(module, x, gate_up, down):
            worker = threading.current_thread().name.startswith("llmperf-offload-cpu")
            seen["worker" if worker else "main"].add(torch.get_num_threads())
            return FusedExpertsAdapter.run(module, x, gate_up, down)

    # Prefill of 48 tokens: every layer has resident experts (main thread) and CPU experts (worker).
    options = opts(threads=2, expert_budget_gb=7.5 * EXPERT_BYTES / 2**30, schedule="cpu")
    with OffloadEngine(tiny_path, options, costs=fixed_costs(7, 70)) as engine:
        for layer in engine.layers:
            layer.adapter = Spy
        attention = engine.model.model.layers[0].self_attn
        hook = attention.register_forward_hook(lambda *a: seen["attention"].add(torch.get_num_threads()))
        out = engine.generate(reference[0], 1)
        hook.remove()
    assert out.counters["cpu_expert_calls"] > 0 and out.counters["hit_rate"] > 0
    assert seen == {"main": {1}, "worker": {1}, "attention": {2}}  # 2 cores' worth while overlapped, not 4


def test_bad_options_name_the_option_and_the_fix(tiny_path):
    for options, match in [(OffloadOptions(schedule="fast"), "schedule='fast'.*makespan"),
                           (OffloadOptions(expert_budget_gb=-1), "expert_budget_gb=-1"),
                           (OffloadOptions(dtype="int4"), "dtype='int4'.*fp32"),
                           (OffloadOptions(threads=0), "threads=0"),
                           (OffloadOptions(fast_device="cuda"), "CUDA is not available.*fast_device='cpu'"),
                           (OffloadOptions(popularity="/nonexistent.json"), "does not exist")]:
        if options.fast_device == "cuda" and torch.cuda.is_available():
            continue
        with pytest.raises((OffloadError, ValueError), match=match):
            OffloadEngine(tiny_path, options, costs=fixed_costs(1, 1)).close()


def test_a_qwen2_moe_model_with_a_shared_expert_needs_no_extra_code():
    config = Qwen2MoeConfig(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            shared_expert_intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, num_experts=16, num_experts_per_tok=4, decoder_sparse_step=1,
                            mlp_only_layers=[])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.set_experts_implementation("eager")
    ids = torch.randint(0, 512, (2, 12))
    with torch.inference_mode():
        ref = model(ids).logits
    expert = 3 * 32 * 64 * 4
    engine = OffloadEngine.from_model(model, tokenizer_for(512),
                                      opts(expert_budget_gb=9 * expert / 2**30),
                                      costs=fixed_costs(1, 3))
    with engine, torch.inference_mode():
        torch.testing.assert_close(engine.model(ids).logits, ref, rtol=1e-4, atol=1e-4)
        assert engine.num_experts == 16 and engine.budget.n_experts == 9
        assert engine.model.model.layers[0].mlp.shared_expert.gate_proj.weight.numel() > 0  # left in place


def test_random_weights_made_in_place_from_a_config():
    config = MixtralConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    expert = 3 * 32 * 64 * 4
    engine = OffloadEngine.from_config(config, tokenizer_for(300),
                                       opts(expert_budget_gb=3 * expert / 2**30),
                                       costs=fixed_costs(7, 70))
    with engine:
        out = engine.generate(torch.randint(4, 300, (1, 8)), 3)
        assert out.tokens.shape == (1, 3) and 0 < out.counters["hit_rate"] < 1
        assert engine.budget.n_experts == 3
        assert all(torch.isfinite(l.slow_gate_up).all() for l in engine.layers)
