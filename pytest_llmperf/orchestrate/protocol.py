"""The worker protocol: everything the controlling pytest process and its worker processes say to each other.

A worker is pytest on the tests it measures, run in its side's root directory by the same interpreter:
`python -c WORKER_MAIN NODEID... -q -s --no-header -p no:cacheprovider [pytest's own options]`, started from
scratch or forked into the same state by the fork server (forkserver.py; zygote.py documents its socket). The
pool (pool.py) starts it with this environment:

    LLMPERF_WORKER_OUT       the records file it appends to; its presence makes a pytest process a worker
    LLMPERF_WORKER_SETTINGS  the controller's resolved settings, JSON (Settings.for_worker)
    LLMPERF_WORKER_PROCESS   its index on its side, from 1 (0 in a record: measured in the pytest process itself)
    LLMPERF_WORKER_BATCHES   JSON {nodeid: {batch size: runs}}: measure only these, that many runs each (a later
                             look; runs null: the scenario's); absent: all
    LLMPERF_WORKER_TURNS     "READ_FD,WRITE_FD": its ends of the turn pipes in an A/B round (turns.py)
    LLMPERF_WORKER_COUNT     a counting worker under callgrind: callgrind's output file (counting.py)
    LLMPERF_KEEP_DUMPS       "1": a counting worker keeps callgrind's dumps (scripts/instruction_spread.py)
    LLMPERF_WORKER_ROOTS     its side's directories (os.pathsep-joined): the project it must import from there
    LLMPERF_WORKER_IMPORTS   "1": it ends with what it imported (every worker where the sides have environments
                             of their own; else the first round's, for the baselines' fingerprint: ~0.1 s each)

The worker answers with records, one JSON object per line appended to LLMPERF_WORKER_OUT and flushed, so a worker
that dies leaves every line it finished (a line cut short is skipped):

    {"type": "hello", "protocol": N, "plugin": VERSION, "pid", "process", "counts", "turns"}   first, once
    {"type": "start", "nodeid"}                                                   a test starts
    {"type": "progress", "nodeid", "key", "batch_size", "position", "run", "runs", "retaken"}
                                         run `run` of `runs` done (at most one a second, and a batch size's last)
    {"type": "result", "nodeid", "result": BenchmarkResult.to_json()}          a benchmark measured
    {"type": "report", "nodeid", "when", "outcome", "text"}                     a test's report (not passed setup)
    {"type": "imports", "distributions": {NAME: VERSION}, "foreign": {MODULE: FILE}}   last (LLMPERF_WORKER_IMPORTS):
                         what it imported, and the side's own modules it imported from outside its directories

A side's tests are collected by `python -m pytest FILE... --collect-only` with LLMPERF_COLLECT_OUT naming its records
file (an A/B job's ref, before its first round): {"type": "collect_error", "nodeid", "text"} for each collector that
failed, then {"type": "collected", "nodeids": [...]} once the collection finished.

The pool reads them every POLL_S while the worker runs (progress) and all of them once it exits (`WorkerRun`). A
hello of another protocol is a WorkerError naming both versions: both sides of an A/B job must import one plugin.
In an A/B round the two workers also take turns, one byte each way over two pipes per worker (turns.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from .. import __version__
from ..measure.records import BenchmarkResult

ENV_OUT = "LLMPERF_WORKER_OUT"
ENV_SETTINGS = "LLMPERF_WORKER_SETTINGS"
ENV_PROCESS = "LLMPERF_WORKER_PROCESS"
ENV_BATCHES = "LLMPERF_WORKER_BATCHES"
ENV_TURNS = "LLMPERF_WORKER_TURNS"
ENV_COUNT = "LLMPERF_WORKER_COUNT"
ENV_KEEP_DUMPS = "LLMPERF_KEEP_DUMPS"
ENV_ROOTS = "LLMPERF_WORKER_ROOTS"
ENV_IMPORTS = "LLMPERF_WORKER_IMPORTS"
ENV_COLLECT = "LLMPERF_COLLECT_OUT"
#: The one protocol this plugin speaks (5: the records above; older ones are not read).
PROTOCOL = 5


class WorkerError(RuntimeError):
    """A worker process that crashed, hung or reported nothing; the message holds its log tail."""


@dataclass(frozen=True)
class Hello:
    """A worker's first record: who it is and what it does."""

    kind: ClassVar[str] = "hello"
    protocol: int
    pid: int
    process: int
    counts: bool = False  # a counting worker that counts (under callgrind)
    turns: bool = False  # takes turns with the other side (an A/B round)
    plugin: str = ""  # the pytest-llmperf version it imported

    @classmethod
    def of_this_process(cls, *, counts: bool, turns: bool) -> Hello:
        return cls(PROTOCOL, os.getpid(), process_index(), counts, turns, __version__)


