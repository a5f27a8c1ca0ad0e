"""The sides of a job, prepared before its first worker: where each runs, with which interpreter and pytest options,
and which of the job's tests the compared ref has.

Against stored baselines there is one side, the working tree. An A/B job (--llmperf-compare REF) checks REF out into
a git worktree (worktree.py) and gives each side its own: the project first on PYTHONPATH (each imports its own code,
also where an installed copy would win), pytest's own options mapped to its checkout (`passthrough_args`), and its
environment (environments/: shared where the sides' dependencies are the same, else built for each side from its
own lock or requirements). Then the ref's tests are collected: a test whose module does not collect there is an
error on that test, never a `new` one.

pytest's own options of the invocation that a worker needs too (`passthrough_args`), as pytest parsed them, for one
side. A worker runs in its side's rootdir with the tests' node ids, so whatever decides how pytest loads those tests
must reach it: plugins given with -p, ini overrides (-o), the ini file (-c), the import mode, conftest handling,
warning filters and strictness. They are read from pytest's parsed options, not the command line's words
(`--import-mode importlib`, value as a separate word, is one option), and a path is given absolute, or for the A
side of an A/B job its counterpart in the ref's checkout. The rootdir is the side's own, always: a worker's node ids
are relative to it (an invocation with `--rootdir=tests` gets its tests' ids back).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .progress import CampaignProgress
from .protocol import ENV_COLLECT, Collected, CollectError, Side, WorkerError, read_records
from .session import LLMPerfSession
from .worktree import RefError, checkout, import_path

if TYPE_CHECKING:
    from ..environments.records import Environments

#: Lines of a collection's output an error quotes when the collection reported nothing.
OUTPUT_LINES = 30


def prepare(
    config: pytest.Config, perf_session: LLMPerfSession, stack: contextlib.ExitStack, progress: CampaignProgress
) -> list[Side]:
    """The job's sides: the working tree, after an A/B job's ref (checked out for the life of `stack`)."""
    root = worker_root(config)
    if not perf_session.settings.compare:
        return [Side("", root, "the working tree", args=tuple(passthrough_args(config, root)))]
    # a checkout can take seconds, an environment's build longer: say so first
    progress.say(f"checking out {perf_session.settings.compare} into a git worktree (the A side)")
    try:
        ref = stack.enter_context(checkout(perf_session.settings.compare, root))
    except RefError as exc:
        raise pytest.UsageError(f"llmperf: {exc}") from None
    if ref.cleared:
        progress.say(f"removed {len(ref.cleared)} comparison worktree(s) a killed run left behind")
    perf_session.compared_to = ref.label  # before the environments, whose lines name the A side by it
    perf_session.compared_commit = ref.commit
    envs = environments(perf_session, ref.toplevel, ref.source, root, progress)
    root_a = ref.counterpart(root)
    args_a = passthrough_args(config, root_a, ref.counterpart)
    return [
        Side("A", root_a, ref.label, import_path(ref.toplevel, root_a), envs.base.python, tuple(args_a),
             envs.base.pycache),
        Side("B", root, "the working tree", import_path(ref.source, root), envs.head.python,
             tuple(passthrough_args(config, root)), envs.head.pycache),
    ]  # fmt: skip


def worker_root(config: pytest.Config) -> Path:
    """Where the workers run, and their rootdir: pytest's rootdir, or the one directory the tests were collected from
    where it lies outside the rootdir (an ini in a subfolder given with -c, no --rootdir: pytest names such a test
    relative to the path it collected, so a worker run from the rootdir would not find it)."""
    root = Path(config.rootpath)
    given = {Path(config.invocation_params.dir, arg.split("::")[0]).resolve() for arg in config.args}
    if len(given) == 1 and (only := given.pop()).is_dir() and root != only and root not in only.parents:
        return only
    return root


def environments(
    perf_session: LLMPerfSession, base_top: Path, head_top: Path, rootdir: Path, progress: CampaignProgress
) -> Environments:
    """Each side's environment (environments/plan.py), from the dependency inputs at the rootdir or the nearest
    directory above it in the repository that has some; a UsageError naming the packages and the ways out where the
    dependencies differ and cannot be built."""
    from ..environments.inputs import detect, inputs_roots
    from ..environments.plan import prepare as prepare_environments
    from ..environments.records import BuildSettings, EnvironmentsError

    settings = perf_session.settings
    offline = os.environ.get("UV_OFFLINE", "").lower() in ("1", "true", "yes")
    try:
        base, head = inputs_roots(base_top, head_top, rootdir)
        extra = [os.path.relpath(rootdir / path, head) for path in settings.compare_deps_paths]  # given from rootdir
        detection = detect(base, head, extra)
        if settings.base_python:
            progress.say(f"checking the base side's interpreter {settings.base_python} (--llmperf-base-python)")
        elif settings.compare_deps == "build" or (detection.differs and settings.compare_deps == "auto"):
            progress.say("making each side's environment (--llmperf-compare-deps): the first build can take minutes")
        envs = prepare_environments(
            detection,
            mode=settings.compare_deps,
            base_python=settings.base_python,
            env_dir=settings.env_dir,
            settings=BuildSettings(offline=offline, extras=settings.env_extras, groups=settings.env_groups),
            cpu_target=perf_session.device == "cpu",
        )
    except EnvironmentsError as exc:
        raise pytest.UsageError(f"llmperf: {exc}") from None
    perf_session.environments = envs
    for line in envs.shown_lines(f"A {perf_session.compared_to}", "B the working tree"):
        progress.say(line)
    return envs


@dataclass
class Collection:
    """What a side's collection found: its tests, and the collectors that failed, by node id."""

    nodeids: set[str] = field(default_factory=set)
    errors: dict[str, str] = field(default_factory=dict)
    deselected: set[str] = field(default_factory=set)  # there, but deselected by that side's own options

    def error_for(self, nodeid: str) -> tuple[str, str] | None:
        """(the collector, what it said) when the test's module, or a directory or conftest above it, failed."""
        for where, text in self.errors.items():
            if not where or nodeid == where or nodeid.startswith((f"{where}::", f"{where}/")):
                return where or "the session", text
        return None


