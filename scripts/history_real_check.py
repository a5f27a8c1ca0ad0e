"""The history's goals on real public CI histories (tests/data/history-real/), beside Apache Otava and asv run on the
same values in environments of their own (docs/history.md, "Real histories").

    python -m venv /tmp/otava && /tmp/otava/bin/pip install apache-otava
    python -m venv /tmp/asv && /tmp/asv/bin/pip install asv
    python scripts/history_real_check.py [--otava /tmp/otava/bin/otava] [--asv /tmp/asv/bin/python] [--last N]
        [--projects a,b] [--code DIR]

Per project, its series go into a store as a job's rows would (one run per commit, the commits in the source's
order), and are analysed as `pytest-llmperf history analyze` does. Printed per project and in all:
- confirmed alarms per 100 commits per series (confirmed changes, either direction), and failing ones;
- the alarms a person reads: confirmed regression events (this plugin: one per event; code without events: one per
  confirmed regression) and the distinct commits they start at; events labelled as moving most of a machine's series;
- the documented performance commits (their message says so) found: a change point within 2 commits of one in any
  series of the project (and a confirmed one);
- the time the analysis took (the store read and series built apart).
Otava (`otava analyze`, its defaults) and asv (`detect_regressions(detect_steps(y))`, regressions of at least 5% as
`asv publish` reports them) read the same values. `--code DIR` runs another checkout's pytest_llmperf (the rule of
an earlier commit: `git archive COMMIT | tar -x -C DIR`); `--last N` analyses only each series' newest N commits.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "history-real"
NEAR = 2  # commits a change point may lie from a documented commit and still find it

ASV_SCRIPT = """
import json, sys
from asv.step_detect import detect_regressions, detect_steps
out = []
for ys in json.load(sys.stdin):
    found = detect_regressions(detect_steps(ys), threshold=0.05)
    out.append([] if found is None or found[2] is None else [[int(a), int(b)] for a, b, *_ in found[2]])
