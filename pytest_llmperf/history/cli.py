"""`pytest-llmperf history ...`: work on a history store from the command line.

    import FILE...            merge rows files (history-rows.jsonl of CI jobs) into the store, once each
    analyze [--fail]          analyse every series; write the analysis; exit 1 on a confirmed, unmarked regression
    changes [--state S]       list the changes found (newest analysis), with their ids
    mark ID --as STATE        mark a change expected or false_positive (--clear removes the mark)
    exclude RUN --reason R    set a run (or a whole job) aside from every series (--undo takes it back)
    export --format F --out D the series as Otava's CSV tests and config, or JSON lines
    migrate                   bring the store to this plugin's schema

The store: --store, else the environment variable LLMPERF_HISTORY, else .llmperf/history.sqlite.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from ..files import strict_json, write_text_atomic
from . import export, lineage, rowsfile, series, summary
from .analysis import DEFAULT_MIN_EFFECT, Change, analyze
from .backends import StoreError, parse_location
from .detect import DEFAULT_METHOD, RupturesMissing
from .records import MARK_STATES, Mark
from .settings import DEFAULT_STORE
from .store import Store

PROG = "pytest-llmperf history"


class BadArgument(Exception):
    """An argument the command cannot use (a ref git does not know); said in one line, exit 2."""


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog=PROG, description="Work on pytest-llmperf's history store (docs/history.md).")
    top.add_argument(
        "--store",
        help=f"the store: a SQLite path, sqlite:///PATH or postgresql://URL (default: "
        f"$LLMPERF_HISTORY, else {DEFAULT_STORE})",
    )
    commands = top.add_subparsers(dest="command", required=True)
    imp = commands.add_parser("import", help="merge rows files into the store (idempotent)")
    imp.add_argument("files", nargs="+", type=Path, metavar="FILE")
    for name, text in (("analyze", "analyse every series"), ("changes", "list the changes found")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument(
            "--repo",
            type=Path,
            default=Path("."),
            help="the git repository whose default branch "
            "orders the series (default: .; without it, the order the jobs recorded)",
        )
        sub.add_argument("--branch", help="the default branch (default: origin's HEAD, else main or master)")
        sub.add_argument("-k", dest="pattern", help="only series whose label matches this glob, e.g. '*decode*'")
        sub.add_argument("--target", help="only this hardware target")
        sub.add_argument("--anchor", help="the git ref creep is measured from (default: the oldest commit)")
        sub.add_argument(
            "--min-effect",
            type=float,
            default=DEFAULT_MIN_EFFECT,
            help=f"the smallest change that matters (default: {DEFAULT_MIN_EFFECT})",
        )
    analyze_cmd = commands.choices["analyze"]
    analyze_cmd.add_argument("--out", type=Path, help="write the analysis (JSON) here")
    analyze_cmd.add_argument(
        "--fail", action="store_true", help="exit 1 on a confirmed, unmarked regression still in effect"
    )
    commands.choices["changes"].add_argument(
        "--state",
        choices=("all", "confirmed", "provisional", "failing"),
        default="all",
        help="failing: what --llmperf-history-check=fail and analyze --fail fail on (default: all)",
    )
    mark = commands.add_parser("mark", help="mark a change (its id from `changes`)")
    mark.add_argument("change_id", metavar="ID", help="SERIES_KEY@COMMIT, as `changes` lists it")
    group = mark.add_mutually_exclusive_group(required=True)
    group.add_argument("--as", dest="state", choices=MARK_STATES)
    group.add_argument("--clear", action="store_true")
    mark.add_argument("--note", default="")
    exclude = commands.add_parser("exclude", help="set a run or a job aside from every series")
    exclude.add_argument("run_id", metavar="RUN", help="a run id (JOB:SIDE) or a job id")
    exclude.add_argument("--reason", default="")
    exclude.add_argument("--undo", action="store_true")
    out = commands.add_parser("export", help="write the series for other tools")
    out.add_argument("--format", choices=("otava", "jsonl"), default="otava")
    out.add_argument("--out", type=Path, required=True)
    out.add_argument("-k", dest="pattern", help="only series whose label matches this glob")
    out.add_argument("--repo", type=Path, default=Path("."))
    out.add_argument("--branch")
    commands.add_parser("migrate", help="bring the store to this plugin's schema")
    return top


def _open(args: argparse.Namespace) -> Store:
    text = args.store or os.environ.get("LLMPERF_HISTORY") or DEFAULT_STORE
    try:
        location = parse_location(text, Path.cwd())
    except ValueError as exc:
        raise StoreError(f"--store={exc}") from None
    if location is None:
        raise StoreError("the store is off: give --store PATH|URL")
    if location.dialect == "sqlite" and not Path(location.target).exists() and args.command != "import":
        raise StoreError(f"history store {location.target} does not exist: give --store, or run a job first")
    return Store(location)


def _series(store: Store, args: argparse.Namespace) -> dict[str, series.Series]:
    branch = lineage.default_branch(args.repo, args.branch)
    line = (lineage.first_parent_line(args.repo, branch) or None) if branch else None
    built = series.build(store.runs(), store.results(), line)
    return {
        k: s
        for k, s in built.items()
        if (not getattr(args, "pattern", None) or fnmatch.fnmatch(s.id.label(), f"*{args.pattern}*"))
        and (not getattr(args, "target", None) or s.id.target == args.target)
    }


def change_id(change: Change) -> str:
    return f"{change.series_key}@{change.first_bad[:12]}"


def change_line(change: Change) -> str:
    mark = f", marked {change.mark}" if change.mark else ""
    now = f", now {change.now:+.1%} against before" if change.now is not None else ""
    flags = "".join(
        f", {w} changed there"
        for w, on in (("environment", change.env_changed), ("machine", change.machine_changed))
        if on
    )
    return (
        f"{change_id(change)}  {change.state:<11} {change.kind:<11} {change.change:+7.1%}  {change.label}  "
        f"{change.last_good[:12]}..{change.first_bad[:12]}  {change.before:.4g} -> {change.after:.4g}{now}{mark}{flags}"
    )


def _analyze(store: Store, args: argparse.Namespace) -> int:
    anchor = (
        lineage.git(args.repo, "rev-parse", "--verify", "--quiet", f"{args.anchor}^{{commit}}") if args.anchor else None
    )
    if args.anchor and not anchor:
        raise BadArgument(f"--anchor {args.anchor} is no commit of the repository {args.repo} (--repo)")
    analyses = analyze(_series(store, args), min_effect=args.min_effect, anchor=anchor, marks=store.marks())
    changes = [c for a in analyses for c in a.changes]
    if args.command == "changes":
        shown = [
            c
            for c in changes
            if args.state in ("all", c.state) or (args.state == "failing" and c.fails(args.min_effect))
        ]
        for change in shown:
            print(change_line(change))
        print(f"{len(shown)} change(s) in {len(analyses)} series")
        return 0
    data = summary.document(analyses, DEFAULT_METHOD, args.min_effect, store.location.describe())
    if args.out:
        write_text_atomic(args.out, strict_json(data))
        print(f"wrote {args.out}")
    for change in changes:
        print(change_line(change))
    for item in data["creep"]:
        print(f"creep {item['drift']:+.1%} ({item['kind']}) in {item['series']} since {item['from'][:12]}")
    for warning in data["warnings"]:
        print(f"warning: {warning}")
    failing = [c for c in changes if c.fails(args.min_effect)]
    for change in failing:
        print(
            f"failing: {change_id(change)}, a regression of at least {args.min_effect:.0%} since the job at "
            f"{(change.reached_at or '')[:12]}, still in effect and not marked"
        )
    confirmed = sum(c.state == "confirmed" for c in changes)
    print(f"{len(analyses)} series, {len(changes)} change(s), {confirmed} confirmed, {len(failing)} failing")
    return 1 if args.fail and failing else 0


def _mark(store: Store, args: argparse.Namespace) -> int:
    key, _, prefix = args.change_id.partition("@")
    commits = {r.commit_sha for r in store.runs() if prefix and r.commit_sha.startswith(prefix)}
    if len(commits) != 1 or not store.results([key]):
        print(f"{PROG} mark: error: no change {args.change_id} (ids as `{PROG} changes` lists them)", file=sys.stderr)
        return 2
    (sha,) = commits
    if args.clear:
        print(f"{store.unmark(key, sha)} mark(s) removed")
        return 0
    store.mark(Mark(key, sha, args.state, args.note, datetime.now(timezone.utc).isoformat(timespec="seconds")))
    print(f"{args.change_id} marked {args.state}")
    return 0


def run(args: argparse.Namespace) -> int:
    parsed = rowsfile.read_files(args.files) if args.command == "import" else []
    with _open(args) as store:
        if args.command == "import":
            for path, done in rowsfile.import_files(store, parsed):
                print(f"{path}: {done.runs} run(s) and {done.results} result(s) imported, {done.already} already there")
            return 0
        if args.command in ("analyze", "changes"):
            return _analyze(store, args)
        if args.command == "mark":
            return _mark(store, args)
        if args.command == "exclude":
            changed = store.exclude(args.run_id, args.reason, undo=args.undo)
            if not changed:
                print(f"{PROG} exclude: error: no run or job {args.run_id} in the store", file=sys.stderr)
                return 2
            print(f"{changed} run(s) {'taken back' if args.undo else 'excluded'}")
            return 0
        if args.command == "export":
            chosen = list(_series(store, args).values())
            written = (export.otava if args.format == "otava" else export.jsonl)(chosen, args.out)
            print(f"{len(chosen)} series written to {args.out} ({len(written)} files)")
            return 0
        print(f"{store.location.describe()}: schema version {store.version()}")
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except (StoreError, rowsfile.RowsFileError, RupturesMissing, BadArgument, OSError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
