"""The campaign driven by a fake pool: no worker process starts. The pool's workers "measure" the simulated engine
in this process (seeded, no sleeping), so the rounds, the ABBA order, the looks, the batch sizes a later look asks
for and the decisions are the campaign's own, tested without the seconds a real worker costs (tests/test_workers.py
runs real ones)."""

from contextlib import ExitStack
from pathlib import Path

import pytest

from pytest_llmperf.backends.simulated import SimulatedBackend
from pytest_llmperf.measure import runner
from pytest_llmperf.measure.scenario import Scenario
from pytest_llmperf.orchestrate.campaign import Campaign
from pytest_llmperf.orchestrate.protocol import PROTOCOL, Hello, Imports, Report, Result, Side, WorkerError, WorkerRun
from pytest_llmperf.orchestrate.session import SESSION_KEY

TESTS = """
import pytest

@pytest.mark.llmperf(batch_sizes=[1, 2])
def test_a(llmperf):
    pass

@pytest.mark.llmperf(batch_sizes=[1, 2])
def test_b(llmperf):
    pass
"""


class FakePool:
    """A WorkerPool whose workers measure the simulated engine here: `slowdown` per side name slows decode, a side
    in `fails` reports the test as failed, and `broken_round` raises a WorkerError in that round."""

    def __init__(self, slowdown=None, fails=(), broken_round=None, noise=0.02):
        self.slowdown = slowdown or {}
        self.fails = set(fails)
        self.broken_round = broken_round
        self.noise = noise
        self.specs = []  # every worker started, in order
        self.rounds = []  # the side names of each round, in order
        self.servers = {}
        self.work_dir = None

    def run(self, spec):
        self.rounds.append([spec.side.name])
        return self._run(spec)

    def run_round(self, specs):
        self.rounds.append([spec.side.name for spec in specs])
        return [self._run(spec) for spec in specs]

    def _run(self, spec):
        if spec.index == self.broken_round:
            raise WorkerError(f"worker process {spec.index} on {spec.side.label} exited with code 3")
        self.specs.append(spec)
        run = WorkerRun(spec.side, spec.index, Hello(PROTOCOL, 1, spec.index))
        for n, nodeid in enumerate(spec.nodeids):
            if spec.side.name in self.fails:
                run.add([Report(nodeid, "call", "failed", "RuntimeError: boom")])
                continue
            sizes = (spec.batch_sizes or {}).get(nodeid, (1, 2))
            scenario = Scenario(batch_sizes=tuple(sizes), runs=3, warmups=0, rtol=0.05, max_load=float("inf"))
            engine = SimulatedBackend(
                seed=1000 * spec.index + 10 * n + len(spec.side.name),
                noise=self.noise,
                decode_slowdown=self.slowdown.get(spec.side.name, 1.0),
            )
            key = nodeid.split("::", 1)[1]
            result = runner.measure(engine, scenario, key=key, nodeid=nodeid, module=nodeid.split("::")[0])
            for batch in result.batches:
                for sample in batch.samples:
                    sample.process = spec.index
            run.add([Result(nodeid, result), Report(nodeid, "call", "passed")])
        return run


class FakeCampaign(Campaign):
    """The campaign with `pool` as its pool, and for an A/B job two sides in this directory (no git worktree)."""

    def __init__(self, config, pool):
        super().__init__(config, config.stash[SESSION_KEY], {})
        self.pool = pool

    def _pool(self, stack: ExitStack):
        return self.pool

    def _sides(self, stack):
        root = Path(self.config.rootpath)
        if self.perf_session.settings.compare:
            return [Side("A", root, "HEAD (abc)"), Side("B", root, "the working tree")]
        return [Side("", root, "the working tree")]

    def _collect_ref(self, items, work_dir):
        if self.perf_session.settings.compare:
            self.measurements.available["A"] = {item.nodeid for item in items}
        return items

    def _fork_servers(self, stack, pool, items):
        return {}


@pytest.fixture
def collect(pytester, monkeypatch):
    def items(*args):
        monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
        modcol = pytester.getmodulecol(TESTS, configargs=("--llmperf-device=cpu", "-p", "no:cacheprovider", *args))
        return pytester.genitems([modcol])

    return items