print(json.dumps(out))
"""


def load(name: str) -> dict:
    return json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))


def rows(data: dict, last: int | None):
    """One run per commit of the project, the results of the series measured there."""
    from pytest_llmperf.history.records import Result, Run, SeriesId

    machine = data["project"]
    kept = [set(measured) for _, _, measured, _ in values_of(data, last)]
    runs, results = [], []
    for i, sha in enumerate(data["commits"]):
        run = Run(
            run_id=f"{sha}:stored", job_id=sha, started_at=f"2020-01-01T00:00:00Z+{i:06d}", commit_sha=sha,
            source="stored", target="ci", machine=machine, machine_fp="unknown", env_fp="unknown",
            commit_order=i + 1, on_default_branch=True,
        )  # fmt: skip
        found = []
        for s, keep in zip(data["series"], kept):
            value = s["values"][i]
            if i not in keep:
                continue
            key = SeriesId(s["name"], "value", 1, "ci", machine).key
            found.append(Result(run.run_id, s["name"], "value", 1, key, s["unit"], s["direction"], value, (value,)))
        if found:
            runs.append(run)
            results += found
    return runs, results


def ours(data: dict, last: int | None) -> dict:
    from pytest_llmperf.history import analysis
    from pytest_llmperf.history.databases import Location
    from pytest_llmperf.history.series import build
    from pytest_llmperf.history.store import Store

    runs, results = rows(data, last)
    with tempfile.TemporaryDirectory() as tmp, Store(Location("sqlite", f"{tmp}/h.sqlite")) as store:
        store.append(runs, results)
        started = time.perf_counter()
        built = build(store.runs(), store.results())
        read = time.perf_counter() - started
        started = time.perf_counter()
        analyses = analysis.analyze(built)
        took = time.perf_counter() - started
    position = {sha: i for i, sha in enumerate(data["commits"])}
    changes = [c for a in analyses for c in a.changes]
    confirmed = [c for c in changes if c.state == "confirmed"]
    try:
        from pytest_llmperf.history.analysis import events
    except ImportError:  # a checkout before events (--code)
        events = None
    if events is not None:
        found_events = events(analyses, analysis.DEFAULT_MIN_EFFECT)
        regressions = [e for e in found_events if e.state == "confirmed" and e.kind == "regression"]
        read_commits = {e.first_bad for e in regressions}
        shared = sum(bool(e.shared) for e in regressions)
        failing = sum(e.fails for e in found_events)
    else:
        regressions = [c for c in confirmed if c.kind == "regression"]
        read_commits = {c.first_bad for c in regressions}
        shared = 0
        failing = sum(c.fails(analysis.DEFAULT_MIN_EFFECT) for c in changes)
    commits = sum(len(a.series.points) - getattr(a, "first", 0) for a in analyses)
    return {
        "series": len(analyses),
        "commits": commits,
        "confirmed": len(confirmed),
        "failing": failing,
        "read": len(regressions),
        "read_commits": len(read_commits),
        "shared": shared,
        "points": {position[c.first_bad] for c in changes},
        "confirmed_points": {position[c.first_bad] for c in confirmed},
        "time": took,
        "read_time": read,
        "skipped": sum(bool(a.warnings) and not a.changes for a in analyses),
    }


def values_of(data: dict, last: int | None) -> list[tuple[str, int, list[int], list[float]]]:
    out = []
    for s in data["series"]:
        at = [i for i, v in enumerate(s["values"]) if v is not None]
        at = at[-last:] if last else at
        out.append((s["name"], s["direction"], at, [s["values"][i] for i in at]))
    return out


def otava(binary: str, data: dict, last: int | None) -> dict:
    """Otava's change points on the same values (its CLI, its defaults); the time of the one call."""
    series = values_of(data, last)
    with tempfile.TemporaryDirectory() as tmp:
        tests = []
        for n, (_, direction, _, values) in enumerate(series):
            path = Path(tmp) / f"s{n}.csv"
            lines = ["time,value"] + [f"2000-01-01 {i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d} +0000,{v!r}"
                                      for i, v in enumerate(values)]  # fmt: skip
            path.write_text("\n".join(lines) + "\n")
            tests.append(
                f"  s{n}:\n    type: csv\n    file: {path}\n    time_column: time\n    metrics:\n      value:\n"
                f"        column: value\n        direction: {direction}\n"
            )
        config = Path(tmp) / "otava.yaml"
        config.write_text("tests:\n" + "".join(tests))
        env = {**os.environ, "OTAVA_CONFIG": str(config)}
        started = time.perf_counter()
        done = subprocess.run(
            [binary, "analyze", *[f"s{n}" for n in range(len(series))], "--since", "1999-12-31", "--output", "json"],
            capture_output=True, text=True, env=env, check=True, timeout=3000,
        )  # fmt: skip
        took = time.perf_counter() - started
    found: dict[str, list] = {}
    for line in done.stdout.splitlines():  # one JSON object a test
        if line.startswith("{"):
            found.update(json.loads(line))
    points, regressions = set(), 0
    for n, (_, direction, at, _) in enumerate(series):
        for point in found.get(f"s{n}", []):
            for metric in point.get("changes", []):
                points.add(at[int(metric["index"])])
                if float(metric.get("forward_change_percent", 0)) * direction < 0:
                    regressions += 1
    total = sum(len(found.get(f"s{n}", [])) for n in range(len(series)))
    return {"points": points, "count": total, "regressions": regressions, "time": took}


def asv(python: str, data: dict, last: int | None) -> dict:
    """asv's regressions of at least 5% (`asv publish`'s threshold) on the same values, lower is better."""
    series = values_of(data, last)
    ys = [[v if direction < 0 else 1.0 / v for v in values] for _, direction, _, values in series]
    started = time.perf_counter()
    done = subprocess.run([python, "-c", ASV_SCRIPT], input=json.dumps(ys), capture_output=True, text=True,
                          check=True, timeout=3000)  # fmt: skip
    took = time.perf_counter() - started
    found = json.loads(done.stdout)
    points = {at[b] for (_, _, at, _), steps in zip(series, found) for _, b in steps}
    return {"points": points, "count": sum(len(s) for s in found), "time": took}


