"""`pytest-llmperf bisect GOOD BAD [-- PYTEST ARGS]`: run a bisection (bisection.py chooses, this runs).

Each step checks its commit out into a temporary git worktree (orchestrate/worktree.py, as the A side of an A/B
job is) and runs there, as a user would, `python -m pytest PYTEST_ARGS --llmperf-compare=GOOD` with its JSON report
(--llmperf-json) in the output folder; its report directory is the worktree's, and the history is off (a bisection
step is no job of the default branch). The worktree goes when the step ends, also on Ctrl-C, SIGTERM or a failure;
the step's pytest is stopped first (processes.stop_tree). After every step the markdown and JSON reports are
rewritten, so an interrupted bisection keeps what it measured.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from .bisection import BAD, GOOD, Bisection, Search, Step, step_outcome, step_table
from .files import strict_json, write_text_atomic
from .judge.environment import git
from .orchestrate.campaign_progress import LINE_EVERY_S
from .orchestrate.worktree import Checkout, RefError, checkout
from .processes import die_with_parent, sigterm_interrupts, stop_tree

PROG = "pytest-llmperf bisect"
DEFAULT_OUT = Path("reports") / "bisect"
#: Options each step sets itself.
SET_HERE = ("--llmperf-compare", "--llmperf-json", "--llmperf-report-dir", "--llmperf-history")

Say = Callable[[str], None]


def say_now(text: str) -> None:
    print(text, flush=True)  # a CI log is a pipe: each line as it happens


class BisectError(Exception):
    """A bisection that cannot start (an unknown commit, GOOD not before BAD); said in one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog=PROG,
        description="Find the first commit between GOOD and BAD (first-parent) that made the benchmarks slower: a "
        "bisection whose every step is this plugin's A/B job of a commit against GOOD, and whose result is confirmed "
        "by an A/B of that commit against its parent (docs/bisect.md). Arguments after -- go to each step's pytest "
        "(the tests and options of the red job, e.g. tests/perf -k decode --llmperf-device=cpu).",
    )
    top.add_argument("good", metavar="GOOD", help="a commit that was fast (e.g. the A/B job's base)")
    top.add_argument("bad", metavar="BAD", help="a later commit that is slower (e.g. the A/B job's head)")
    top.add_argument("--metric", action="append", default=[], help="only rows of this metric decide (repeatable)")
    top.add_argument("--batch-size", type=int, help="only rows of this batch size decide")
    top.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"where bisect.md, bisect.json and each step's log and report go "
        f"(default: {DEFAULT_OUT})",
    )  # fmt: skip
    top.add_argument("--python", default=sys.executable, help="the Python whose pytest runs the steps (default: this)")
    return top


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(bisect's own arguments, the steps' pytest arguments after `--`)."""
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def drop_set_here(pytest_args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the steps' pytest arguments less the options each step sets itself, those left out): a red job's command,
    pasted, keeps its --llmperf-compare."""
    kept: list[str] = []
    dropped: list[str] = []
    args = iter(pytest_args)
    for arg in args:
        if arg in SET_HERE:  # --llmperf-json FILE
            dropped.append(f"{arg} {next(args, '')}".strip())
        elif arg.split("=")[0] in SET_HERE:
            dropped.append(arg)
        else:
            kept.append(arg)
    return kept, dropped


def commits(root: Path, good: str, bad: str) -> list[str]:
    """GOOD's and BAD's shas."""
    if git(root, "rev-parse", "--show-toplevel") is None:
        raise BisectError(f"{root} is not inside a git repository: run it in the project's checkout")
    shas = []
    for name, ref in (("GOOD", good), ("BAD", bad)):
        sha = git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        if not sha:
            raise BisectError(f"{name} {ref}: no such commit in {root} (a shallow clone: git fetch --unshallow)")
        shas.append(sha)
    return shas


def commit_range(root: Path, good: str, bad: str) -> tuple[str, str, list[str]]:
    """(GOOD's sha, BAD's sha, the first-parent commits after GOOD up to BAD, oldest first)."""
    shas = commits(root, good, bad)
    if git(root, "merge-base", "--is-ancestor", shas[0], shas[1]) is None:
        raise BisectError(f"GOOD {good} is not an ancestor of BAD {bad}: name the older commit first")
    listed = git(root, "rev-list", "--first-parent", "--reverse", f"{shas[0]}..{shas[1]}")
    commits = listed.split() if listed else []
    if not commits:
        raise BisectError(f"no commits between GOOD {good} and BAD {bad}: nothing to bisect")
    return shas[0], shas[1], commits


def subject(root: Path, sha: str) -> str:
    return git(root, "log", "-1", "--format=%s", sha) or ""


def run_step(
    cwd: Path, commit: str, against: str, pytest_args: Sequence[str], out: Path, number: int, python: str, say: Say
) -> tuple[int, Path, Path]:
    """Run the A/B job of `commit` against `against` in a worktree of it: (pytest's exit code, its JSON report's
    path, its log's path). The pytest is stopped and the worktree removed whatever ends the step."""
    name = f"step-{number:02d}-{commit[:10]}"
    report, log = out / f"{name}.json", out / f"{name}.log"
    with checkout(commit, cwd) as tree:
        code = run_job(tree, against, pytest_args, report, log, python, say)
    return code, report, log