def test_an_ab_job_of_unchanged_code_passes_in_one_look_of_abba_rounds(collect):
    items = collect("--llmperf-compare=HEAD", "--llmperf-processes=5")
    pool = FakePool()
    campaign = FakeCampaign(items[0].config, pool)
    campaign.run(items)
    assert campaign.decisions.keys() == {item.nodeid for item in items}
    assert all(d.failure is None and d.skip is None for d in campaign.decisions.values())
    assert pool.rounds == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"], ["A", "B"]]  # ABBA, 5 per side
    assert all(spec.nodeids == tuple(item.nodeid for item in items) for spec in pool.specs)
    assert [o.kind for o in campaign.perf_session.outcomes] == ["passed", "passed"]
    assert campaign.perf_session.processes_used == [5, 5]


def test_a_slower_working_tree_fails_naming_decode(collect):
    items = collect("--llmperf-compare=HEAD", "--llmperf-processes=5")
    campaign = FakeCampaign(items[0].config, FakePool(slowdown={"B": 1.5}))
    campaign.run(items)
    for item in items:
        failure = campaign.decisions[item.nodeid].failure
        assert failure is not None and "decode_token_ms" in failure and "regressed" in failure


def test_undecided_rows_get_more_rounds_for_their_batch_sizes_only(collect):
    """Noisy processes and a slowdown at the tolerance: rows stay open past the first look, and the later rounds
    measure only the batch sizes still undecided, up to the cap."""
    items = collect("--llmperf-compare=HEAD", "--llmperf-processes=5", "-o", "llmperf_max_processes=8")
    pool = FakePool(slowdown={"B": 1.05}, noise=0.08)
    campaign = FakeCampaign(items[0].config, pool)
    campaign.run(items)
    assert len(campaign.decisions) == 2
    later = [spec for spec in pool.specs if spec.index > 5]
    assert later, "every row was decided at the first look: the case does not test later looks"
    assert max(spec.index for spec in pool.specs) <= 8
    for spec in later:
        assert spec.batch_sizes and all(set(sizes) <= {1, 2} for sizes in spec.batch_sizes.values())


def test_a_test_that_fails_on_the_ref_cannot_be_compared(collect):
    items = collect("--llmperf-compare=HEAD", "--llmperf-processes=5")
    campaign = FakeCampaign(items[0].config, FakePool(fails={"A"}))
    campaign.run(items)
    failure = campaign.decisions[items[0].nodeid].failure
    assert failure.startswith("cannot compare: the test fails on HEAD (abc) (worker process 1)")
    assert "RuntimeError: boom" in failure


def test_a_worker_that_fails_fails_every_test_still_due(collect):
    items = collect("--llmperf-compare=HEAD", "--llmperf-processes=5")
    pool = FakePool(broken_round=3)
    campaign = FakeCampaign(items[0].config, pool)
    campaign.run(items)
    assert {d.failure for d in campaign.decisions.values()} == {
        "llmperf: worker process 3 on HEAD (abc) exited with code 3"
    }
    assert len(pool.rounds) == 3 and campaign.perf_session.outcomes == []


def test_recording_baselines_measures_one_look_of_twice_the_processes(collect, tmp_path):
    items = collect("--llmperf-update", "--llmperf-processes=2", f"--llmperf-baseline-dir={tmp_path}")
    pool = FakePool()
    campaign = FakeCampaign(items[0].config, pool)
    campaign.run(items)
    assert pool.rounds == [[""]] * 4  # RECORD_FACTOR x 2 processes, one side
    assert [o.kind for o in campaign.perf_session.outcomes] == ["created", "created"]
    assert all(d.failure is None for d in campaign.decisions.values())


class MixedUpPool(FakePool):
    """Its workers of side A report what the working tree's environment has: as a worker forked from the wrong
    environment's server would."""

    def _run(self, spec):
        run = super()._run(spec)
        run.imports = Imports({"fastlib": "2.0"})
        return run


