"""What the history's analysis costs (docs/history.md, "Cost"): run it under the shared lock and say the load.

    flock /tmp/llmperf-heavy.lock python scripts/history_timing.py [--repeats 3]

Prints, each the best of `--repeats` runs (wall time, this process):
- 100 synthetic series of 200 commits (CV 3%, a 5% step at commit 100) analysed as `analyze` does, and the same for
  the newest 200 commits of each series of the real extract's django-asv (65 series);
- one series of 1000 commits analysed whole: synthetic at CV 1/3/10% with a step, and the real bsl-language-server
  and mountpoint-s3 histories' newest 1000 commits;
- the end of a job (`history/job.py`'s `append_job`, as `pytest_sessionfinish` calls it): its rows appended to a
  SQLite store holding 199 (then 999) earlier jobs on a git repository's first-parent line, the series built,
  analysed (going on from the checkpoints the job before kept: history/alarms.py), the analysis written, for
  jobs measuring 48, 144 and 288 series (12 a benchmark); the goal is 1 s plus 10 ms a series. Beside it, the same
  job where the one before kept no checkpoint (the series read whole: a first job, a rewritten history).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from pytest_llmperf.history.alarms import Analyses  # noqa: E402
from pytest_llmperf.history.analysis import analyze  # noqa: E402
from pytest_llmperf.history.databases import Location  # noqa: E402
from pytest_llmperf.history.job import append_job  # noqa: E402
from pytest_llmperf.history.rows import Job, job_rows  # noqa: E402
from pytest_llmperf.history.series import build  # noqa: E402
from pytest_llmperf.history.store import Store  # noqa: E402
from tests.history_rows import history_rows  # noqa: E402
from tests.history_synthetic import Case, history  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "history-real"
GIT = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}


def best(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def real(name: str, last: int) -> list[list[float]]:
    data = json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))
    return [[v for v in s["values"] if v is not None][-last:] for s in data["series"]]


def many_series(values: list[list[float]]):
    runs, rows = [], []
    for n, series in enumerate(values):
        r, v = history_rows(series, metric=f"metric{n}")
        runs, rows = r, rows + v  # the same runs (one per commit) for every series
    return build(runs, rows)


def outcomes(benchmarks: int):
    """A job's outcomes: `benchmarks` simulated benchmarks at 4 batch sizes (3 gated metrics: 12 series each)."""
    from pytest_llmperf.backends.simulated import SimulatedBackend
    from pytest_llmperf.judge.verdicts import Outcome, Status
    from pytest_llmperf.measure.runner import measure
    from pytest_llmperf.measure.scenario import Scenario

    scenario = Scenario(batch_sizes=(1, 2, 4, 8), runs=3, warmups=0)
    found = []
    for k in range(benchmarks):
        result = measure(SimulatedBackend(seed=k), scenario, key=f"b{k}", nodeid=f"t.py::b{k}", module="t.py")
        found.append(Outcome(result, Status.COMPARED))
    return found


def end_of_job(benchmarks: int, repeats: int, commits: int = 200) -> tuple[int, float, float]:
    """The end of a job on a repository of `commits` first-parent commits, after `commits - 1` earlier jobs on it:
    (series, seconds, seconds read whole). The job before it ended as a job does (`append_job`: its checkpoints
    kept, history/alarms.py), so the job measured goes on from them; "read whole" is the same job where the
    job before it kept none (the first job analysing a store, or one whose history was rewritten)."""
    measured = outcomes(benchmarks)
    best_time, best_whole, series = float("inf"), float("inf"), 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {**os.environ, **GIT}
        subprocess.run(["git", "init", "-q", "-b", "main", tmp], check=True, env=env)
        for i in range(commits):
            subprocess.run(["git", "-C", tmp, "commit", "-q", "--allow-empty", "-m", f"c{i}"], check=True, env=env)
        line = subprocess.run(["git", "-C", tmp, "rev-list", "--first-parent", "--reverse", "main"],
                              capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
        (root / ".gitignore").write_text("*\n")

        def job(sha: str, started_at: str = "2026-01-01T00:00:00Z") -> Job:
            """A job at commit `sha`, checked out."""
            subprocess.run(["git", "-C", tmp, "checkout", "-q", sha], check=True, env=env)
            fingerprint = {"git": {"commit": sha, "dirty": False}, "python": "3.11"}
            return Job("cpu", fingerprint, root, "machine", started_at=started_at)

        runs, results = job_rows(job(line[-1]), measured, line, False)
        pristine, store = root / "earlier.sqlite", root / ".llmperf" / "history.sqlite"
        rng = np.random.default_rng(0)
        with Store(Location("sqlite", str(pristine))) as opened:
            for i, sha in enumerate(line[:-2]):
                (run,) = runs
                earlier = dataclasses.replace(
                    run, run_id=f"e{i}:stored", job_id=f"e{i}", commit_sha=sha, commit_order=i + 1,
                    started_at=f"2025-01-01T{i // 60:02d}:{i % 60:02d}",
                )  # fmt: skip
                scaled = [
                    dataclasses.replace(r, run_id=earlier.run_id, value=r.value * (1 + rng.normal(0, 0.02)))
                    for r in results
                ]
                opened.append([earlier], scaled)
        series = len({r.series_key for r in results})
        for n in range(repeats):
            for keep in (True, False):
                store.parent.mkdir(exist_ok=True)
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{store}{suffix}").unlink(missing_ok=True)
                shutil.copy(pristine, store)
                before = job(line[-2], f"2026-01-01T00:00:{n:02d}Z")  # the commit before: checkpoints kept, or not
                check = "report" if keep else "off"
                append_job(measured, before, store=str(store), report_dir=root / "reports", check=check)
                now = job(line[-1], f"2026-01-01T00:01:{n:02d}Z")
                started = time.perf_counter()
                done = append_job(measured, now, store=str(store), report_dir=root / "reports")
                took = time.perf_counter() - started
                assert any("appended" in line for line in done.lines), done.lines
                if keep:
                    best_time = min(best_time, took)
                else:
                    best_whole = min(best_whole, took)
    return series, best_time, best_whole


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    analyze(many_series([list(history(Case(60, 0.03), s)) for s in range(2)]))  # imports and caches warm
    synthetic = many_series([list(history(Case(200, 0.03, ((100, 0.05),)), s)) for s in range(100)])
    print(f"100 synthetic series of 200 commits: {best(args.repeats, lambda: analyze(synthetic)):.2f} s (goal 2 s)")
    django = many_series(real("django-asv", 200))
    print(f"django-asv, 65 series, newest 200 commits: {best(args.repeats, lambda: analyze(django)):.2f} s")
    for cv in (0.01, 0.03, 0.10):
        values = list(history(Case(1000, cv, ((500, 0.05),)), 0))
        took = best(args.repeats, lambda values=values: Analyses(values).found())
        print(f"one synthetic series of 1000 commits, CV {cv:.0%}: {took * 1000:.0f} ms (goal 100 ms)")
    for name in ("bsl-language-server", "mountpoint-s3", "django-asv"):
        values = max(real(name, 1000), key=len)
        took = best(args.repeats, lambda values=values: Analyses(values).found())
        print(f"{name}, its longest series' newest {len(values)} commits: {took * 1000:.0f} ms")
    for commits in (200, 1000):
        for benchmarks in (4, 12, 24):
            series, took, whole = end_of_job(benchmarks, args.repeats, commits)
            print(
                f"end of a job measuring {series} series after {commits - 1} jobs: {took:.2f} s (goal "
                f"{1 + 0.01 * series:.2f} s); reading its series whole: {whole:.2f} s"
            )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
