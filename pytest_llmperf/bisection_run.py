"""`pytest-llmperf bisect GOOD BAD [-- PYTEST ARGS]`: run a bisection (bisection.py chooses, this runs).

Each step checks its commit out into a temporary git worktree (orchestrate/worktree.py, as the A side of an A/B
job is) and runs there, as a user would, `python -m pytest PYTEST_ARGS --llmperf-compare=GOOD` with its JSON report
(--llmperf-json) in the output folder; its report directory is the worktree's, and the history is off (a bisection
step is no job of the default branch). The worktree goes when the step ends, also on Ctrl-C, SIGTERM or a failure;
the step's pytest is stopped first (processes.stop_tree). After every step the markdown and JSON reports are
rewritten, so an interrupted bisection keeps what it measured.

With --packages (`bisect_packages`) the code stays GOOD's: GOOD's and BAD's environments are built by the
environments code to learn which packages differ, and each step is the same A/B job in a worktree of GOOD whose
requirements bisection_packages.py rewrote, its environment built first (a subset uv cannot build costs no job).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from .bisection import BAD, GOOD, SKIP, Bisection, Row, Search, Step, focus_of, step_outcome, step_table
from .bisection_packages import (
    UNRESOLVED,
    Delta,
    PackageBisection,
    step_requirements,
    subset_changes,
    write_files,
)
from .environments.inputs import DependencyInputs
from .environments.records import BUILT, BuildSettings, Environments, PackageChange
from .files import strict_json, write_text_atomic
from .judge.fingerprint import git
from .orchestrate.progress import LINE_EVERY_S
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
    top.add_argument(
        "--packages", action="store_true", help="keep GOOD's code and bisect the packages whose versions differ "
        "between GOOD's and BAD's environments (built by uv from their requirements files): the smallest set that "
        "makes it slower, by delta debugging (docs/bisect.md)",
    )  # fmt: skip
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


def shas_of(root: Path, good: str, bad: str) -> list[str]:
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
    shas = shas_of(root, good, bad)
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


def _write(result: Bisection | PackageBisection, out: Path) -> None:
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
        outcome, why, row = step_outcome(_read(report), code, metrics, batch_size, focus_of(result.steps))
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


# -- --packages: GOOD's code, the packages that differ bisected -----------------------------------------------------

#: Not what a bisection over packages can do, each with why.
PACKAGES_ONLY_FROM = (
    "--packages rewrites GOOD's requirements files to pin each step's packages; GOOD {sha} is built from {what}. "
    "Way out: on a branch of GOOD and one of BAD, export what each installs to a requirements file and commit it "
    "without the lock (`uv export --frozen --no-hashes --no-emit-project -o requirements.txt && git rm -q uv.lock`; "
    "a pyproject.toml alone: `uv pip compile pyproject.toml -o requirements.txt`), then bisect those two commits"
)
SUBJECT = "packages at BAD's versions"


def _given(args: Sequence[str], option: str) -> list[str]:
    """The values of `option` in pytest arguments (`--opt=v` or `--opt v`), in order."""
    values, items = [], iter(args)
    for arg in items:
        if arg == option:
            values.append(next(items, ""))
        elif arg.startswith(f"{option}="):
            values.append(arg.split("=", 1)[1])
    return values


def _ini(args: Sequence[str], key: str) -> list[str]:
    """The values pytest's `-o key=value` (or --override-ini) gives an ini key in `args`, in order."""
    values, items = [], iter(args)
    for arg in items:
        if arg in ("-o", "--override-ini"):
            arg = next(items, "")
        elif arg.startswith("--override-ini="):
            arg = arg.split("=", 1)[1]
        elif arg.startswith("-o"):
            arg = arg[2:]
        else:
            continue
        name, _, value = arg.partition("=")
        if name == key:
            values.append(value)
    return values


def _names(args: Sequence[str], key: str) -> tuple[str, ...]:
    given = _ini(args, key)
    return tuple(given[-1].replace(",", " ").split()) if given else ()


