"""The issue-52 comparison: this plugin's A/B gate against asv (airspeed velocity) on the same question, as users run
them, the tools taking turns job by job.

The user project (scripts/user_engine_project.py): the README's own-backend shape, a `decode_step()` of about 3 ms of
numpy, a commit that makes it 10% slower and one that only adds a comment. Each job compares `main` with one of them:

- ours at its defaults: `pytest tests/perf --llmperf-compare=main` in the commit's checkout;
- asv tuned: `asv continuous -f 1.05 -a rounds=10 -a repeat=20 main COMMIT`;
- asv at its defaults: `asv continuous main COMMIT`.

asv builds each commit into a virtualenv offline (asv.conf.json: `pip wheel --no-index`, numpy from a local wheel);
one untimed asv job first builds its environments, as a CI cache would hold them. Conditions: `quiet` (nothing
started beside the jobs) and `busy` (a process spinning on one core for the whole job). For each job: the exit status,
wall time, what it said and the load average; for ours also every row's verdict and the interval it showed. The truth
(decode_step() of each commit timed directly, fresh processes alternating) is measured before the jobs.

    python scripts/gate_vs_asv.py --jobs 20 --condition quiet --condition busy --out DIR
    flock /tmp/llmperf-heavy.lock python scripts/gate_vs_asv.py --jobs 20 ...    # on a shared machine

Run it with an interpreter that imports pytest-llmperf (e.g. .tox/test/bin/python); asv is installed into its own
venv (--asv-venv, created if missing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import user_engine_project as project  # scripts/ is on sys.path when this script runs

TOOLS = {
    "ours": None,  # pytest tests/perf --llmperf-compare=main
    "asv tuned": ["-f", "1.05", "-a", "rounds=10", "-a", "repeat=20"],
    "asv defaults": [],
}
CHANGES = ("unchanged", "slower")  # the commits compared with main: `comment` and `slower`


@dataclass
class Outcome:
    tool: str
    condition: str
    change: str
    rc: int
    seconds: float
    load: tuple[float, float]  # 1-minute load average at the start and the end
    regressed: bool  # called regressed (ours: a row regressed; asv: "PERFORMANCE DECREASED")
    increased: bool = False  # asv: "PERFORMANCE INCREASED" (a false improvement, at exit 0)
    inconclusive: bool = False  # ours: a row inconclusive
    rows: list[dict] = field(default_factory=list)  # ours: metric, batch size, verdict, ratio, low, high, note
    said: str = ""

    @property
    def red(self) -> bool:
        return self.rc != 0


def run(command: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> tuple[int, float, str]:
    start = time.monotonic()
    job = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = job.communicate()
    except BaseException:  # stopped (SIGTERM): the job stops its workers and removes its worktree, as a user's would
        job.terminate()
        job.wait(60)
        raise
    seconds = time.monotonic() - start
    text = out + err
    log.write_text(f"$ {' '.join(command)}\n{text}")
    return job.returncode, seconds, text


@contextlib.contextmanager
def load(condition: str) -> Iterator[None]:
    """`busy`: one core kept busy (a Python process spinning) while the job runs."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if condition == "busy" else None
    try:
        yield
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()


def ours(root: Path, commit: str, out: Path, extra: list[str]) -> tuple[int, float, str, dict]:
    subprocess.run(["git", "checkout", "-q", commit], cwd=root, check=True)
    report = out.with_suffix(".json")
    rc, seconds, text = run([sys.executable, "-m", "pytest", "tests/perf", "-p", "no:cacheprovider",
                             "--llmperf-compare=main", f"--llmperf-json={report}", *extra], root, out.with_suffix(".log"))
    data = json.loads(report.read_text()) if report.exists() else {}
    subprocess.run(["git", "checkout", "-q", "main"], cwd=root, check=True)
    return rc, seconds, text, data


def asv_job(asv: Path, root: Path, commit: str, options: list[str], out: Path) -> tuple[int, float, str]:
    return run([str(asv), "continuous", *options, "main", commit], root, out.with_suffix(".log"))


def asv_env(asv: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{asv.parent}{os.pathsep}{os.environ['PATH']}"}


def prepare_asv(venv: Path) -> Path:
    """asv (and virtualenv, its environments' builder) in `venv`, installed with pip where missing."""
    asv = venv / "bin" / "asv"
    if not asv.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "asv", "virtualenv"], check=True)
    return asv