def test_a_worker_that_ran_the_other_sides_environment_fails_the_job(collect):
    from pytest_llmperf.environments.records import BUILT, Environments, SideEnvironment

    items = collect("--llmperf-compare=HEAD", "--llmperf-processes=5")
    campaign = FakeCampaign(items[0].config, MixedUpPool())
    envs = [SideEnvironment(side, BUILT, f"/envs/{side}/bin/python", installed={"fastlib": version})
            for side, version in (("base", "1.0"), ("head", "2.0"))]  # fmt: skip
    campaign.perf_session.environments = Environments("auto", "changed", *envs)
    campaign.run(items)
    assert {d.failure for d in campaign.decisions.values()} == {
        "llmperf: worker process 1 on HEAD (abc) did not run its side's environment, so the round measured one side "
        "in the other's environment and nothing of it is judged: fastlib 2.0 was imported; the base environment has "
        "1.0"
    }
    assert campaign.perf_session.outcomes == []


def test_a_counting_worker_that_ran_the_other_sides_environment_fails_the_job(collect, tmp_path, monkeypatch):
    """Counted, not timed (--llmperf-instructions-only): the counting workers' imports are checked too."""
    from pytest_llmperf.environments.records import BUILT, Environments, SideEnvironment
    from pytest_llmperf.orchestrate import counting
    from pytest_llmperf.orchestrate.protocol import ENV_IMPORTS

    monkeypatch.setattr(counting, "setup_problem", lambda: None)  # what valgrind would count is not the point here
    items = collect("--llmperf-compare=HEAD", "--llmperf-instructions-only")
    pool = MixedUpPool()
    pool.work_dir = tmp_path
    campaign = FakeCampaign(items[0].config, pool)
    envs = [SideEnvironment(side, BUILT, f"/envs/{side}/bin/python", installed={"fastlib": version})
            for side, version in (("base", "1.0"), ("head", "2.0"))]  # fmt: skip
    campaign.perf_session.environments = Environments("auto", "changed", *envs)
    campaign.run(items)
    assert pool.specs and all(spec.environ.get(ENV_IMPORTS) == "1" for spec in pool.specs)
    assert {d.failure for d in campaign.decisions.values()} == {
        "llmperf: counting instructions: worker process 1 on HEAD (abc) did not run its side's environment, so the "
        "round measured one side in the other's environment and nothing of it is judged: fastlib 2.0 was imported; "
        "the base environment has 1.0"
    }


@pytest.mark.parametrize(("budget", "round_s"), [("30", 3.0), ("auto", 60.0)])
def test_an_ab_job_stops_at_its_budget_and_an_open_row_says_its_bound(collect, monkeypatch, budget, round_s):
    """--llmperf-budget: rounds on an injected clock, 10 rounds' worth to spend (30 s of rounds of 3 s; auto with a
    first look of 5 rounds of 60 s: the first look and 5 min more, not 5 times it); rows at the tolerance stay open
    past the planned look, and the round after which the budget could not pay another is the last look, whatever the
    cap."""
    now = [0.0]
    monkeypatch.setattr("pytest_llmperf.orchestrate.campaign.time.monotonic", lambda: now[0])
    items = collect("--llmperf-compare=HEAD", "--llmperf-processes=5", "-o", "llmperf_max_processes=40",
                    f"--llmperf-budget={budget}")
    pool = FakePool(slowdown={"B": 1.05}, noise=0.08)
    run_round = pool.run_round

    def timed(specs):
        now[0] += round_s
        return run_round(specs)

    pool.run_round = timed
    campaign = FakeCampaign(items[0].config, pool)
    campaign.run(items)
    assert max(spec.index for spec in pool.specs) <= 10  # 10 rounds' worth, not the cap of 40
    later = [spec for spec in pool.specs if spec.index > 5]
    assert later and all(isinstance(runs, int) for spec in later for runs in spec.batch_sizes[spec.nodeids[0]].values())
    failures = [d.failure for d in campaign.decisions.values() if d.failure]
    assert failures and any("no regression above" in f and "at 95%" in f for f in failures)