def build_settings(pytest_args: Sequence[str]) -> tuple[list[str], Path, BuildSettings]:
    """(the steps' pytest arguments, the environments' cache, how they are built), as the steps' A/B jobs read them
    from their command line and PYTEST_ADDOPTS (orchestrate/sides.py); an ini file's values are not read here. The
    cache is given to every step by an absolute path: bisect's builds and the steps' are one cache."""
    import shlex

    from .environments.cache import default_env_dir

    given = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *pytest_args]  # pytest reads them in this order
    modes = _given(given, "--llmperf-compare-deps") or ["auto"]
    if modes[-1] == "code-only":
        raise BisectError("--packages measures each step in the environment built for it; --llmperf-compare-deps="
                          "code-only runs every step in this one: leave it out")  # fmt: skip
    if _given(given, "--llmperf-base-python"):
        raise BisectError("--packages builds GOOD's environment and each step's with uv; --llmperf-base-python "
                          "replaces GOOD's: leave it out")  # fmt: skip
    named = _ini(given, "llmperf_env_dir") or [str(default_env_dir())]
    env_dir = Path(named[-1]).expanduser().resolve()
    offline = os.environ.get("UV_OFFLINE", "").lower() in ("1", "true", "yes")
    extras, groups = _names(given, "llmperf_env_extras"), _names(given, "llmperf_env_groups")
    args = [*pytest_args, "-o", f"llmperf_env_dir={env_dir}"]  # the last one given wins
    return args, env_dir, BuildSettings(offline=offline, extras=extras, groups=groups)


def _built(hows: Iterable[str | None]) -> int:
    """How many of an A/B job's two environments uv built (the others: reused from the cache)."""
    return sum(1 for how in hows if how == BUILT)


def _uv_said(exc: Exception) -> str:
    """What uv said of a build that failed, on one line."""
    said = str(getattr(exc, "reason", exc)).split("uv said:", 1)[-1].splitlines()
    words = [w for line in said if (w := line.strip(" \t×╰─▶│")) and not w.startswith("Using Python")]
    return " ".join(words)[:400]


def _pinnable(changes: Sequence[PackageChange]) -> tuple[list[PackageChange], list[str]]:
    """(the changes a version pin can make, notes of those it cannot: a wheel rebuilt under its version)."""
    from .environments.plugin_install import PLUGIN

    kept, notes = [], []
    for change in changes:
        if change.head is not None and change.head.endswith("(other files)"):
            notes.append(f"{change}: the same version with other files; a pin cannot choose it, not bisected")
        elif change.name != PLUGIN:  # the controller's own on both sides
            kept.append(change)
    return kept, notes