def wheels(where: Path) -> Path:
    """numpy (this interpreter's version), setuptools and wheel as local wheels: asv's environments install offline."""
    import numpy

    where.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(where), f"numpy=={numpy.__version__}",
                    "setuptools", "wheel"], check=True, capture_output=True)
    return where


def describe_ours(data: dict, truth: dict[tuple[str, int], float]) -> tuple[bool, bool, list[dict]]:
    rows = []
    for row in data.get("verdicts", []):
        if row.get("ci_low") is None:
            continue
        known = truth.get((row["metric"], row["batch_size"]))
        rows.append({"metric": row["metric"], "batch_size": row["batch_size"], "verdict": row["verdict"],
                     "ratio": row["ratio"], "low": row["ci_low"], "high": row["ci_high"], "note": row.get("note", ""),
                     "truth": known, "covers": None if known is None else row["ci_low"] <= known <= row["ci_high"]})
    verdicts = {r["verdict"] for r in rows}
    return "regressed" in verdicts, "inconclusive" in verdicts, rows


def truths(root: Path, commits: dict[str, str], processes: int) -> dict[str, dict[tuple[str, int], float]]:
    """The true ratios per change: unchanged code 1 on every row; the slower commit's decode_step() timed directly at
    batch sizes 1 and 4 (decode rows), its prefill unchanged (1); throughput depends on the mix: not known."""
    ratios = {b: project.truth(root, (commits["base"], commits["slower"]), processes, batch_size=b) for b in (1, 4)}
    unchanged = {(m, b): 1.0 for m in ("prefill_ms", "decode_token_ms", "throughput_tokens_per_s") for b in (1, 4)}
    slower = {("prefill_ms", b): 1.0 for b in (1, 4)} | {("decode_token_ms", b): r for b, r in ratios.items()}
    return {"unchanged": unchanged, "slower": slower}


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.0f}" if values else "-"


