"""The gate's operating characteristics on synthetic jobs: how often a job goes red, how often a slowdown is
caught, how many processes it takes. It drives the gate's own functions (judge/stats.py's estimates,
judge/procedure.py's schedule and decisions, look by look as the controller runs them) with synthetic
per-process medians, so a change of the procedure shows here before it reaches a real job.

A job is `tests` benchmark tests of `rows` gated rows each (metric x batch size). Every process of one side
and round gets, per test, a log-normal value per row (sd `noise`); in A/B mode the two processes of a round
share the machine's state (correlation `rho`), so a pair's log ratio scatters by noise * sqrt(2 (1 - rho)).
Disturbed processes (probability `disturbed`) are slowed by U(1.2, 2) on every row of their test, as a burst
on a shared runner does. A job is red when any row ends regressed or inconclusive (the README's recipe
fails on both).

    python scripts/gate_simulator.py                # the table of docs/notes/noise.md, "Synthetic jobs"
    python scripts/gate_simulator.py --jobs 2000    # tighter figures
    python scripts/gate_simulator.py --rtol 0 --noise 0.10 --jobs 1000   # only the p between noise and "regressed"
    python scripts/gate_simulator.py --rtol 0.05 --max-processes 25       # the shipped A/B defaults
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

    mode: str = "ab"  # "ab" (paired, against a ref) | "stored" (against a baseline of `baseline_processes`)
    tests: int = 18
    rows: int = 20
    slowdown: float = 0.0  # true slowdown of every row of the first `slowed_tests` tests (0.1 = 10%)
    slowed_tests: int = 18
    noise: float = 0.03  # log sd of one process's value
    rho: float = 0.5  # correlation of the A and B processes of one round
    disturbed: float = 0.0  # probability that a process is slowed by U(1.2, 2)
    drift: float = 0.0  # stored: the whole current side slower by this; A/B: a step hitting both sides
    processes: int = 5  # the first look
    max_processes: int = 40  # the cap
    baseline_processes: int = 8
    rtol: float = 0.03
    alpha: float = 0.01
    looks: str = "every_round"  # the plugin's worker schedule; "doubling": looks at the doublings only (before)

    @classmethod
    def shipped(cls, **fields: object) -> Job:
        """A job at the plugin's defaults for an A/B job on the cpu target: its rtol, first look and cap."""
        from pytest_llmperf.orchestrate import session  # the plugin's own defaults, so a change shows here

        first = session.DEFAULT_PROCESSES["cpu"]
        return cls(**{"rtol": session.DEFAULT_RTOL["ab"], "processes": first,
                      "max_processes": session.default_cap(first), **fields})


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


def _side_values(rng: np.random.Generator, job: Job, shape: tuple[int, ...], shared: np.ndarray | None) -> np.ndarray:
    """log values of one side: (jobs, tests, rows, processes)."""
    if shared is None:
        own = rng.normal(0.0, job.noise, shape)
    else:  # A and B of a round share part of the machine's state
        own = np.sqrt(job.rho) * shared + np.sqrt(1 - job.rho) * rng.normal(0.0, job.noise, shape)
    if job.disturbed:
        hit = rng.random(shape[:2] + (1, shape[3])) < job.disturbed
        own = own + np.where(hit, np.log(rng.uniform(1.2, 2.0, shape[:2] + (1, shape[3]))), 0.0)
    return own


def simulate(job: Job, jobs: int, seed: int = 0) -> tuple[Figures, np.ndarray]:
    """Run `jobs` synthetic jobs through the gate; the figures and each row's final verdict."""
    rng = np.random.default_rng(seed)
    cap = job.max_processes
    shape = (jobs, job.tests, job.rows, cap)
    shared = rng.normal(0.0, job.noise, shape) if job.mode == "ab" else None
    current = _side_values(rng, job, shape, shared)
    effect = np.zeros((1, job.tests, 1, 1))
    effect[:, : job.slowed_tests] = np.log1p(job.slowdown)
    current = current + effect
    if job.mode == "ab":
        reference = _side_values(rng, job, shape, shared)
        if job.drift:  # a step at a random round, on both sides from then on
            step = rng.integers(0, cap, (jobs, 1, 1, 1)) <= np.arange(cap)
            reference, current = reference + step * np.log1p(job.drift), current + step * np.log1p(job.drift)
    else:
        base_shape = (jobs, job.tests, job.rows, job.baseline_processes)
        reference = _side_values(rng, job, base_shape, None)
        current = current + np.log1p(job.drift)
    schedule = getattr(procedure.Schedule, job.looks)(job.processes, cap, job.alpha, family=job.tests * job.rows)
    verdicts = np.full((jobs, job.tests, job.rows), None, dtype=object)
    used = np.zeros((jobs, job.tests), dtype=int)
    for look in schedule.looks:
        open_tests = np.array([[any(v is None for v in rows) for rows in test] for test in verdicts])
        if not open_tests.any():
            break
        used[open_tests] = look
        cur = np.exp(current[open_tests][..., :look])  # the open tests' rows, this look's processes
        ref = np.exp(reference[open_tests][..., :look] if job.mode == "ab" else reference[open_tests])
        measure = stats.paired if job.mode == "ab" else stats.unpaired
        decided = procedure.decide(measure(ref, cur, better="lower"), rtol=job.rtol, schedule=schedule, units=look,
                                   final=look == schedule.cap)
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
    """The cells of docs/notes/noise.md's table ("Synthetic jobs (the simulator in the test suite)"), (label, job),
    the last a slowdown at 75% of the tolerance."""
    return (
        ("A/A, clean", Job()),
        ("A/A, disturbed", Job(disturbed=0.1)),
        ("A/A, 5% drift step", Job(drift=0.05)),
        ("+10%, clean", Job(slowdown=0.10, tests=2)),
        ("+10%, disturbed", Job(slowdown=0.10, tests=2, disturbed=0.1)),
        ("+5%, clean", Job(slowdown=0.05, tests=2)),
        ("+5%, disturbed", Job(slowdown=0.05, tests=2, disturbed=0.1)),
        (f"+{0.75 * rtol:.2%} (75% of rtol), clean", Job(slowdown=0.75 * rtol, tests=2)),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--rtol", type=float, default=Job.rtol)
    parser.add_argument("--processes", type=int, default=Job.processes)
    parser.add_argument("--max-processes", type=int, default=Job.max_processes)
    parser.add_argument("--noise", type=float, default=Job.noise, help="log sd of one process's value")
    parser.add_argument("--mode", choices=("ab", "stored"), default=Job.mode)
    parser.add_argument("--tests", type=int, default=Job.tests, help="tests of an A/A job")
    parser.add_argument("--rows", type=int, default=Job.rows, help="gated rows per test")
    parser.add_argument("--looks", choices=("every_round", "doubling"), default=Job.looks,
                        help="every_round: the plugin's (a look after every round, alpha spent at the doublings); "
                             "doubling: looks at the doublings only, as before 2026-11-27")
    args = parser.parse_args(argv)
    for label, job in cells(args.rtol):
        job = Job(**{**job.__dict__, "rtol": args.rtol, "processes": args.processes, "noise": args.noise,
                     "max_processes": args.max_processes, "mode": args.mode, "rows": args.rows, "looks": args.looks,
                     "tests": args.tests if job.tests > 2 else job.tests})
        figures, _ = simulate(job, args.jobs if not job.slowdown else max(args.jobs // 4, 50), args.seed)
        print(figures.line(f"{label} ({job.mode}, {job.tests} tests x {job.rows} rows)"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
