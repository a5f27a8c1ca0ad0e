"""The offload engine as a pytest-llmperf backend: run shape, counters, knobs, and the fixture end to end."""

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_llmperf.measure.backend import BackendError, GenerationRequest  # noqa: E402
from pytest_llmperf.backends.hf import HFBackend  # noqa: E402
from pytest_llmperf.backends.models import make_prompt, resolve_model  # noqa: E402
from pytest_llmperf.offload import OffloadOptions, fixed_costs  # noqa: E402
from pytest_llmperf.offload.backend import OffloadBackend  # noqa: E402

COUNTERS = {"hit_rate", "decode_hit_rate", "cpu_expert_calls", "fetches", "h2d_bytes", "cpu_expert_ms",
            "gpu_expert_ms", "fetch_ms",
            # the live cost model at the end of the run, and what it observed and probed during it
            "costs.cpu_1tok_ms", "costs.fetch_1tok_ms", "costs.cpu_scale", "costs.copy_scale", "costs.gpu_scale",
            "costs.overlap_scale", "costs.sequential_scale", "costs.observations", "costs.probes",
            "costs.sequential_plans"}
EXPERT_GB = 3 * 256 * 512 * 4 / 2**30


@pytest.fixture(scope="module")
def backend(model_cache):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    path = resolve_model("tiny-mixtral", local_models={}, cache_dir=Path(model_cache))
    b = OffloadBackend(path, OffloadOptions(fast_device="cpu", threads=1, expert_budget_gb=7 * EXPERT_GB),
                       name="tiny-mixtral")
    yield b
    b.close()
    torch.set_num_threads(before)


def test_a_run_has_the_hf_backend_shape_and_the_offload_counters(backend, model_cache):
    request = GenerationRequest(batch_size=2, sequence_length=16, decode_length=5, prompt=make_prompt(16))
    sample = backend.generate(request)
    assert sample.batch_size == 2 and len(sample.token_times_ns) == 2 and len(sample.token_times_ns[0]) == 5
    assert len(sample.decode_steps_ns) == 4 and sample.prefill_ns > 0 and sample.generated_tokens == 10
    assert sample.end_to_end_ns == sample.token_times_ns[0][-1] >= sample.tokenize_ns + sample.prefill_ns
    assert set(sample.counters) == COUNTERS | {f"hit_rate.layer{i}" for i in range(4)}
    assert 0 < sample.counters["hit_rate"] < 1
    hf = HFBackend(resolve_model("tiny-mixtral", local_models={}, cache_dir=Path(model_cache)), name="tiny-mixtral")
    try:
        assert torch.equal(backend.last_tokens, hf.reference_generate(request))
    finally:
        hf.close()
    assert backend.counters_better["hit_rate"] == "higher" and backend.counters_better["fetches"] == "lower"
    assert backend.counters_better["hit_rate.layer3"] == "higher"
    assert type(backend).counters_better["decode_hit_rate"] == "higher"


def test_knobs_are_applied_and_restored(backend):
    scheduler, threads = backend.engine.runtime.scheduler, backend.engine.threads
    env = os.environ.get("TOKENIZERS_PARALLELISM")
    with backend.apply_knobs({"latency_cpu": 7, "latency_gpu": 70, "threads": 2, "tokenizers_parallelism": True,
                              "schedule": "fiddler"}):
        costs = backend.engine.costs
        assert (costs.cpu_ms(9), costs.fetch_ms(9), costs.resident_ms(9)) == (63, 70, 0)
        assert backend.engine.runtime.scheduler.schedule == "fiddler"
        assert backend.engine.threads == 2 and os.environ["TOKENIZERS_PARALLELISM"] == "true"
    assert backend.engine.runtime.scheduler is scheduler and backend.engine.threads == threads
    assert os.environ.get("TOKENIZERS_PARALLELISM") == env


@pytest.mark.parametrize("knobs,match", [
    ({"latency_cpus": 7}, "no knob.*latency_cpus.*latency_cpu"),
    ({"latency_cpu": -7}, "latency_cpu"),
    ({"latency_gpu": "fast"}, "latency_gpu='fast'"),
    ({"threads": 0}, "threads=0"),
    ({"tokenizers_parallelism": "maybe"}, "tokenizers_parallelism='maybe'"),
    ({"schedule": "best"}, "schedule 'best'"),
])
def test_bad_knobs_are_rejected_and_leave_nothing_changed(backend, knobs, match):
    scheduler = backend.engine.runtime.scheduler
    with pytest.raises(BackendError, match=match):
        with backend.apply_knobs(knobs):
            pass
    assert backend.engine.runtime.scheduler is scheduler


def test_describe_reports_budget_costs_and_placement(backend):
    d = backend.describe()
    assert d["backend"] == "offload" and d["fast_experts"] == 7 and d["experts"] == 32
    assert d["budget_limited_by"] == "user budget" and d["ranking"] == "round robin"
    assert {"cpu_a_ms", "cpu_b_ms_per_token", "h2d_gb_per_s", "gpu_a_ms"} <= set(d["costs"])