def table(outcomes: list[Outcome], condition: str) -> str:
    cell = [o for o in outcomes if o.condition == condition]
    loads = [x for o in cell for x in o.load]
    jobs = max((sum(o.tool == t and o.change == c for o in cell) for t in TOOLS for c in CHANGES), default=0)
    head = (f"| {jobs} jobs a cell (at most), {condition}, load "
            f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f} (median {statistics.median(loads) if loads else 0:.1f})"
            " | unchanged code red | 10% slower red | 10% slower called `regressed` | median job time (unchanged / slower) "
            "| shown intervals covering the truth |")
    lines = [head, "|---|---|---|---|---|---|"]
    for tool in TOOLS:
        same = [o for o in cell if o.tool == tool and o.change == "unchanged"]
        slow = [o for o in cell if o.tool == tool and o.change == "slower"]
        red_same = sum(o.red for o in same)
        why = ""
        if tool == "ours" and red_same:
            why = f" ({sum(o.inconclusive and not o.regressed for o in same)} inconclusive, {sum(o.regressed for o in same)} regressed)"
        if tool != "ours":
            up = sum(o.increased for o in same)
            why = f" (and {up} false \"performance increased\" at exit 0)" if up else ""
        missed = [o for o in slow if not o.regressed]
        miss = ""
        if tool == "ours" and missed:
            miss = f" ({sum(o.inconclusive for o in missed)} inconclusive, {sum(not o.red for o in missed)} passed)"
        covers = [r["covers"] for o in same + slow for r in o.rows if r["covers"] is not None]
        jobs_cover = [all(r["covers"] for r in o.rows if r["covers"] is not None) for o in same + slow if o.rows]
        coverage = (f"{sum(covers)} of {len(covers)} rows; all rows in {sum(jobs_cover)} of {len(jobs_cover)} jobs"
                    if covers else "-")
        lines.append(f"| {tool} | {red_same} of {len(same)}{why} | {sum(o.red for o in slow)} of {len(slow)} | "
                     f"{sum(o.regressed and o.red for o in slow)} of {len(slow)}{miss} | "
                     f"{median([o.seconds for o in same])} s / {median([o.seconds for o in slow])} s "
                     f"(max {max((o.seconds for o in same + slow), default=0):.0f} s) | {coverage} |")
    if any(o.tool == "ours" for o in cell):
        same = [o for o in cell if o.tool == "ours" and o.change == "unchanged"]
        slow = [o for o in cell if o.tool == "ours" and o.change == "slower"]
        lines.append(f"| ours, `--llmperf-fail-on` without inconclusive | {sum(o.regressed for o in same)} of "
                     f"{len(same)} | {sum(o.regressed for o in slow)} of {len(slow)} | {sum(o.regressed for o in slow)} "
                     f"of {len(slow)} | (the same jobs) | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3, help="jobs a cell (tool x condition x change)")
    parser.add_argument("--condition", action="append", choices=("quiet", "busy"), help="repeatable (default: both)")
    parser.add_argument("--tool", action="append", choices=list(TOOLS), help="repeatable (default: all three)")
    parser.add_argument("--asv-venv", type=Path, default=Path("/tmp/llmperf-asv-venv"))
    parser.add_argument("--out", type=Path, help="a directory for every job's log and report (default: temporary)")
    parser.add_argument("--truth-processes", type=int, default=16, help="fresh processes a commit to time the truth")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest options for our jobs")
    args = parser.parse_args()
    conditions = args.condition or ["quiet", "busy"]
    tools = args.tool or list(TOOLS)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still removes its temporary project
    work = Path(tempfile.mkdtemp(prefix="llmperf-vs-asv-"))
    out = args.out.resolve() if args.out else work / "jobs"
    out.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    try:
        asv = prepare_asv(args.asv_venv)
        root = work / "project"
        commits = project.make(root, python=f"{sys.version_info.major}.{sys.version_info.minor}",
                               wheels=wheels(work / "wheels"))
        targets = {"unchanged": commits["comment"], "slower": commits["slower"]}
        truth = truths(root, commits, args.truth_processes)
        print(f"truth: decode_step() slower / main, timed directly: "
              f"{', '.join(f'batch {b} {r:.3f}' for (m, b), r in truth['slower'].items() if m == 'decode_token_ms')}")
        env = asv_env(asv)
        subprocess.run([str(asv), "machine", "--yes"], cwd=root, env=env, check=True, capture_output=True)
        if any(t != "ours" for t in tools):  # builds both commits' environments: untimed, as a CI cache holds them
            subprocess.run([str(asv), "continuous", "main", targets["slower"]], cwd=root, env=env, capture_output=True)
            subprocess.run([str(asv), "continuous", "main", targets["unchanged"]], cwd=root, env=env, capture_output=True)
        for k in range(args.jobs):
            for condition in conditions:
                for change in CHANGES:
                    order = tools[k % len(tools):] + tools[: k % len(tools)]  # who goes first turns over
                    for tool in order:
                        name = out / f"{condition}_{change}_{tool.replace(' ', '-')}_{k + 1}"
                        start_load = os.getloadavg()[0]
                        with load(condition):
                            if tool == "ours":
                                rc, seconds, text, data = ours(root, targets[change], name, args.pytest_args)
                                regressed, inconclusive, rows = describe_ours(data, truth[change])
                                said = next((ln for ln in text.splitlines() if ln.startswith("llmperf: judged")), "")
                                outcome = Outcome(tool, condition, change, rc, seconds, (start_load, os.getloadavg()[0]),
                                                  regressed, inconclusive=inconclusive, rows=rows, said=said)
                            else:
                                rc, seconds, text = asv_job(asv, root, targets[change], TOOLS[tool], name)
                                ratio = re.search(r"\|\s*([+\-~ ]?)\s*\|[^|]*\|[^|]*\|\s*([\d.]+)\s*\|", text)
                                outcome = Outcome(tool, condition, change, rc, seconds,
                                                  (start_load, os.getloadavg()[0]), "PERFORMANCE DECREASED" in text,
                                                  increased="PERFORMANCE INCREASED" in text,
                                                  said=f"ratio {ratio.group(2)}" if ratio else "no change shown")
                        outcomes.append(outcome)
                        rows = "; ".join(f"{r['metric']}@{r['batch_size']} {r['verdict']} {r['ratio']:.3f} "
                                         f"[{r['low']:.3f}, {r['high']:.3f}]" for r in outcome.rows)
                        print(f"job {k + 1} {condition} {change} {tool}: exit {rc} in {seconds:.1f} s, load "
                              f"{outcome.load[0]:.1f}-{outcome.load[1]:.1f}; {outcome.said} {rows}", flush=True)
        (out / "outcomes.json").write_text(json.dumps([o.__dict__ for o in outcomes], indent=1))
    finally:
        for condition in conditions:
            print()
            print(table(outcomes, condition))
        shutil.rmtree(work / "project", ignore_errors=True)
        if not args.out:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