def found(documented: list[int], points: set[int]) -> int:
    return len(found_at(documented, points))


def found_at(documented: list[int], points: set[int]) -> list[int]:
    return [d for d in documented if any(abs(d - p) <= NEAR for p in points)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--otava")
    parser.add_argument("--asv")
    parser.add_argument("--last", type=int)
    parser.add_argument("--projects", help="comma-separated names (default: every file of the extract)")
    parser.add_argument("--code", type=Path, help="the checkout whose pytest_llmperf to run (default: this one)")
    args = parser.parse_args()
    sys.path.insert(0, str(args.code.resolve() if args.code else ROOT))
    names = args.projects.split(",") if args.projects else sorted(p.name[: -len(".json.gz")] for p in DATA.glob("*.gz"))
    total = dict.fromkeys(("series", "commits", "confirmed", "failing", "read", "read_commits", "shared", "time"), 0)
    total.update(documented=0, found=0, found_confirmed=0, otava=0, otava_found=0, asv=0, asv_found=0)
    for name in names:
        data = load(name)
        position = {sha: i for i, sha in enumerate(data["commits"])}
        documented = [position[d["commit"]] for d in data["documented"]]
        mine = ours(data, args.last)
        for key in ("series", "commits", "confirmed", "failing", "read", "read_commits", "shared", "time"):
            total[key] += mine[key]
        line = (
            f"{name}: {mine['series']} series, {mine['commits']} commits; confirmed {mine['confirmed']} "
            f"({100 * mine['confirmed'] / max(mine['commits'], 1):.2f} per 100 commits per series), failing "
            f"{mine['failing']}; regressions to read {mine['read']} at {mine['read_commits']} commits "
            f"({mine['shared']} labelled as most of the machine's series); documented found "
            f"{found(documented, mine['points'])}/{len(documented)} ({found(documented, mine['confirmed_points'])} "
            f"confirmed); analysis {mine['time']:.2f} s (store read {mine['read_time']:.2f} s)"
        )
        if documented:
            shas = [data["commits"][d][:8] for d in found_at(documented, mine["points"])]
            line += f"\n    documented commits found: {' '.join(shas) or '-'}"
        total["documented"] += len(documented)
        total["found"] += found(documented, mine["points"])
        total["found_confirmed"] += found(documented, mine["confirmed_points"])
        for tool, command, measure, what in (("Otava", args.otava, otava, "change points"),
                                             ("asv", args.asv, asv, "regressions at 5%")):  # fmt: skip
            if not command:
                continue
            theirs = measure(command, data, args.last)
            total[tool.lower()] += theirs["count"]
            total[f"{tool.lower()}_found"] += found(documented, theirs["points"])
            line += (
                f"\n    {tool}: {theirs['count']} {what} ({100 * theirs['count'] / max(mine['commits'], 1):.2f} per "
                f"100 commits per series)"
                + (f", {theirs['regressions']} regressions" if "regressions" in theirs else "")
                + f", documented found {found(documented, theirs['points'])}/{len(documented)}, {theirs['time']:.1f} s"
            )
        print(line, flush=True)
    rate = 100 * total["confirmed"] / max(total["commits"], 1)
    print(
        f"all: {total['series']} series, {total['commits']} commits; confirmed {total['confirmed']} ({rate:.2f} per "
        f"100 commits per series), failing {total['failing']}; regressions to read {total['read']} at "
        f"{total['read_commits']} commits ({total['shared']} labelled as most of the machine's series); documented "
        f"found {total['found']}/{total['documented']} ({total['found_confirmed']} confirmed); analysis "
        f"{total['time']:.1f} s"
        + (f"; Otava {total['otava']} change points, found {total['otava_found']}" if args.otava else "")
        + (f"; asv {total['asv']} regressions, found {total['asv_found']}" if args.asv else "")
    )


if __name__ == "__main__":
    main()