@dataclass(frozen=True)
class Start:
    """A test starts (before its fixtures: a model may load for a while)."""

    kind: ClassVar[str] = "start"
    nodeid: str


@dataclass(frozen=True)
class Progress:
    """Run `run` of `runs` of a batch size is done; `position` is the batch size's place among the test's."""

    kind: ClassVar[str] = "progress"
    nodeid: str
    key: str
    batch_size: int
    position: tuple[int, int] | None
    run: int
    runs: int
    retaken: int = 0


@dataclass(frozen=True)
class Result:
    """A benchmark as this worker measured it."""

    kind: ClassVar[str] = "result"
    nodeid: str
    result: BenchmarkResult


@dataclass(frozen=True)
class Report:
    """A test's report: failed or skipped at any stage, or its call's outcome, with the text pytest shows."""

    kind: ClassVar[str] = "report"
    nodeid: str
    when: str
    outcome: str  # passed | failed | skipped
    text: str = ""


@dataclass(frozen=True)
class Imports:
    """What a worker imported, written as it ends: the installed versions of the distributions behind its modules,
    and its side's own modules that it imported from elsewhere (an installed copy of the project)."""

    kind: ClassVar[str] = "imports"
    distributions: dict[str, str] = field(default_factory=dict)
    foreign: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CollectError:
    """A collector that failed while a side's tests were collected (a module that does not import, a conftest)."""

    kind: ClassVar[str] = "collect_error"
    nodeid: str
    text: str


@dataclass(frozen=True)
class Collected:
    """A side's collection finished: the tests it has."""

    kind: ClassVar[str] = "collected"
    nodeids: list[str]
    deselected: list[str] = field(default_factory=list)  # collected, then deselected there (-m, -k in its ini)


Record = Hello | Start | Progress | Result | Report | Imports | CollectError | Collected
_KINDS: dict[str, type[Record]] = {
    k.kind: k for k in (Hello, Start, Progress, Result, Report, Imports, CollectError, Collected)
}


def to_json(record: Record) -> str:
    """One line of the records file (without its newline)."""
    data: dict[str, Any] = {"type": record.kind}
    for item in fields(record):
        value = getattr(record, item.name)
        data[item.name] = value.to_json() if isinstance(value, BenchmarkResult) else value
    return json.dumps(data)


def from_json(line: str | bytes) -> Record | None:
    """The record of one line, or None for a line that is not one (cut short by a kill, an unknown type)."""
    try:
        data = json.loads(line)
        kind = _KINDS[data.pop("type")]
        known = {item.name for item in fields(kind)}
        data = {name: value for name, value in data.items() if name in known}  # a newer worker's more: ignored
        if kind is Result:
            data["result"] = BenchmarkResult.from_json(data["result"])
        elif kind is Progress and data.get("position") is not None:
            data["position"] = tuple(data["position"])
        return kind(**data)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def worker_settings() -> dict[str, Any] | None:
    """In a worker, the controller's settings (ENV_SETTINGS); None in any other pytest process."""
    raw = os.environ.get(ENV_SETTINGS)
    return json.loads(raw) if raw else None


def process_index() -> int:
    """This worker's index on its side (ENV_PROCESS), 1 where it is not set."""
    return int(os.environ.get(ENV_PROCESS, "1"))


