"""`pytest-llmperf` / `python -m pytest_llmperf`: commands that work on reports after the tests ran.

pytest-llmperf report FILE... [--out DIR]   merge several targets' reports/<device>.json into one
pytest-llmperf migrate-baselines DIR...     convert baseline files of schema 2 to schema 3, measuring nothing
pytest-llmperf history ...                  the history store: import, analyze, changes, mark, exclude, export
pytest-llmperf bisect GOOD BAD [-- ARGS]    the first commit that made the benchmarks slower, by A/B jobs
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

DEFAULT_OUT = Path("reports") / "merged"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="pytest-llmperf", description="Work on pytest-llmperf's reports.")
    commands = top.add_subparsers(dest="command", required=True)
    report = commands.add_parser(
        "report",
        help="merge several hardware targets' JSON reports into one side-by-side report",
        description="Merge the reports/<device>.json files of several targets (e.g. a CI matrix's artifacts) "
        "into one report: per benchmark the targets side by side, then each target's verdicts.",
    )
    report.add_argument("files", nargs="+", type=Path, metavar="FILE", help="a target's reports/<device>.json")
    report.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"directory for merged.md and merged.json (default: {DEFAULT_OUT})",
    )
    migrate = commands.add_parser(
        "migrate-baselines",
        help="convert baseline files of an older schema to the current one, measuring nothing",
        description="Convert the baseline files under each DIR (recursively) from schema 2 (every run of every "
        "process) to schema 3 (what the gate tests, one line per metric and batch size). Files already "
        "converted are left as they are. Commit the result.",
    )
    migrate.add_argument("paths", nargs="+", type=Path, metavar="DIR", help="a baseline directory (or file)")
    # its own parser (history/cli.py): `pytest-llmperf history --help` lists its commands
    commands.add_parser("history", help="work on the history store (pytest-llmperf history --help)", add_help=False)
    # its own parser (bisection_run.py): the arguments after -- go to each step's pytest
    commands.add_parser(
        "bisect", help="find the commit that made the benchmarks slower (pytest-llmperf bisect --help)", add_help=False
    )
    return top


def migrate_baselines(paths: Sequence[Path]) -> int:
    from .judge.baselines import migrate

    done, errors = migrate(paths)
    for m in done:
        what = (
            f"converted: {m.entries} entries, {m.lines_before} -> {m.lines_after} lines"
            if m.converted
            else "already in the current schema, left as it is"
        )
        print(f"{m.path}: {what}")
    for text in errors:
        print(f"pytest-llmperf migrate-baselines: error: {text}", file=sys.stderr)
    converted = sum(m.converted for m in done)
    print(f"{converted} file(s) converted, {len(done) - converted} already current, {len(errors)} left with an error")
    return 2 if errors else 0


def bisect(argv: Sequence[str]) -> int:
    from .bisection_run import main as bisect_main

    return bisect_main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["history"]:
        from .history.cli import main as history_main

        return history_main(argv[1:], run_bisect=bisect)  # `history bisect ID` runs `bisect`
    if argv[:1] == ["bisect"]:
        return bisect(argv[1:])
    args = parser().parse_args(argv)
    if args.command == "migrate-baselines":
        return migrate_baselines(args.paths)
    from .report.cross_target import merge_reports
    from .report.stored import ReportError

    try:
        merged = merge_reports(args.files, args.out)
    except ReportError as exc:
        print(f"pytest-llmperf report: error: {exc}", file=sys.stderr)
        return 2
    labels = ", ".join(t["label"] for t in merged.document["targets"])
    print(f"merged {len(merged.documents)} report(s) ({labels}), {len(merged.document['benchmarks'])} benchmark(s)")
    for path in merged.written:
        print(f"wrote {path}")
    from .report.html import MissingExtra, write_index

    index = Path(merged.out_dir) / "index.html"
    try:
        write_index(merged.documents, index)  # the targets' plots on one page
        print(f"wrote {index}")
    except MissingExtra as exc:
        print(f"pytest-llmperf report: {exc}")
    except OSError as exc:
        print(f"pytest-llmperf report: error: cannot write {index}: {exc}", file=sys.stderr)
        return 2
    return 0
