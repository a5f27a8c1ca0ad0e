"""Build the real-data extract of tests/data/history-real/ from the public repositories that publish it.

    python scripts/history_real_extract.py MIRRORS OUT

MIRRORS holds bare git mirrors named OWNER+NAME/repo (the search tool's `fetch` brings them); OUT gets one gzipped
JSON file per project: its source (repository, branch or path, the commit read), the commits in the order the source
gives them (oldest first), per series its values at those commits (null: not measured there), its unit and
direction, and the commits whose message says they change performance (`documented`), as the source's own data
records them. Nothing is computed: the values are the source's, rounded to 5 significant digits; a series
measured at fewer than `MIN_VALUES` commits is left out.

Sources (docs/history.md, "Real histories"):
- github-action-benchmark `data.js` on a gh-pages branch: pydantic/pydantic-core (pytest-benchmark, iter/sec),
  1c-syntax/bsl-language-server (one series, 1277 commits), awslabs/mountpoint-s3 (keeps the newest 30 entries:
  every version of the file in the branch's history is read and the entries are joined by commit).
- asv results committed to a repository: django/django-asv (results/ubuntu-latest, env conda-py3.12, GitHub's
  hosted runners) and OpenMathLib/BLAS-Benchmarks (gh-pages results/, its AWS Graviton runner).
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

# a commit message that says it changes speed (the documented performance commits the extract keeps)
PERF = re.compile(
    r"\b(perf(ormance)?|faster|speed(s|ed)?[- ]?up|optimi[sz]|slow(er|down)?|regression|quicker|latency)\b", re.I
)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def data_js(text: str) -> dict:
    return json.loads(text[text.index("{") :].rstrip().rstrip(";"))


MIN_VALUES = 20


def rounded(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.5g}")


def project(name: str, source: dict, commits: list[str], series: dict, documented: list[dict]) -> dict:
    index = {c: i for i, c in enumerate(commits)}
    out = []
    for (label, unit, direction), values in sorted(series.items()):
        if len(values) < MIN_VALUES:
            continue
        row = [None] * len(commits)
        for commit, value in values.items():
            row[index[commit]] = rounded(value)
        out.append({"name": label, "unit": unit, "direction": direction, "values": row})
    return {"project": name, "source": source, "commits": commits, "series": out, "documented": documented}


def from_data_js(repo: Path, name: str, files: list[str], every_version: bool) -> dict:
    """github-action-benchmark: entries per benchmark suite, each a commit with its benches."""
    branch_commit = git(repo, "rev-parse", "gh-pages").strip()
    entries: dict[str, dict] = {}  # commit id -> (time, message)
    series: dict[tuple, dict[str, float]] = {}
    for file in files:
        versions = git(repo, "log", "--format=%H", "gh-pages", "--", file).split() if every_version else ["gh-pages"]
        for version in reversed(versions):
            data = data_js(git(repo, "show", f"{version}:{file}"))
            for suite, items in data["entries"].items():
                for entry in items:
                    commit = entry["commit"]
                    entries.setdefault(commit["id"], {"time": commit["timestamp"], "message": commit["message"]})
                    for bench in entry["benches"]:
                        unit = bench.get("unit", "")
                        bigger = entry.get("tool") in ("pytest", "customBiggerIsBetter", "benchmarkjs") or "/s" in unit
                        key = (f"{suite} / {bench['name']}", unit, 1 if bigger else -1)
                        series.setdefault(key, {}).setdefault(commit["id"], float(bench["value"]))
    commits = sorted(entries, key=lambda c: entries[c]["time"])
    documented = [
        {"commit": c, "message": entries[c]["message"].splitlines()[0]}
        for c in commits
        if PERF.search(entries[c]["message"].splitlines()[0])
    ]
    source = {"repository": name, "branch": "gh-pages", "files": files, "commit": branch_commit,
              "order": "commit timestamp"}  # fmt: skip
    return project(name, source, commits, series, documented)


def from_asv(repo: Path, name: str, ref: str, machine: str, env: str) -> dict:
    """asv results: one file per (machine, commit, env); a benchmark's result is per its parameters' product."""
    ref_commit = git(repo, "rev-parse", ref).strip()
    units = json.loads(git(repo, "show", f"{ref}:results/benchmarks.json"))
    dates: dict[str, int] = {}
    series: dict[tuple, dict[str, float]] = {}
    for path in git(repo, "ls-tree", "--name-only", f"{ref}:results/{machine}/").split():
        if not path.endswith(f"-{env}.json"):
            continue
        data = json.loads(git(repo, "show", f"{ref}:results/{machine}/{path}"))
        commit = data["commit_hash"]
        dates[commit] = data["date"]
        for bench, row in data["results"].items():
            values, params = row[0], row[1]
            if not isinstance(values, list):
                values = [values]
            combos = [""]
            for axis in params or []:
                combos = [f"{c}({v})" if not c else f"{c}, ({v})" for c in combos for v in axis]
            for combo, value in zip(combos, values):
                if value is None or not isinstance(value, (int, float)):
                    continue
                unit = (units.get(bench) or {}).get("unit", "seconds")
                key = (f"{machine} / {bench}{' ' + combo if combo else ''}", unit, -1)
                series.setdefault(key, {})[commit] = float(value)
    commits = sorted(dates, key=lambda c: dates[c])
    source = {"repository": name, "ref": ref, "path": f"results/{machine}/*-{env}.json", "commit": ref_commit,
              "order": "asv's commit date"}  # fmt: skip
    return project(f"{name} ({machine}, {env})", source, commits, series, [])


def main() -> None:
    mirrors, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    done = {
        "pydantic-core": from_data_js(mirrors / "pydantic+pydantic-core/repo", "pydantic/pydantic-core",
                                      ["dev/bench/data.js"], False),
        "bsl-language-server": from_data_js(mirrors / "1c-syntax+bsl-language-server/repo",
                                            "1c-syntax/bsl-language-server", ["dev/bench/data.js"], False),
        "mountpoint-s3": from_data_js(mirrors / "awslabs+mountpoint-s3/repo", "awslabs/mountpoint-s3",
                                      ["dev/bench/data.js", "dev/latency_bench/data.js"], True),
        "django-asv": from_asv(mirrors / "django+django-asv/repo", "django/django-asv", "HEAD", "ubuntu-latest",
                               "conda-py3.12"),
    }  # fmt: skip
    blas = mirrors / "OpenMathLib+BLAS-Benchmarks/repo"
    done["blas-graviton"] = from_asv(blas, "OpenMathLib/BLAS-Benchmarks", "gh-pages", "gha-aws-graviton",
                                     "virtualenv-py3.12")  # fmt: skip
    for key, data in done.items():
        path = out / f"{key}.json.gz"
        path.write_bytes(gzip.compress((json.dumps(data, separators=(",", ":")) + "\n").encode(), mtime=0))
        print(f"{path}: {len(data['series'])} series, {len(data['commits'])} commits, "
              f"{len(data['documented'])} documented, {path.stat().st_size // 1024} KiB")  # fmt: skip


if __name__ == "__main__":
    main()
