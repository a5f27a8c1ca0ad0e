"""Replay the shipped suite's per-process medians as a history of jobs on main, with injected changes, through the
history's store, analysis and HTML report (docs/history.md, "A replayed history").

    python scripts/history_replay.py OUT [--jobs 60] [--seed 0] [--baselines baselines/cpu/<machine>/benchmarks]

Makes a git repository OUT/repo whose main has one commit per job, some of them merges of a feature branch (whose
own commits are never measured: the series follows main's first-parent line). Each job draws, per series, 5 of the
per-process medians at the level and spread a recorded baseline's hold (log-normal; `--draw resample` resamples the
recorded values themselves, seeded), scaled by the injected changes, and writes
its rows file as a job does (history/rows.py). `pytest-llmperf history import` merges them into OUT/history.sqlite;
the analysis is written to OUT/reports/history.json and the page to OUT/reports/index.html. Prints the injected
changes and what the analysis found. `--streamed` also replays every series with nothing injected commit by commit,
as a job at every commit analyses it, and counts the alarms confirmed (each once, however long it lasted).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_llmperf.cli import main as cli_main  # noqa: E402
from pytest_llmperf.history import rows, series, summary  # noqa: E402
from pytest_llmperf.history.alarms import first_confirmations  # noqa: E402
from pytest_llmperf.history.analysis import analyze  # noqa: E402
from pytest_llmperf.history.databases import Location  # noqa: E402
from pytest_llmperf.history.detect import DEFAULT_METHOD  # noqa: E402
from pytest_llmperf.history.records import Result, Run, SeriesId  # noqa: E402
from pytest_llmperf.history.store import Store  # noqa: E402
from pytest_llmperf.measure.metrics import METRICS  # noqa: E402
from pytest_llmperf.report.html import write_index  # noqa: E402

DEFAULT_BASELINES = ROOT / "baselines" / "cpu" / "intel-xeon-f6-m167-s1-amxbf16" / "benchmarks"
METRICS_REPLAYED = ("prefill_ms", "decode_token_ms", "throughput_tokens_per_s")
PROCESSES = 5
GIT_ENV = {"GIT_AUTHOR_NAME": "replay", "GIT_AUTHOR_EMAIL": "r@e", "GIT_COMMITTER_NAME": "replay",
           "GIT_COMMITTER_EMAIL": "r@e"}  # fmt: skip


@dataclass(frozen=True)
class Injected:
    test: str  # a substring of the test id
    metric: str
    batch_size: int
    steps: tuple[tuple[int, float], ...] = ()  # (job, relative change of the level)
    outlier: tuple[int, float] | None = None  # (job, relative size) of one slow job

    def factor(self, job: int) -> float:
        level = float(np.prod([1 + size for at, size in self.steps if job >= at]))
        return level * (1 + self.outlier[1] if self.outlier and self.outlier[0] == job else 1.0)


INJECTED = (
    # On the series quiet enough to see them on the machine these baselines come from (docs/history.md).
    Injected("[llama]", "prefill_ms", 4, steps=((20, 0.08),)),  # prefill 8% slower from job 20
    Injected("[llama]", "throughput_tokens_per_s", 4, steps=((38, -0.12),)),  # throughput 12% lower from job 38
    Injected("[fp32]", "prefill_ms", 8, steps=((15, 0.03), (30, 0.03), (45, 0.03))),  # creep: three 3% steps
    Injected("[llama]", "prefill_ms", 2, outlier=(50, 0.30)),  # one job 30% slow
)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV})  # fmt: skip
    return done.stdout.strip()


def make_repo(repo: Path, jobs: int) -> list[str]:
    """main with `jobs` first-parent commits, every 4th a merge of a two-commit feature branch; their shas."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for job in range(jobs):
        if job % 4 == 3:
            git(repo, "checkout", "-q", "-b", f"feature{job}")
            for k in range(2):
                git(repo, "commit", "-q", "--allow-empty", "-m", f"feature {job}.{k}")
            git(repo, "checkout", "-q", "main")
            git(repo, "merge", "-q", "--no-ff", "-m", f"merge feature {job}", f"feature{job}")
        else:
            git(repo, "commit", "-q", "--allow-empty", "-m", f"commit {job}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    return shas


def recorded(baselines: Path) -> dict[tuple[str, str, int], list[float]]:
    """(test, metric, batch size) -> the per-process medians the baselines recorded."""
    found = {}
    for path in sorted(baselines.glob("*.json")):
        data = json.loads(path.read_text())
        for key, entry in data["benchmarks"].items():
            for bs, metrics in entry["values"].items():
                for metric in METRICS_REPLAYED:
                    if len(metrics.get(metric, [])) >= 3:
                        found[(f"{data['module']}::{key}", metric, int(bs))] = list(metrics[metric])
    return found


def draw(medians: list[float], rng: np.random.Generator, how: str) -> np.ndarray:
    """PROCESSES per-process medians: resampled from the recorded ones, or drawn log-normal at their median and
    spread (their median absolute deviation of logarithms / 0.6745)."""
    if how == "resample":
        return rng.choice(medians, PROCESSES)
    logs = np.log(medians)
    spread = float(np.median(np.abs(logs - np.median(logs)))) / 0.6745
    return np.exp(rng.normal(float(np.median(logs)), spread, PROCESSES))


def job_rows(job: int, sha: str, repo: Path, line: list[str], source: dict, rng: np.random.Generator, how: str):
    placed = series.place(repo, sha, line)
    run_id = f"replay{job:03d}:stored"
    run = Run(run_id=run_id, job_id=f"replay{job:03d}", started_at=f"2026-01-01T{job // 60:02d}:{job % 60:02d}:00Z",
              commit_sha=sha, source="stored", target="cpu", machine="replayed", machine_fp="hw", env_fp="env",
              commit_time=placed.time if placed else None, commit_order=placed.order if placed else None,
              branch="main", on_default_branch=True, env={"replayed": True})  # fmt: skip
    results = []
    for (test, metric, bs), medians in source.items():
        factor = np.prod(
            [i.factor(job) for i in INJECTED if i.test in test and i.metric == metric and i.batch_size == bs]
        )
        drawn = tuple(float(v) * float(factor) for v in draw(medians, rng, how))
        key = SeriesId(test, metric, bs, "cpu", "replayed").key
        direction = 1 if METRICS[metric].better == "higher" else -1
        results.append(
            Result(run_id, test, metric, bs, key, METRICS[metric].unit, direction, float(np.median(drawn)), drawn)
        )
    return run, results


def replay(
    out: Path, jobs: int = 60, seed: int = 0, baselines: Path = DEFAULT_BASELINES, how: str = "lognormal"
) -> dict:
    repo, reports = out / "repo", out / "reports"
    shas = make_repo(repo, jobs)
    line = series.first_parent_line(repo, "main")
    source = recorded(baselines)
    rng = np.random.default_rng(seed)
    rows_files = []
    for job, sha in enumerate(shas):
        run, results = job_rows(job, sha, repo, line, source, rng, how)
        rows_files.append(rows.append(out / "jobs" / f"{job:03d}" / rows.FILE_NAME, [run], results))
    store = out / "history.sqlite"
    cli_main(["history", "--store", str(store), "import", *map(str, rows_files)])
    with Store(
        __import__("pytest_llmperf.history.databases", fromlist=["Location"]).Location("sqlite", str(store))
    ) as opened:
        built = series.build(opened.runs(), opened.results(), line)
        analyses = analyze(built, marks=opened.marks())
        data = summary.document(analyses, DEFAULT_METHOD, 0.05, str(store))
    reports.mkdir(parents=True)
    (reports / "history.json").write_text(json.dumps(data, indent=1, sort_keys=True))
    document = {"device": "cpu", "created": "replayed", "benchmarks": [], "settings": {"report_dir": str(reports)}}
    write_index([document], reports / "index.html")
    return {"shas": shas, "analysis": data, "index": reports / "index.html", "series": built}


def injected_into(sid: SeriesId) -> bool:
    return any(i.test in sid.test and i.metric == sid.metric and i.batch_size == sid.batch_size for i in INJECTED)


def streamed(built: dict) -> tuple[int, int, int]:
    """(alarms, series, commits): the series with nothing injected, replayed as analysed after every commit."""
    quiet = [s for s in built.values() if not injected_into(s.id)]
    alarms = sum(len(first_confirmations([p.value for p in s.points], DEFAULT_METHOD)) for s in quiet)
    return alarms, len(quiet), sum(len(s.points) for s in quiet)


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("out", type=Path)
    args.add_argument("--jobs", type=int, default=60)
    args.add_argument("--seed", type=int, default=0)
    args.add_argument("--baselines", type=Path, default=DEFAULT_BASELINES)
    args.add_argument("--draw", choices=("lognormal", "resample"), default="lognormal")
    args.add_argument("--streamed", action="store_true", help="count the alarms of a job at every commit")
    a = args.parse_args()
    done = replay(a.out, a.jobs, a.seed, a.baselines, a.draw)
    for i in INJECTED:
        print(f"injected: {i}")
    for change in done["analysis"]["changes"]:
        job = done["shas"].index(change["first_bad"])
        print(f"found: job {job} {change['state']} {change['change']:+.1%} {change['series']}")
    for item in done["analysis"]["creep"]:
        print(f"creep: {item['drift']:+.1%} {item['series']}")
    if a.streamed:
        alarms, quiet, commits = streamed(done["series"])
        print(
            f"streamed: {alarms} alarm(s) confirmed in {quiet} series with nothing injected, analysed after every "
            f"commit ({100 * alarms / commits:.2f} per 100 commits per series)"
        )
    print(f"wrote {done['index']}")


if __name__ == "__main__":
    main()