def run_job(tree: Checkout, against: str, pytest_args: Sequence[str], report: Path, log: Path, python: str,
            say: Say) -> int:  # fmt: skip
    """Run the A/B job of the worktree `tree` against `against`, its output into `log`: pytest's exit code. The
    pytest is stopped whatever ends the job."""
    report.unlink(missing_ok=True)
    with open(log, "w") as sink:
        argv = [python, "-m", "pytest", *pytest_args, f"--llmperf-compare={against}", f"--llmperf-json={report}",
                f"--llmperf-report-dir={tree.toplevel.parent / 'reports'}", "--llmperf-history=off"]  # fmt: skip
        proc = subprocess.Popen(
            die_with_parent(argv, cwd=tree.root), cwd=tree.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            said = time.monotonic()
            assert proc.stdout is not None
            for line in proc.stdout:
                sink.write(line)
                # the step's own progress, at most every LINE_EVERY_S: a log is never silent for long
                if line.startswith("llmperf: process") and time.monotonic() - said >= LINE_EVERY_S:
                    say(f"    {line.rstrip()}")
                    said = time.monotonic()
            return proc.wait()
        finally:
            if proc.poll() is None:
                stop_tree(proc.pid)


def _read(report: Path) -> dict | None:
    import json

    try:
        return json.loads(report.read_text())
    except (OSError, ValueError):
        return None


def _write(result: Bisection, out: Path) -> None:
    write_text_atomic(out / "bisect.json", strict_json(result.document()))
    write_text_atomic(out / "bisect.md", result.markdown())


def bisect(
    cwd: Path,
    good: str,
    bad: str,
    pytest_args: Sequence[str],
    out: Path,
    *,
    metrics: Sequence[str] = (),
    batch_size: int | None = None,
    python: str = sys.executable,
    say: Say = say_now,
    clock: Callable[[], float] = time.monotonic,
) -> Bisection:
    """Bisect the first-parent commits after GOOD up to BAD; the steps, the first bad commit and whether its
    parent confirms it. BisectError when it cannot start."""
    good_sha, bad_sha, commits = commit_range(cwd, good, bad)
    out = out.resolve()  # the steps run elsewhere: their report goes here
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["pytest", *pytest_args, f"--llmperf-compare={good_sha[:12]}"])
    result = Bisection(good_sha, bad_sha, len(commits), command)
    search = Search(commits)
    started = clock()
    say(f"bisect: {len(commits)} first-parent commit(s) after GOOD {good_sha[:10]} up to BAD {bad_sha[:10]}; about "
        f"{search.steps_left()} step(s) and one to confirm, each in a worktree of its commit: {command}")  # fmt: skip

    def step(index: int, against: str, role: str) -> Step:
        commit = commits[index]
        title = subject(cwd, commit)
        number = len(result.steps) + 1
        other = f"{'GOOD' if against == good_sha else 'its parent'} {against[:10]}"
        say(f"bisect: step {number} ({role}): {commit[:10]} (commit {index + 1} of {len(commits)}) {title!r} against "
            f"{other}")  # fmt: skip
        began = clock()
        code, report, log = run_step(cwd, commit, against, pytest_args, out, number, python, say)
        regressed = [s.row for s in result.steps if s.outcome == BAD and s.row]
        focus = (regressed[-1].metric, regressed[-1].batch_size) if regressed else None
        outcome, why, row = step_outcome(_read(report), code, metrics, batch_size, focus)
        done = Step(number, commit, title, against, role, outcome, why, row, clock() - began, code,
                    str(log))  # fmt: skip
        result.steps.append(done)
        result.seconds = clock() - started
        ratio = f"{row.text()}; " if row else ""
        took = f"{done.seconds:.0f} s; {result.seconds:.0f} s in all"
        say(f"bisect: step {number}: {commit[:10]} {outcome}: {ratio}{why} ({took})")
        _write(result, out)
        return done

    try:
        with sigterm_interrupts():
            while (index := search.next()) is not None:
                search.record(index, step(index, good_sha, "bisect").outcome)
                if search.next() is not None:
                    say(f"bisect: {len(search.candidates())} commit(s) left, about {search.steps_left()} step(s)")
            first = search.bad
            result.first_bad, result.subject = commits[first], subject(cwd, commits[first])
            result.suspects = [commits[i] for i in search.suspects()]
            if len(result.suspects) > 1:
                result.status = "ambiguous"
            else:
                parent = git(cwd, "rev-parse", f"{commits[first]}^1") or good_sha
                earlier = [s for s in result.steps if s.commit == commits[first] and s.against == parent]
                confirm = earlier[-1] if earlier else step(first, parent, "confirm")
                result.confirmed_by = confirm.number
                result.status = {BAD: "found", GOOD: "not-confirmed"}.get(confirm.outcome, "unconfirmed")
    except KeyboardInterrupt:
        result.status = "interrupted"
    except RefError as exc:
        raise BisectError(str(exc)) from None
    result.seconds = clock() - started
    _write(result, out)
    return result


def main(argv: Sequence[str]) -> int:
    own, pytest_args = split_argv(argv)
    args = parser().parse_args(own)
    pytest_args, dropped = drop_set_here(pytest_args)
    if dropped:
        print(f"bisect: left out {', '.join(dropped)}: each step sets it itself")
    try:
        result = bisect(Path.cwd(), args.good, args.bad, pytest_args, args.out, metrics=args.metric,
                        batch_size=args.batch_size, python=args.python)  # fmt: skip
    except (BisectError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(step_table(result.steps, markdown=False))
    print(f"bisect: {result.verdict()}")
    print(f"bisect: {len(result.steps)} A/B job(s) in {result.seconds:.0f} s; report: {args.out / 'bisect.md'}, "
          f"{args.out / 'bisect.json'}")  # fmt: skip
    return result.exit_code()