@dataclass
class PackageSteps:
    """What every step of a bisection over packages shares: GOOD's checkout and inputs, BAD's, both environments, and
    where the steps' environments and reports go."""

    cwd: Path
    good_tree: Checkout
    good: DependencyInputs
    bad: DependencyInputs
    requirements: tuple[str, ...]  # GOOD's recipe's requirements files
    sides: Environments  # GOOD's (base) and BAD's (head)
    changes: list[PackageChange]
    env_dir: Path
    settings: BuildSettings
    pytest_args: Sequence[str]
    out: Path
    result: PackageBisection
    python: str
    say: Say
    clock: Callable[[], float]
    started: float  # the bisection's start, by `clock`
    metrics: Sequence[str] = ()
    batch_size: int | None = None

    def run(self, subset: tuple[str, ...], role: str) -> str:
        """The step of `subset` (`role`: why it is measured): its outcome, recorded and reported."""
        result, good_sha = self.result, self.good_tree.commit
        number, picked = len(result.steps) + 1, subset_changes(self.changes, subset)
        shown = "; ".join(map(str, picked)) if len(picked) <= 3 else " ".join(subset)
        self.say(f"bisect: step {number} ({role}): {len(picked)} of {len(self.changes)} package(s) at BAD's "
                 f"versions: {shown}")  # fmt: skip
        began = self.clock()
        report, log = self.out / f"step-{number:02d}-packages.json", self.out / f"step-{number:02d}-packages.log"
        with checkout(good_sha, self.cwd) as tree:
            root = tree.toplevel / self.good.root.relative_to(self.good_tree.toplevel)
            note = f"pytest-llmperf bisect --packages, step {number}: at BAD's versions: {' '.join(subset)}"
            write_files(root, step_requirements(self.good, self.bad, self.requirements, self.sides.base.installed,
                                                self.changes, subset, note))  # fmt: skip
            outcome, why, row, code = self._measure(tree, root, picked, report, log)
        done = Step(number, good_sha, " ".join(subset), good_sha, role, outcome, why, row, self.clock() - began, code,
                    str(log), tuple(map(str, picked)))  # fmt: skip
        result.steps.append(done)
        result.seconds = self.clock() - self.started
        ratio = f"{row.text()}; " if row else ""
        self.say(f"bisect: step {number}: {outcome}: {ratio}{why} ({done.seconds:.0f} s; {result.seconds:.0f} s in "
                 "all)")  # fmt: skip
        _write(result, self.out)
        return outcome

    def _measure(
        self, tree: Checkout, root: Path, picked: Sequence[PackageChange], report: Path, log: Path
    ) -> tuple[str, str, Row | None, int]:
        """Build the step's environment (uv, the cache the job then reuses), then run its A/B job."""
        from .environments.inputs import detect
        from .environments.plan import prepare
        from .environments.records import BuildFailed, EnvironmentsError

        try:
            made = prepare(detect(self.good.root, root), env_dir=self.env_dir, settings=self.settings)
        except EnvironmentsError as exc:
            log.write_text(f"{getattr(exc, 'reason', exc)}\n")  # its ways out are a job's, not a bisection's
            if isinstance(exc, BuildFailed):
                return UNRESOLVED, f"uv cannot build these together: {_uv_said(exc)}", None, -1
            return UNRESOLVED, f"its environment cannot be made: {getattr(exc, 'reason', exc)}", None, -1
        self.result.builds += _built(side.how for side in (made.base, made.head))
        if set(made.changes) != set(picked):  # a package BAD no longer has, that another still requires
            got = "; ".join(map(str, made.changes)) or "GOOD's set"
            log.write_text(f"asked for: {'; '.join(map(str, picked))}\nuv built: {got}\n")
            return UNRESOLVED, f"uv does not build this set: it built {got}", None, -1
        code = run_job(tree, self.good_tree.commit, self.pytest_args, report, log, self.python, self.say)
        document = _read(report)
        outcome, why, row = step_outcome(document, code, self.metrics, self.batch_size, focus_of(self.result.steps))
        ran = ((document or {}).get("fingerprint") or {}).get("environments") or {}
        self.result.builds += _built((ran.get(side) or {}).get("how") for side in ("base", "head"))
        if ran and (ran.get("head") or {}).get("installed") != dict(made.head.installed):
            return SKIP, "its A/B job ran another environment than the one built for it", row, code
        return outcome, why, row, code


