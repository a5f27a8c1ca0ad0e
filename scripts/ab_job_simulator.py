"""Whole A/B jobs on synthetic runs: how often a job of unchanged code goes red, how often a slowdown is called
regressed, how often a shown interval misses the true ratio, and what a job costs, at the plugin's defaults.

It drives the gate's own parts as the campaign does (orchestrate/campaign.py): `judge/stats.py`'s `nested`
estimate of every row from the runs of both processes of each round, `judge/procedure.py`'s planned schedule and
decisions and its choice of runs per process and of the next look within the job's budget. Only
the runs are synthetic, and what a round costs (seconds, from a cost model like this project's runners').

A run's log time is, per row: the machine's speed in that round (shared by both sides; a random walk over the rounds
when `drift` is set: between-process drift), plus its process's own offset (sd `between` per side), plus the run's own
scatter (sd `within`), plus, with probability `burst`, a delay (exponential, mean `burst_size` on the log scale; in
`disturbed` processes only, where that is set), plus a job-level offset of the working tree's side (sd `side`: a
layout bias every process of a job shares, which no within-job statistic can see), plus the true slowdown.

    python scripts/ab_job_simulator.py                     # the table of docs/notes/gate-runs.md
    python scripts/ab_job_simulator.py --jobs 2000 --noise busy
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_llmperf.judge import procedure, stats  # noqa: E402
from pytest_llmperf.judge.verdicts import Verdict  # noqa: E402
from pytest_llmperf.orchestrate.campaign import auto_budget  # noqa: E402


@dataclass(frozen=True)
class Noise:
    """The two levels of a shared machine's noise, per row, on the log scale (docs/notes/gate-runs.md measured them)."""

    within: float = 0.10
    between: float = 0.02
    burst: float = 0.0
    burst_size: float = 0.3
    disturbed: float = 1.0  # share of processes whose runs burst (1: all alike)
    drift: float = 0.0  # sd of the machine's step from one round to the next (a random walk, both sides)
    side: float = 0.0


#: Measured on this project's 2-core runner with the issue's user project (docs/notes/gate-runs.md): decode at batch
#: 1 while other work kept the load at 2-3 (quiet-ish), and with one core kept busy beside it.
NOISES = {
    "quiet": Noise(within=0.02, between=0.015),
    "shared": Noise(within=0.10, between=0.025),
    "busy": Noise(within=0.08, between=0.04, burst=0.3, burst_size=0.25),
    "disturbed": Noise(within=0.03, between=0.02, burst=0.4, burst_size=0.4, disturbed=0.2),
}


@dataclass(frozen=True)
class Job:
    """The job (one test of `metrics` rows at each batch size) and the gate's settings (the plugin's A/B defaults)."""

    noise: Noise = field(default_factory=Noise)
    slowdown: float = 0.0  # the true ratio - 1 of every row
    batch_sizes: tuple[int, ...] = (1, 4)
    metrics: int = 3
    first: int = 5
    runs: int = 3
    cap: int = 25
    most_runs: int = 30
    rtol: float = 0.05
    alpha: float = 0.01
    budget: float | None = None  # seconds of rounds; None: auto, as the campaign sets it from the first look's
    fixed_s: float = 0.7  # a round's fixed part
    run_s: tuple[float, ...] = (0.08, 0.26)  # one run of each batch size, both sides
    setup_s: float = 6.0  # what a job costs besides its rounds (pytest, the ref's checkout and collection)

    @classmethod
    def shipped(cls, **fields: object) -> Job:
        """A job at the plugin's defaults for an A/B job on the cpu target (its rtol, first look, runs and cap)."""
        from pytest_llmperf.orchestrate import session

        first = session.DEFAULT_AB_PROCESSES
        defaults = {"rtol": session.DEFAULT_RTOL["ab"], "first": first, "cap": session.default_cap(first),
                    "runs": session.DEFAULT_RUNS["workers"]}
        return cls(**{**defaults, **fields})