@dataclass(frozen=True)
class Side:
    """Where the workers of one side run: the working tree ("B", or "" without a comparison) or a ref ("A")."""

    name: str
    root: Path  # cwd of the workers: the rootdir of the pytest run, on this side
    label: str  # for messages: "the working tree", "origin/main (abc1234)"
    pythonpath: tuple[str, ...] = ()  # put first on PYTHONPATH: the user's project imports from this side
    python: str = sys.executable  # the interpreter of its environment (environments/: a side may have its own)
    args: tuple[str, ...] = ()  # pytest's own options of the invocation, for this side (sides.py `passthrough_args`)
    pycache: str | None = None  # where its workers write bytecode: a built environment's own (environments/)

    @property
    def own_environment(self) -> bool:
        """Its workers run an environment of their own, not the controller's."""
        return self.python != sys.executable

    def environ(self) -> dict[str, str]:
        """This process's environment with the side's checkout first on PYTHONPATH; in an environment of its own,
        without what points into the controller's (its PYTHONPATH, VIRTUAL_ENV) and its interpreter first on PATH."""
        env = dict(os.environ)
        if self.own_environment:
            for name in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"):
                env.pop(name, None)
            env["PATH"] = os.pathsep.join([os.path.dirname(self.python), *filter(None, [env.get("PATH")])])
        if self.pycache:  # not compiled at install: the first import writes what the workers use, once
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = self.pycache
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([*self.pythonpath, *filter(None, [env.get("PYTHONPATH")])])
        return env


@dataclass(frozen=True)
class WorkerSpec:
    """One worker to start: on which side, its index there, the tests it runs and, at a later look, their batch
    sizes with the runs each takes (None: the scenario's). A counting worker runs under `wrapper` (valgrind) with
    `environ` added to its environment."""

    side: Side
    index: int
    nodeids: tuple[str, ...]
    batch_sizes: Mapping[str, Mapping[int, int | None]] | None = None
    tag: str = ""  # names its log and records file (default: side and index)
    wrapper: tuple[str, ...] = ()
    environ: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.tag or f"{self.side.name or 'worker'}{self.index}"


@dataclass
class WorkerRun:
    """What one worker reported, once it exited: its hello, the benchmarks it measured, its tests' reports."""

    side: Side
    index: int
    hello: Hello | None = None
    measured: list[Result] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)
    seconds: float = 0.0
    imports: Imports | None = None

    @property
    def counts(self) -> bool:
        """A counting worker that counted (its hello said so)."""
        return self.hello is not None and self.hello.counts

    def add(self, records: Sequence[Record | None]) -> None:
        for record in records:
            if isinstance(record, Hello) and self.hello is None:
                self.hello = record
            elif isinstance(record, Result):
                self.measured.append(record)
            elif isinstance(record, Report):
                self.reports.append(record)
            elif isinstance(record, Imports):
                self.imports = record

    def failures(self, nodeid: str) -> list[Report]:
        return [r for r in self.reports if r.nodeid == nodeid and r.outcome == "failed"]

    def skip_reason(self, nodeid: str) -> str | None:
        return next((r.text for r in self.reports if r.nodeid == nodeid and r.outcome == "skipped"), None)


def read_records(path: Path) -> list[Record]:
    """Every whole record in a records file ([] if it was never written)."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return []
    return [record for line in lines if (record := from_json(line)) is not None]


def hello_problem(hello: Hello | None) -> str | None:
    """Why a worker's hello does not do (none, or another protocol); None when it does."""
    if hello is None:
        return "stopped before pytest-llmperf started in it (its log says why)"
    if hello.protocol != PROTOCOL or (hello.plugin and hello.plugin != __version__):
        return (
            f"runs pytest-llmperf {hello.plugin or 'older than 0.1.0'} (worker protocol {hello.protocol}); this "
            f"controller runs {__version__} (protocol {PROTOCOL}). Both sides of a job must run one pytest-llmperf"
        )
    return None