def bisect_packages(
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
) -> PackageBisection:
    """Bisect the packages whose versions differ between GOOD's and BAD's environments, GOOD's code kept: the
    smallest set that makes it slower. BisectError when it cannot start."""
    from .environments.build import REQUIREMENTS, recipe_for
    from .environments.inputs import detect, find_inputs, inputs_roots
    from .environments.installed import probe
    from .environments.plan import prepare
    from .environments.records import EnvironmentsError

    good_sha, bad_sha = shas_of(cwd, good, bad)
    pytest_args, env_dir, settings = build_settings(pytest_args)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["pytest", *pytest_args, f"--llmperf-compare={good_sha[:12]}"])
    started = clock()
    steps: PackageSteps | None = None
    try:
        with sigterm_interrupts(), contextlib.ExitStack() as trees:
            good_tree, bad_tree = (trees.enter_context(checkout(sha, cwd)) for sha in (good_sha, bad_sha))
            good_root, bad_root = inputs_roots(good_tree.toplevel, bad_tree.toplevel, bad_tree.root)
            good_in, bad_in = find_inputs(good_root), find_inputs(bad_root)
            if good_in.digests() == bad_in.digests():
                raise BisectError(f"GOOD {good_sha[:12]} and BAD {bad_sha[:12]} have the same dependency files: no "
                                  "package differs; bisect the commits (without --packages)")  # fmt: skip
            try:
                recipe = recipe_for(good_in, settings, probe(python, installed=False).version, "base")
            except EnvironmentsError as exc:
                raise BisectError(f"GOOD {good_sha[:12]}'s environment cannot be built: {exc}") from None
            if recipe.kind != REQUIREMENTS:
                raise BisectError(PACKAGES_ONLY_FROM.format(sha=good_sha[:12], what=recipe.label(settings)))
            say(f"bisect: building GOOD's and BAD's environments with uv (cache {env_dir}) to learn what they hold")
            try:
                sides = prepare(detect(good_root, bad_root), env_dir=env_dir, settings=settings)
            except EnvironmentsError as exc:
                raise BisectError(str(exc)) from None
            changes, notes = _pinnable(sides.changes)
            if not changes:
                raise BisectError(f"GOOD's and BAD's environments hold the same versions of every package "
                                  f"({', '.join(sides.files)} differ): no package to bisect")  # fmt: skip
            result = PackageBisection(good_sha, bad_sha, changes, command, notes=notes)
            result.builds = _built(side.how for side in (sides.base, sides.head))
            steps = PackageSteps(cwd, good_tree, good_in, bad_in, recipe.requirements, sides, changes, env_dir,
                                 settings, pytest_args, out, result, python, say, clock, started, metrics,
                                 batch_size)  # fmt: skip
            say(f"bisect: {len(changes)} package(s) differ between GOOD {good_sha[:10]} and BAD {bad_sha[:10]}: "
                f"{'; '.join(map(str, changes))}; each step: GOOD's code with some at BAD's versions, an A/B job "
                f"against GOOD: {command}")  # fmt: skip
            delta = Delta(tuple(c.name for c in changes))
            found = delta.run(steps.run)
            if found is None:
                whole = delta.outcomes.get(frozenset(delta.items))
                result.status = "not-in-packages" if whole == GOOD else "undecided"
            else:
                result.status, result.culprits = "found", list(subset_changes(changes, found))
                result.found_by = next(s.number for s in result.steps if set(s.subject.split()) == set(found))
    except KeyboardInterrupt:
        if steps is None:
            raise BisectError("interrupted before the first step") from None
        steps.result.status = "interrupted"
    except RefError as exc:
        raise BisectError(str(exc)) from None
    assert steps is not None
    steps.result.seconds = clock() - started
    _write(steps.result, out)
    return steps.result


def main(argv: Sequence[str]) -> int:
    own, pytest_args = split_argv(argv)
    args = parser().parse_args(own)
    pytest_args, dropped = drop_set_here(pytest_args)
    if dropped:
        print(f"bisect: left out {', '.join(dropped)}: each step sets it itself")
    run = bisect_packages if args.packages else bisect
    try:
        result = run(Path.cwd(), args.good, args.bad, pytest_args, args.out, metrics=args.metric,
                     batch_size=args.batch_size, python=args.python)  # fmt: skip
    except (BisectError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(step_table(result.steps, markdown=False, subject=SUBJECT if args.packages else "commit"))
    print(f"bisect: {result.verdict()}")
    cost = result.cost() if isinstance(result, PackageBisection) else f"{len(result.steps)} A/B job(s) in " \
        f"{result.seconds:.0f} s"  # fmt: skip
    print(f"bisect: {cost}; report: {args.out / 'bisect.md'}, {args.out / 'bisect.json'}")
    return result.exit_code()