@dataclass
class Figures:
    jobs: int
    red: float  # share of jobs with a regressed or inconclusive row (the default --llmperf-fail-on)
    regressed: float  # share of jobs with a regressed row
    rows_regressed: float
    rows_pass: float
    rows_inconclusive: float
    missed_rows: float  # shown intervals that do not hold the true ratio
    missed_jobs: float  # jobs with any such row
    seconds_median: float
    seconds_p90: float
    processes_median: float

    def line(self, label: str) -> str:
        return (f"{label}: red {self.red:.1%} of {self.jobs} jobs (regressed {self.regressed:.1%}); rows regressed "
                f"{self.rows_regressed:.1%}, pass {self.rows_pass:.1%}, inconclusive {self.rows_inconclusive:.1%}; "
                f"intervals missing the truth {self.missed_rows:.2%} of rows, {self.missed_jobs:.1%} of jobs; "
                f"job {self.seconds_median:.0f} s median ({self.seconds_p90:.0f} s p90), processes per side median "
                f"{self.processes_median:.0f}")


class _Rows:
    """The runs of every row of one job so far: per row, a list of (A runs, B runs) per round."""

    def __init__(self, job: Job, rng: np.random.Generator) -> None:
        self.job, self.rng = job, rng
        self.count = len(job.batch_sizes) * job.metrics
        self.batch_of = np.repeat(np.arange(len(job.batch_sizes)), job.metrics)
        self.pairs: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(self.count)]
        noise = job.noise
        self.side = rng.normal(0.0, noise.side, self.count)
        self.speed = np.zeros(self.count)

    def round(self, runs: dict[int, int]) -> None:
        """One more round: the rows of the batch sizes in `runs` (index -> runs per process)."""
        job, noise, rng = self.job, self.job.noise, self.rng
        self.speed = self.speed + rng.normal(0.0, noise.drift, self.count)
        for row in range(self.count):
            n = runs.get(int(self.batch_of[row]))
            if n is None:
                continue
            sides = []
            for offset in (0.0, self.side[row] + math.log1p(job.slowdown)):
                values = self.speed[row] + offset + rng.normal(0.0, noise.between) + rng.normal(0.0, noise.within, n)
                if noise.burst and rng.random() < noise.disturbed:
                    values = values + (rng.random(n) < noise.burst) * rng.exponential(noise.burst_size, n)
                sides.append(np.exp(values))
            self.pairs[row].append((sides[0], sides[1]))

    def arrays(self, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(A, B): (rows, pairs, runs) NaN-padded, for `rows` (which have as many pairs)."""
        most = max(len(x) for r in rows for pair in self.pairs[r] for x in pair)
        pad = lambda x: np.concatenate([x, np.full(most - len(x), np.nan)])  # noqa: E731
        return tuple(np.array([[pad(pair[i]) for pair in self.pairs[r]] for r in rows]) for i in (0, 1))


def simulate_job(job: Job, rng: np.random.Generator) -> dict[str, object]:
    """One job, look by look as the campaign runs it; its rows' final verdicts, intervals, seconds and processes."""
    rows = _Rows(job, rng)
    schedule = procedure.Schedule.planned(job.first, job.cap, job.alpha, family=rows.count)
    verdicts: list[object] = [None] * rows.count
    shown: list[tuple[float, float]] = [(math.nan, math.nan)] * rows.count
    runs = dict.fromkeys(range(len(job.batch_sizes)), job.runs)
    margin = math.log1p(job.rtol)
    costs = procedure.Costs(job.fixed_s, dict(enumerate(job.run_s)))
    seconds, look, index, budget = 0.0, 0, 0, job.budget
    while True:
        index += 1
        rows.round(runs)
        seconds += procedure.round_seconds(costs, runs)
        if look > 0 and budget is not None and seconds + procedure.round_seconds(costs, runs) > budget:
            schedule = procedure.capped_at(schedule, index)  # past the first look a budget spent: the last look
        if index < schedule.looks[look]:
            continue
        if budget is None:  # auto: as the campaign sets it at the first look
            budget = auto_budget(seconds)
        final = look + 1 >= len(schedule.looks) or seconds + procedure.round_seconds(costs, runs) > budget
        open_rows = [r for r in range(rows.count) if verdicts[r] is None]
        reference, current = rows.arrays(open_rows)
        estimate = stats.nested(reference, current, better="lower")
        decision = procedure.decide(estimate, rtol=job.rtol, schedule=schedule, final=final, units=index)
        if not final and any(v == Verdict.REGRESSED for v in [*verdicts, *decision.verdicts]):
            final = True  # the test fails whatever its other rows say: this look is its last (as the campaign does),
            last = procedure.decide(estimate, rtol=job.rtol, schedule=schedule, final=True, units=index)
            first = decision.verdicts != None  # noqa: E711 (an object array): rows decided keep their verdicts
            decision = procedure.Decisions(*(np.where(first, a, b) for a, b in zip(
                (decision.verdicts, decision.p_adjusted, decision.needed, decision.low, decision.high),
                (last.verdicts, last.p_adjusted, last.needed, last.low, last.high))))
        needs = []
        for i, r in enumerate(open_rows):
            if decision.verdicts[i] is not None:
                verdicts[r] = decision.verdicts[i]
                shown[r] = (float(decision.low[i]), float(decision.high[i]))
            else:
                needs.append(procedure.Need(int(rows.batch_of[r]), float(estimate.spread.between[i]),
                                             float(estimate.spread.within[i]), abs(margin - float(estimate.bad[i])),
                                             margin, float(estimate.se[i])))
        if final or not needs:
            break
        left = {n.batch_size for n in needs}
        if schedule.interim(index):  # an interim look: the plan stands
            look += 1
            runs = {b: n for b, n in runs.items() if b in left}
            continue
        runs_now = max(runs.values())

        def affordable(chosen: dict[int, int], index: int = index, left: float = budget - seconds) -> int:
            return min(job.cap, index + max(int(left // procedure.round_seconds(costs, chosen)), 0))

        schedule, chosen = procedure.plan_next(needs, costs, schedule, look=look, runs_now=runs_now, least=job.runs,
                                                most=job.most_runs, affordable=affordable)
        runs = {b: chosen.get(b, job.runs) for b in left}
        look += 1
    truth = 1 + job.slowdown
    missed = [not (low <= truth <= high) for low, high in shown]
    return {"verdicts": verdicts, "missed": missed, "seconds": seconds + job.setup_s, "processes": index}


def simulate(job: Job, jobs: int, seed: int = 0) -> Figures:
    rng = np.random.default_rng(seed)
    done = [simulate_job(job, rng) for _ in range(jobs)]
    verdicts = np.array([d["verdicts"] for d in done], dtype=object)
    missed = np.array([d["missed"] for d in done], dtype=bool)
    seconds = np.array([d["seconds"] for d in done])
    regressed, inconclusive = verdicts == Verdict.REGRESSED, verdicts == Verdict.INCONCLUSIVE
    return Figures(jobs, float((regressed | inconclusive).any(1).mean()), float(regressed.any(1).mean()),
                   float(regressed.mean()), float((verdicts == Verdict.PASS).mean()), float(inconclusive.mean()),
                   float(missed.mean()), float(missed.any(1).mean()), float(np.median(seconds)),
                   float(np.quantile(seconds, 0.9)), float(np.median([d["processes"] for d in done])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=20261128)
    parser.add_argument("--noise", action="append", choices=sorted(NOISES), help="repeatable (default: all)")
    parser.add_argument("--budget", type=float, help="seconds of rounds (default: auto)")
    parser.add_argument("--slowdown", type=float, action="append", help="true slowdown, e.g. 0.10 (default: 0, 0.10)")
    args = parser.parse_args(argv)
    for name in args.noise or NOISES:
        for slowdown in args.slowdown or (0.0, 0.10):
            job = Job.shipped(noise=NOISES[name], slowdown=slowdown, budget=args.budget)
            print(simulate(job, args.jobs, args.seed).line(f"{name}, +{slowdown:.0%}"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