def collect(side: Side, items: Sequence[pytest.Item], work_dir: Path, timeout_s: float) -> Collection:
    """The tests of `items` that `side` has, and what could not be collected there (its records, protocol.py); a
    WorkerError when its collection reported nothing (a conftest that raises, a usage error), quoting its output."""
    files = sorted({item.nodeid.split("::", 1)[0] for item in items})
    present = [f for f in files if (side.root / f).exists()]
    if not present:
        return Collection()
    out = work_dir / f"collect-{side.name or 'worker'}.jsonl"
    env = {**side.environ(), ENV_COLLECT: str(out)}
    command = [side.python, "-m", "pytest", *present, "--collect-only", "-q", "-p", "no:cacheprovider", *side.args]
    try:
        done = subprocess.run(command, cwd=side.root, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise WorkerError(
            f"collecting the tests on {side.label} did not finish within {timeout_s:g} s (llmperf_worker_timeout)"
        ) from None
    records = read_records(out)
    found = Collection(errors={r.nodeid: r.text for r in records if isinstance(r, CollectError)})
    finished = [r for r in records if isinstance(r, Collected)]
    if not finished:
        output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-OUTPUT_LINES:]) or "(no output)"
        raise WorkerError(
            f"the tests of {side.label} could not be collected (pytest exited with code {done.returncode}), so "
            f"nothing can be compared with them:\n{output}"
        )
    found.nodeids, found.deselected = set(finished[-1].nodeids), set(finished[-1].deselected)
    return found


#: pytest's boolean options that change what a collection accepts.
FLAGS = (("noconftest", "--noconftest"), ("strict_markers", "--strict-markers"), ("strict_config", "--strict-config"))


def passthrough_args(
    config: pytest.Config, root: Path, counterpart: Callable[[Path], Path] = lambda path: path
) -> list[str]:
    """The options a worker of a side whose rootdir is `root` gets; `counterpart` maps a path of the working tree to
    that side's (the ref's checkout)."""
    option, invoked = config.option, Path(config.invocation_params.dir)

    def path(value: str) -> str:
        return str(counterpart((invoked / value).resolve()))

    args = [f"--rootdir={root}"]
    for name in getattr(option, "plugins", None) or []:
        args += ["-p", name]
    for override in getattr(option, "override_ini", None) or []:
        args += ["-o", override]
    if getattr(option, "inifilename", None):
        args += ["-c", path(option.inifilename)]
    if getattr(option, "confcutdir", None):
        args.append(f"--confcutdir={path(option.confcutdir)}")
    if getattr(option, "importmode", None):
        args.append(f"--import-mode={option.importmode}")
    for warning in getattr(option, "pythonwarnings", None) or []:
        args += ["-W", warning]
    args += [flag for name, flag in FLAGS if getattr(option, name, False)]
    return args