def test_fixture_measures_with_knobs_and_closes_its_engines_also_when_a_test_fails(pytester, model_cache):
    # Two runs, one look: such a gate can only reach alpha 0.2 (smallest Mann-Whitney p of 2 vs 2 is 1/6),
    # enough for a test of the fixture; a smaller alpha is refused up front.
    pytester.makeini("[pytest]\nllmperf_runs = 2\nllmperf_max_runs = 2\nllmperf_alpha = 0.2\nllmperf_warmups = 0\n")
    pytester.makeconftest("pytest_plugins = ['pytest_llmperf.offload.fixture']\n")
    pytester.makepyfile(test_seed=f"""
        import pytest
        from pytest_llmperf.offload.engine import OffloadEngine

        @pytest.mark.llmperf(batch_sizes=[1], sequence_length=8, decode_length=3, group="seed004",
                             knobs={{"latency_cpu": 7, "latency_gpu": 70, "threads": 1}})
        def test_sweep(llmperf, llmperf_offload, request):
            backend = llmperf_offload("tiny-mixtral", threads=1)
            request.config.offload_engines = [backend.engine]
            result = llmperf.measure(backend)
            assert backend.engine.budget.n_experts == 8  # from llmperf_offload_expert_budget_gb
            assert 0 < result.batches[0].samples[0].counters["hit_rate"] < 1

        def test_fails(llmperf_offload, request):
            request.config.offload_engines.append(llmperf_offload("tiny-mixtral", threads=1).engine)  # cached
            assert False, "deliberate"

        def test_bad_option(llmperf_offload):
            with pytest.raises(pytest.UsageError, match="expert_budget.*known:"):
                llmperf_offload("tiny-mixtral", expert_budget=1)

        def test_zz_open_until_the_session_ends(request):
            engines = request.config.offload_engines
            assert engines[0] is engines[1] and not engines[0]._closed
    """)
    class Keep:
        def pytest_configure(self, config):
            self.config = config

    keep = Keep()
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--llmperf-device=cpu", "--llmperf-update", "--llmperf-max-load=64",
        f"--llmperf-cache-dir={model_cache}", "-o", f"llmperf_offload_expert_budget_gb={8 * EXPERT_GB}", plugins=[keep])
    result.assert_outcomes(passed=3, failed=1)
    assert keep.config.offload_engines and all(e._closed for e in keep.config.offload_engines)
    report = (pytester.path / "reports" / "cpu.md").read_text()
    assert "## Offload runs" in report and "latency_cpu=7" in report


def test_paired_policies_alternate_in_each_run_and_keep_their_own_live_models(backend):
    from pytest_llmperf.offload.backend import PairedPolicies

    order = []
    pair = PairedPolicies(backend, ("ours", {"schedule": "makespan"}),
                          ("fiddler", {"schedule": "fiddler", "latency_cpu": 7, "latency_gpu": 70}))
    ours, fiddler = pair.schedulers
    engine = backend.engine
    before = engine.runtime.scheduler
    hook = engine.model.model.layers[0].register_forward_pre_hook(
        lambda *a: order.append("ours" if engine.runtime.scheduler is ours else "fiddler"))
    request = GenerationRequest(batch_size=1, sequence_length=16, decode_length=3, prompt=make_prompt(16))
    try:
        samples = [pair.generate(request) for _ in range(2)]
    finally:
        hook.remove()
    per_run = 3  # prefill + 2 decode steps reach layer 0 three times per generation
    assert order == ["ours"] * per_run + ["fiddler"] * per_run + ["fiddler"] * per_run + ["ours"] * per_run
    assert engine.runtime.scheduler is before  # restored after every run
    c = samples[0].counters
    assert c["pair.ratio"] == pytest.approx(c["pair.a_decode_tokens_per_s"] / c["pair.b_decode_tokens_per_s"])
    assert c["costs.observations"] > 0  # the sample is ours: the live model learned; Fiddler's never does
    assert sum(fiddler.costs.observations.values()) == 0 and sum(ours.costs.observations.values()) > 0
    assert pair.describe()["pair"] == {"a": "ours", "b": "fiddler"}
    assert pair.counters_better["pair.ratio"] == "higher"
    with pytest.raises(BackendError, match="policy 'x' of a pair sets threads"):
        PairedPolicies(backend, ("x", {"threads": 2}), ("y", {}))


def test_the_report_gives_paired_policies_their_paired_ratio_and_wins():
    from pytest_llmperf.judge.stats import paired
    from pytest_llmperf.measure.records import BatchResult, BenchmarkResult, RunSample
    from pytest_llmperf.report.markdown import pairs_section

    a = [100.0, 104.0, 98.0, 110.0, 101.0, 99.0]
    b = [90.0, 100.0, 99.0, 100.0, 95.0, 90.0]
    samples = [RunSample(batch_size=1, token_times_ns=[[1, 2]], end_to_end_ns=2,
                         counters={"pair.a_decode_tokens_per_s": x, "pair.b_decode_tokens_per_s": y,
                                   "pair.ratio": x / y}) for x, y in zip(a, b)]
    result = BenchmarkResult(key="test_pair", nodeid="t.py::test_pair", module="t.py", scenario={},
                             backend={"pair": {"a": "ours", "b": "fiddler"}},
                             batches=[BatchResult(batch_size=1, samples=samples)])
    text = pairs_section([result])
    estimate = paired(b, a, better="higher")
    ratio, (low, high) = float(estimate.ratio()), (float(x) for x in estimate.interval())
    assert text.startswith("## Policy pairs") and "ours / fiddler" in text
    # the brackets escaped as markdown (report/tables.py): GitHub shows them as written, never as a link
    assert f"{ratio:.3f} \\[{low:.3f}, {high:.3f}\\]" in text and low < ratio < high and ratio > 1
    assert "| 5/6 " in text  # ours >= fiddler in 5 of the 6 pairs
    assert pairs_section([BenchmarkResult("k", "n", "m", {}, {}, [BatchResult(1, samples)])]) is None
