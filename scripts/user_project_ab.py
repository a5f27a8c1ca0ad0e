"""What a pull request's A/B job costs a user: a small project of two benchmarks, measured as the README says.

Makes a user's project in a temporary git repository (tests/perf/test_tiny.py: the README's quickstart, tiny-llama
at batch sizes 1 and 2; tests/perf/test_engine.py: a Backend of the user's own that sleeps 3 ms a token), commits
it, and runs `pytest tests/perf --llmperf-device=cpu --llmperf-compare=HEAD` K times per condition (the
conditions taking turns): unchanged, or the engine's decode sleeping 10% longer in the working tree. Prints each
job's exit status, wall time, processes per side and summary line, then per condition the red jobs and the median
time. The plugin is the one this interpreter imports (run it with the environment you test).

    python scripts/user_project_ab.py --jobs 5 --condition 0 --condition 0.10 [-- extra pytest options]
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gate_power import processes_used  # scripts/ is on sys.path when this script runs

TINY = '''import pytest


@pytest.mark.llmperf(batch_sizes=[1, 2], sequence_length=64, decode_length=8)
def test_tiny_llama(llmperf, llmperf_hf):
    llmperf.measure(llmperf_hf("tiny-llama"))
'''

ENGINE = '''import time

import pytest
from pytest_llmperf import Backend, GenerationRequest, RunSample

TOKEN_S = 0.003
DECODE_SLOWDOWN = 1.0  # scripts/user_project_ab.py sets it in the working tree


class SleepingEngine(Backend):
    kind = "sleeping-engine"
    splits_prefill = True

    def generate(self, request: GenerationRequest) -> RunSample:
        start = time.perf_counter_ns()
        time.sleep(TOKEN_S)  # prefill
        times, steps = [time.perf_counter_ns() - start], []
        for _ in range(request.decode_length - 1):
            step = time.perf_counter_ns()
            time.sleep(TOKEN_S * DECODE_SLOWDOWN)
            steps.append(time.perf_counter_ns() - step)
            times.append(time.perf_counter_ns() - start)
        return RunSample(batch_size=request.batch_size, token_times_ns=[times] * request.batch_size,
                         end_to_end_ns=times[-1], prefill_ns=times[0], decode_steps_ns=steps)

    def describe(self) -> dict:
        return {"backend": self.kind}


@pytest.mark.llmperf(batch_sizes=[1, 4], sequence_length=64, decode_length=16)
def test_engine(llmperf):
    llmperf.measure(SleepingEngine())
'''


def make_project(root: Path) -> None:
    perf = root / "tests" / "perf"
    perf.mkdir(parents=True)
    (perf / "test_tiny.py").write_text(TINY)
    (perf / "test_engine.py").write_text(ENGINE)
    git = ["git", "-c", "user.email=u@example.com", "-c", "user.name=u"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "perf tests"], cwd=root, check=True)


def job(root: Path, slowdown: float, extra: list[str], out: Path) -> tuple[int, float, str]:
    """One A/B job with the engine's decode slowed by `slowdown` in the working tree (0: unchanged), its output and
    JSON report kept as `out`.log and .json; its exit status, seconds, and a line: the summary's first line, the
    processes per side, and every row that did not pass."""
    engine = root / "tests" / "perf" / "test_engine.py"
    engine.write_text(ENGINE.replace("DECODE_SLOWDOWN = 1.0", f"DECODE_SLOWDOWN = {1 + slowdown!r}"))
    report = out.with_suffix(".json")
    try:
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "tests/perf", "-q", "-p", "no:cacheprovider",
                               "--llmperf-device=cpu", "--llmperf-compare=HEAD", f"--llmperf-json={report}", *extra],
                              cwd=root, capture_output=True, text=True)
        seconds = time.monotonic() - start
    finally:
        subprocess.run(["git", "checkout", "-q", "--", "."], cwd=root, check=True)
    text = done.stdout + done.stderr
    out.with_suffix(".log").write_text(text)
    data = json.loads(report.read_text()) if report.exists() else {}
    summary = next((line for line in text.splitlines() if line.startswith("llmperf: judged")), "(no summary line)")
    red = [f"{row['key']} {row['metric']} batch {row['batch_size']}: {row['verdict']}"
           + (f" ({row['note']})" if row.get("note") else "")
           for row in data.get("verdicts", []) if row["verdict"] not in ("pass", "improved")]
    return done.returncode, seconds, (f"{processes_used(data)} processes per side at most; {summary}"
                                      + "".join(f"\n    {r}" for r in red))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3, help="jobs per condition")
    parser.add_argument("--condition", type=float, action="append",
                        help="the engine's decode slowdown in the working tree, e.g. 0 or 0.10 (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the project (its path is printed)")
    parser.add_argument("--out", type=Path, help="a directory for each job's output and JSON report (default: a "
                        "temporary one, removed at the end)")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest options for every job")
    args = parser.parse_args()
    conditions = args.condition or [0.0]
    root = Path(tempfile.mkdtemp(prefix="llmperf-user-project-"))
    # absolute: the jobs run in the project's directory
    outputs = args.out.resolve() if args.out else Path(tempfile.mkdtemp(prefix="llmperf-user-jobs-"))
    outputs.mkdir(parents=True, exist_ok=True)
    results: dict[float, list[tuple[int, float]]] = {c: [] for c in conditions}
    try:
        make_project(root)
        for k in range(args.jobs):
            for condition in conditions:
                out = outputs / f"job{k + 1}_decode_{round(condition * 100)}pct"
                rc, seconds, line = job(root, condition, args.pytest_args, out)
                results[condition].append((rc, seconds))
                print(f"job {k + 1} decode +{condition:.0%}: exit {rc} in {seconds:.0f} s, {line}", flush=True)
    finally:
        if args.keep:
            print(f"project: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
        if not args.out:
            shutil.rmtree(outputs, ignore_errors=True)
    for condition, rows in results.items():
        red = sum(rc != 0 for rc, _ in rows)
        times = [s for _, s in rows]
        if times:
            print(f"decode +{condition:.0%}: red in {red} of {len(rows)}; job time median "
                  f"{statistics.median(times):.0f} s ({min(times):.0f}-{max(times):.0f} s)")


if __name__ == "__main__":
    main()
