"""The gate against stored baselines on synthetic jobs: how often a job goes red, how often a slowdown is caught,
how many processes it takes. It drives the gate's own functions (judge/stats.py's `unpaired` estimates,
judge/procedure.py's schedule (a look after every round, alpha spent at the doublings) and decisions, look by look as the controller runs them) with synthetic
per-process medians, so a change of the procedure shows here before it reaches a real job. A/B jobs, whose runs the
gate tests pair by pair with looks planned from the job's spreads, are scripts/ab_job_simulator.py's.

A job is `tests` benchmark tests of `rows` gated rows each (metric x batch size), against a baseline of
`baseline_processes` processes. Every process gets, per test, a log-normal value per row (sd `noise`). Disturbed
processes (probability `disturbed`) are slowed by U(1.2, 2) on every row of their test, as a burst on a shared
runner does; `drift` slows the whole current side (a stored baseline ages). A job is red when any row ends
regressed or inconclusive (the README's recipe fails on both).

    python scripts/gate_simulator.py                # stored baselines at rtol 0.05 (the GPU target's default)
    python scripts/gate_simulator.py --jobs 2000 --rtol 0.15    # the cpu target's
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_llmperf.judge import procedure, stats  # noqa: E402
from pytest_llmperf.judge.verdicts import Verdict  # noqa: E402


@dataclass(frozen=True)
class Job:
    """The synthetic job and the gate's settings."""

    tests: int = 18
    rows: int = 20
    slowdown: float = 0.0  # true slowdown of every row of the first `slowed_tests` tests (0.1 = 10%)
    slowed_tests: int = 18
    noise: float = 0.03  # log sd of one process's value
    disturbed: float = 0.0  # probability that a process is slowed by U(1.2, 2)
    drift: float = 0.0  # the whole current side slower by this (a baseline recorded on a faster hour)
    processes: int = 5  # the first look
    max_processes: int = 25  # the cap
    baseline_processes: int = 10
    rtol: float = 0.05
    alpha: float = 0.01

    @classmethod
    def shipped(cls, target: str = "gpu", **fields: object) -> Job:
        """A job at the plugin's defaults against stored baselines on a target class: its rtol, first look, cap and
        the processes a baseline records."""
        from pytest_llmperf.orchestrate import session  # the plugin's own defaults, so a change shows here

        first = session.DEFAULT_PROCESSES[target]
        return cls(**{"rtol": session.DEFAULT_RTOL[target], "processes": first,
                      "max_processes": session.default_cap(first),
                      "baseline_processes": session.RECORD_FACTOR * first, **fields})


@dataclass
class Figures:
    jobs: int
    red: float  # share of jobs with a regressed or inconclusive row
    any_regressed: float
    rows_regressed: float
    rows_inconclusive: float
    rows_pass: float
    processes_median: float  # per test and side, at the end
    processes_mean: float

    def line(self, label: str) -> str:
        return (f"{label}: red {self.red:.1%} of {self.jobs} jobs (regressed in {self.any_regressed:.1%}); rows "
                f"regressed {self.rows_regressed:.2%}, inconclusive {self.rows_inconclusive:.3%}, pass "
                f"{self.rows_pass:.1%}; processes per test and side: median {self.processes_median:.0f}, "
                f"mean {self.processes_mean:.1f}")


def _side_values(rng: np.random.Generator, job: Job, shape: tuple[int, ...]) -> np.ndarray:
    """log values of one side: (jobs, tests, rows, processes)."""
    own = rng.normal(0.0, job.noise, shape)
    if job.disturbed:
        hit = rng.random(shape[:2] + (1, shape[3])) < job.disturbed
        own = own + np.where(hit, np.log(rng.uniform(1.2, 2.0, shape[:2] + (1, shape[3]))), 0.0)
    return own


