"""`pytest-llmperf history ...`: work on a history store from the command line.

    import FILE...            merge rows files (history-rows.jsonl of CI jobs) into the store, once each
    analyze [--fail]          analyse every series; write the analysis; exit 1 on a confirmed, unmarked regression
    changes [--state S]       list the changes found (newest analysis), with their ids
    mark ID --as STATE        mark a change, or every change of an event, expected or false_positive (--clear removes)
    replace OLD NEW           move the runs of a commit no longer on the default branch onto the one that replaced it
    exclude RUN --reason R    set a run (or a whole job) aside from every series (--undo takes it back)
    export --format F --out D the series as Otava's CSV tests and config, or JSON lines
    migrate                   bring the store to this plugin's schema
    bisect ID [-- ARGS]       bisect the commits of a change or event (its id from `changes`): pytest-llmperf bisect

The store: --store, else the environment variable LLMPERF_HISTORY, else .llmperf/history.sqlite.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

from ..files import strict_json, write_text_atomic
from ..judge.fingerprint import git
from . import rows, series, summary
from .analysis import DEFAULT_MIN_EFFECT, Change, Event, analyze, events
from .databases import StoreError, parse_location
from .detect import DEFAULT_METHOD, RupturesMissing
from .records import MARK_STATES, Mark
from .settings import DEFAULT_STORE
from .store import Store

PROG = "pytest-llmperf history"
READING = ("analyze", "changes", "export", "bisect")  # commands that only read: they work on a store they cannot write


class BadArgument(Exception):
    """An argument the command cannot use (a ref git does not know); said in one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line (`PROG COMMAND: error: ...`) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _min_effect(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a relative size such as 0.05, got {text!r}") from None
    if not (math.isfinite(value) and 0 < value < 1):
        raise argparse.ArgumentTypeError(f"expected a relative size above 0 and below 1 (0.05 is 5%), got {text!r}")
    return value


def _directory(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is no directory")
    return path


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog=PROG, description="Work on pytest-llmperf's history store (docs/history.md).")
    top.add_argument(
        "--store",
        help=f"the store: a SQLite path, sqlite:///PATH or postgresql://URL (default: "
        f"$LLMPERF_HISTORY, else {DEFAULT_STORE})",
    )
    commands = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    imp = commands.add_parser("import", help="merge rows files into the store (idempotent)")
    imp.add_argument("files", nargs="+", type=Path, metavar="FILE")
    for name, text in (("analyze", "analyse every series"), ("changes", "list the changes found")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument(
            "--repo",
            type=_directory,
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
            type=_min_effect,
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
    mark = commands.add_parser("mark", help="mark a change, or every change of an event (its id from `changes`)")
    mark.add_argument(
        "change_id", metavar="ID", help="SERIES_KEY@COMMIT or EVENT:MACHINE@COMMIT, as `changes` lists it"
    )
    mark.add_argument("--repo", type=_directory, default=Path("."), help="the repository ordering the series")
    mark.add_argument("--branch")
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
    out.add_argument("--repo", type=_directory, default=Path("."))
    out.add_argument("--branch")
    replace = commands.add_parser(
        "replace", help="move the runs of a commit no longer on the default branch onto the one that replaced it"
    )
    replace.add_argument("old", metavar="OLD", help="the stored commit (a prefix of its sha)")
    replace.add_argument("new", metavar="NEW", help="the commit that replaced it (a ref of --repo, or a full sha)")
    replace.add_argument("--repo", type=_directory, default=Path("."))
    commands.add_parser("migrate", help="bring the store to this plugin's schema")
    bisect = commands.add_parser(
        "bisect",
        help="find the commit of a change or event by A/B jobs (pytest-llmperf bisect): its range, test and metric",
        description="Bisect the commits between a change's (or event's) last good and first bad commit with `pytest-"
        "llmperf bisect`, each step an A/B job of its series' tests on its target; arguments after -- go to each "
        "step's pytest as well (e.g. --llmperf-rtol=0.10).",
    )
    bisect.add_argument("change_id", metavar="ID", help="SERIES_KEY@COMMIT or EVENT:MACHINE@COMMIT, as `changes` lists")
    bisect.add_argument("--repo", type=_directory, default=Path("."), help="the repository ordering the series")
    bisect.add_argument("--branch")
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
    return Store(location, read_only=args.command in READING)


def _series(store: Store, args: argparse.Namespace) -> dict[str, series.Series]:
    branch = series.default_branch(args.repo, args.branch)
    line = (series.first_parent_line(args.repo, branch) or None) if branch else None
    runs = store.runs()
    if line is None:
        print(
            f"note: no first-parent line of a default branch in {args.repo} (--repo; not a git repository, or a "
            "shallow clone): the series are ordered as the jobs recorded them",
            file=sys.stderr,
        )
    orphans = series.orphaned(runs, line)
    if orphans:
        from .job import orphan_line

        print(f"note: {orphan_line(orphans)}", file=sys.stderr)
    built = series.build(runs, store.results(), line)
    return {
        k: s
        for k, s in built.items()
        if (not getattr(args, "pattern", None) or fnmatch.fnmatch(s.id.label(), f"*{args.pattern}*"))
        and (not getattr(args, "target", None) or s.id.target == args.target)
    }


def event_text(event: Event) -> str:
    mark = f", marked {event.mark}" if event.mark else ""
    return (
        f"{event.id}  {event.state:<11} {event.kind:<11} {event.describe()} ({event.target}, {event.machine})  "
        f"{event.last_good[:12]}..{event.first_bad[:12]}{', failing' if event.fails else ''}{mark}"
    )


def change_line(change: Change) -> str:
    mark = f", marked {change.mark}" if change.mark else ""
    now = f", now {change.now:+.1%} against before" if change.now is not None else ""
    flags = "".join(
        f", {w} changed there"
        for w, on in (("environment", change.env_changed), ("machine", change.machine_changed))
        if on
    )
    return (
        f"{change.id}  {change.state:<11} {change.kind:<11} {change.change:+7.1%}  {change.label}  "
        f"{change.last_good[:12]}..{change.first_bad[:12]}  {change.before:.4g} -> {change.after:.4g}{now}{mark}{flags}"
    )


def _analyze(store: Store, args: argparse.Namespace) -> int:
    anchor = git(args.repo, "rev-parse", "--verify", "--quiet", f"{args.anchor}^{{commit}}") if args.anchor else None
    if args.anchor and not anchor:
        raise BadArgument(f"--anchor {args.anchor} is no commit of the repository {args.repo} (--repo)")
    built = _series(store, args)
    kept = store.checkpoints(built)  # where the jobs' reads stopped: the same analysis, sooner
    analyses = analyze(built, min_effect=args.min_effect, anchor=anchor, marks=store.marks(), checkpoints=kept)
    changes = [c for a in analyses for c in a.changes]
    found = events(analyses, args.min_effect)
    several = [e for e in found if len(e.changes) > 1]  # an event of one series is its change's line
    if args.command == "changes":
        shown = [
            c
            for c in changes
            if args.state in ("all", c.state) or (args.state == "failing" and c.fails(args.min_effect))
        ]
        for event in several:
            if args.state in ("all", event.state) or (args.state == "failing" and event.fails):
                print(event_text(event))
        for change in shown:
            print(change_line(change))
        print(f"{len(found)} event(s), {len(shown)} change(s) in {len(analyses)} series")
        return 0
    data = summary.document(analyses, DEFAULT_METHOD, args.min_effect, store.location.describe())
    if args.out:
        write_text_atomic(args.out, strict_json(data, indent=None))
        print(f"wrote {args.out}")
    for event in several:
        print(event_text(event))
    for change in changes:
        print(change_line(change))
    for item in data["creep"]:
        print(f"creep {item['drift']:+.1%} ({item['kind']}) in {item['series']} since {item['from'][:12]}")
    for warning in data["warnings"]:
        print(f"warning: {warning}")
    failing = [e for e in found if e.fails]
    for event in failing:
        reached = min((c.reached_at or "" for c in event.changes if c.fails(args.min_effect)), default="")
        what = event.changes[0].id if len(event.changes) == 1 else f"{event.id} ({len(event.changes)} series)"
        print(
            f"failing: {what}, a regression of at least {args.min_effect:.0%} since the job at {reached[:12]}, still "
            "in effect and not marked"
        )
    confirmed = sum(c.state == "confirmed" for c in changes)
    print(
        f"{len(analyses)} series, {len(changes)} change(s), {confirmed} confirmed, {len(failing)} failing "
        f"({len(found)} event(s): the changes of a machine's series at one place are one)"
    )
    return 1 if args.fail and failing else 0


def _mark(store: Store, args: argparse.Namespace) -> int:
    if args.change_id.startswith("EVENT:"):
        analyses = analyze(_series(store, args), marks=store.marks())
        chosen = [e for e in events(analyses, DEFAULT_MIN_EFFECT) if e.id == args.change_id]
        if not chosen:
            raise BadArgument(f"no event {args.change_id} (ids as `{PROG} changes --repo DIR` lists them)")
        targets = [(c.series_key, c.first_bad) for c in chosen[0].changes]
    else:
        key, _, prefix = args.change_id.partition("@")
        commits = {r.commit_sha for r in store.runs() if prefix and r.commit_sha.startswith(prefix)}
        if len(commits) != 1 or not store.results([key]):
            raise BadArgument(f"no change {args.change_id} (ids as `{PROG} changes` lists them)")
        targets = [(key, commits.pop())]
    if args.clear:
        print(f"{sum(store.unmark(key, sha) for key, sha in targets)} mark(s) removed")
        return 0
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for key, sha in targets:
        store.mark(Mark(key, sha, args.state, args.note, when))
    print(f"{args.change_id} marked {args.state}" + (f" ({len(targets)} changes)" if len(targets) > 1 else ""))
    return 0


def bisect_argv(store: Store, args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """`pytest-llmperf bisect`'s arguments for a change or an event: its last good and first bad commit, its series'
    metrics (and batch size, where they share one), and their tests on their target for each step's pytest."""
    analyses = analyze(_series(store, args), marks=store.marks())
    ids = {a.series.key: a.series.id for a in analyses}
    chosen = [e.changes for e in events(analyses, DEFAULT_MIN_EFFECT) if e.id == args.change_id]
    chosen += [(c,) for a in analyses for c in a.changes if c.id.startswith(args.change_id) and "@" in args.change_id]
    if len(chosen) != 1:
        what = "no" if not chosen else "more than one"
        raise BadArgument(f"{what} change or event {args.change_id} (ids as `{PROG} changes --repo DIR` lists them)")
    changes = chosen[0]
    good = min(changes, key=lambda c: (c.order, c.label)).last_good
    bad = max(changes, key=lambda c: (c.order, c.label)).first_bad
    series = [ids[c.series_key] for c in changes]
    argv = [good, bad, *(f"--metric={m}" for m in sorted({s.metric for s in series}))]
    if len({s.batch_size for s in series}) == 1:
        argv.append(f"--batch-size={series[0].batch_size}")
    targets = sorted({s.target for s in series})
    return [*argv, "--", *sorted({s.test for s in series}), f"--llmperf-device={targets[0]}", *extra]


def _replace(store: Store, args: argparse.Namespace) -> int:
    old = {r.commit_sha for r in store.runs() if r.commit_sha.startswith(args.old)}
    if len(old) != 1:
        raise BadArgument(f"{args.old} is {'no' if not old else 'more than one'} stored commit (a prefix of its sha)")
    new = git(args.repo, "rev-parse", "--verify", "--quiet", f"{args.new}^{{commit}}")
    if not new:
        if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", args.new):
            raise BadArgument(f"{args.new} is no commit of {args.repo} (--repo) nor a full sha")
        new = args.new
    moved = store.replace_commit(old.pop(), new)
    print(f"{moved} run(s) moved onto {new[:12]}")
    return 0


def run(
    args: argparse.Namespace, extra: Sequence[str] = (), run_bisect: Callable[[list[str]], int] | None = None
) -> int:
    parsed = rows.read_files(args.files) if args.command == "import" else []
    if args.command == "bisect":
        with _open(args) as store:
            argv = bisect_argv(store, args, extra)
        print(f"{PROG} bisect: {args.change_id}: pytest-llmperf bisect {shlex.join(argv)}")
        return run_bisect(argv) if run_bisect else 0
    with _open(args) as store:
        if args.command == "import":
            for path, done in rows.import_files(store, parsed):
                print(f"{path}: {done.runs} run(s) and {done.results} result(s) imported, {done.already} already there")
            return 0
        if args.command in ("analyze", "changes"):
            return _analyze(store, args)
        if args.command == "mark":
            return _mark(store, args)
        if args.command == "replace":
            return _replace(store, args)
        if args.command == "exclude":
            changed = store.exclude(args.run_id, args.reason, undo=args.undo)
            if not changed:
                print(f"{PROG} exclude: error: no run or job {args.run_id} in the store", file=sys.stderr)
                return 2
            print(f"{changed} run(s) {'taken back' if args.undo else 'excluded'}")
            return 0
        if args.command == "export":
            chosen = list(_series(store, args).values())
            written = (series.otava if args.format == "otava" else series.jsonl)(chosen, args.out)
            print(f"{len(chosen)} series written to {args.out} ({len(written)} files)")
            return 0
        print(f"{store.location.describe()}: schema version {store.version()}")
        return 0


def main(argv: Sequence[str] | None = None, run_bisect: Callable[[list[str]], int] | None = None) -> int:
    """`run_bisect`: what runs `pytest-llmperf bisect ARGV` (cli.py gives it; without it, the command is printed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser().parse_args(argv[: len(argv) - len(extra) - 1] if "--" in argv else argv)
    if extra and args.command != "bisect":
        parser().error(f"arguments after -- are for bisect only: {shlex.join(extra)}")
    try:
        return run(args, extra, run_bisect)
    except (StoreError, rows.RowsFileError, RupturesMissing, BadArgument, OSError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