def simulate(job: Job, jobs: int, seed: int = 0) -> tuple[Figures, np.ndarray]:
    """Run `jobs` synthetic jobs through the gate; the figures and each row's final verdict."""
    rng = np.random.default_rng(seed)
    cap = job.max_processes
    shape = (jobs, job.tests, job.rows, cap)
    current = _side_values(rng, job, shape)
    effect = np.zeros((1, job.tests, 1, 1))
    effect[:, : job.slowed_tests] = np.log1p(job.slowdown)
    current = current + effect + np.log1p(job.drift)
    reference = _side_values(rng, job, (jobs, job.tests, job.rows, job.baseline_processes))
    schedule = procedure.Schedule.every_round(job.processes, cap, job.alpha, family=job.tests * job.rows)
    verdicts = np.full((jobs, job.tests, job.rows), None, dtype=object)
    used = np.zeros((jobs, job.tests), dtype=int)
    for look in schedule.looks:
        open_tests = np.array([[any(v is None for v in rows) for rows in test] for test in verdicts])
        if not open_tests.any():
            break
        used[open_tests] = look
        cur = np.exp(current[open_tests][..., :look])  # the open tests' rows, this look's processes
        ref = np.exp(reference[open_tests])
        decided = procedure.decide(stats.unpaired(ref, cur, better="lower"), rtol=job.rtol, schedule=schedule,
                                   units=look, final=look == schedule.cap)
        sub = verdicts[open_tests]
        undecided = np.vectorize(lambda v: v is None, otypes=[bool])(sub)
        sub[undecided] = decided.verdicts[undecided]  # a decided row keeps its verdict
        verdicts[open_tests] = sub
    flat = verdicts.reshape(jobs, -1)
    regressed = flat == Verdict.REGRESSED
    inconclusive = flat == Verdict.INCONCLUSIVE
    figures = Figures(jobs, float((regressed | inconclusive).any(1).mean()), float(regressed.any(1).mean()),
                      float(regressed.mean()), float(inconclusive.mean()), float((flat == Verdict.PASS).mean()),
                      float(np.median(used)), float(used.mean()))
    return figures, verdicts


def cells(rtol: float) -> tuple[tuple[str, Job], ...]:
    """(label, job): unchanged code, clean and disturbed, a baseline that aged, slowdowns, and one at 75% of the
    tolerance."""
    return (
        ("A/A, clean", Job()),
        ("A/A, disturbed", Job(disturbed=0.1)),
        ("A/A, the baseline 5% faster (aged)", Job(drift=0.05)),
        ("+10%, clean", Job(slowdown=0.10, tests=2)),
        ("+10%, disturbed", Job(slowdown=0.10, tests=2, disturbed=0.1)),
        ("+20%, clean", Job(slowdown=0.20, tests=2)),
        (f"+{0.75 * rtol:.2%} (75% of rtol), clean", Job(slowdown=0.75 * rtol, tests=2)),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--rtol", type=float, default=Job.rtol)
    parser.add_argument("--processes", type=int, default=Job.processes)
    parser.add_argument("--max-processes", type=int, default=Job.max_processes)
    parser.add_argument("--baseline-processes", type=int, default=Job.baseline_processes)
    parser.add_argument("--noise", type=float, default=Job.noise, help="log sd of one process's value")
    parser.add_argument("--tests", type=int, default=Job.tests, help="tests of an A/A job")
    parser.add_argument("--rows", type=int, default=Job.rows, help="gated rows per test")
    args = parser.parse_args(argv)
    for label, job in cells(args.rtol):
        job = Job(**{**job.__dict__, "rtol": args.rtol, "processes": args.processes, "noise": args.noise,
                     "max_processes": args.max_processes, "baseline_processes": args.baseline_processes,
                     "rows": args.rows, "tests": args.tests if job.tests > 2 else job.tests})
        figures, _ = simulate(job, args.jobs if not job.slowdown else max(args.jobs // 4, 50), args.seed)
        print(figures.line(f"{label} ({job.tests} tests x {job.rows} rows)"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
