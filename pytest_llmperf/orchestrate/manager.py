"""The manager's half of worker processes: start them, stop them, read what they measured (worker.py is the
other half of the protocol; pyperf splits its manager and workers the same way).

A worker is `python -m pytest NODEID...` run by the same interpreter in the same environment, in the
root of one side of a comparison (the working tree, or a git worktree of the reference). Its output
goes to a log whose tail is in every error; a worker that crashes, hangs past its deadline or reports
nothing is stopped with its whole process tree and raised as a WorkerError naming the side. While it runs, the
records it appends are read every POLL_S and handed to the caller (live progress, report/campaign_progress.py).
Its whole log is kept in the report directory (`worker-logs/`, a CI job's artifact), so the temporary directory
of the workers never outlives the campaign.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..processes import die_with_parent, stop_tree, tail
from ..measure.allocator import steady_malloc_env
from ..measure.records import BenchmarkResult
from .worker import ENV_BATCHES, ENV_OUT, ENV_PROCESS, ENV_SETTINGS, PROTOCOL

#: Protocols this manager reads: a side of an A/B comparison may import an older pytest-llmperf (this repository's
#: own benchmarks import the plugin of the side they measure); protocol 1 ignores ENV_BATCHES (measures all).
PROTOCOLS = (1, 2, PROTOCOL)
#: pytest's exit codes after which the worker's reports are complete: all passed, some failed.
COMPLETE_EXIT_CODES = (0, 1)
#: Seconds between two reads of a running worker's records.
POLL_S = 0.5
#: Called with the records a running worker appended since the last call (often none), every POLL_S.
OnRecords = Callable[[list[dict[str, Any]]], None]


class WorkerError(RuntimeError):
    """A worker process that crashed, hung or reported nothing; the message holds its log tail."""


@dataclass(frozen=True)
class Side:
    """Where the workers of one side run: the working tree ("B", or "" without a comparison) or a ref ("A")."""

    name: str
    root: Path  # cwd of the workers: the rootdir of the pytest run, on this side
    label: str  # for messages: "the working tree", "origin/main (abc1234)"
    pythonpath: tuple[str, ...] = ()  # put first on PYTHONPATH: the user's project imports from this side

    def environ(self) -> dict[str, str]:
        """This process's environment with the side's checkout first on PYTHONPATH."""
        env = dict(os.environ)
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([*self.pythonpath, *filter(None, [env.get("PYTHONPATH")])])
        return env


@dataclass
class Measured:
    """One benchmark as one worker measured it."""

    nodeid: str
    result: BenchmarkResult


@dataclass
class WorkerRun:
    side: Side
    index: int
    measured: list[Measured] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    counts: bool = False  # a counting worker that counted (its hello said so)

    def failures(self, nodeid: str) -> list[dict[str, Any]]:
        return [r for r in self.reports if r["nodeid"] == nodeid and r["outcome"] == "failed"]

    def skip_reason(self, nodeid: str) -> str | None:
        return next((r["text"] for r in self.reports if r["nodeid"] == nodeid and r["outcome"] == "skipped"), None)


#: A pytest of this interpreter and environment, as the workers (and the ref's collection) run it.
PYTEST = (sys.executable, "-m", "pytest")


def worker_command(nodeids: Sequence[str], extra_args: Sequence[str] = ()) -> list[str]:
    # -s: a test's output goes straight to the worker's log, so a crash leaves its last words in the tail
    return [*PYTEST, *nodeids, "-q", "-s", "--no-header", "-p", "no:cacheprovider",
            *extra_args]


class RecordTail:
    """The whole lines a running worker has appended to its records file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:  # not written yet
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
        return records


def wait(proc: subprocess.Popen[bytes], timeout_s: float, on_records: OnRecords | None, tail: RecordTail,
         clock: Callable[[], float] = time.monotonic) -> int:
    """The worker's exit code; with `on_records`, its new records every POLL_S meanwhile. Past `timeout_s`,
    subprocess.TimeoutExpired."""
    deadline = clock() + timeout_s
    while True:
        left = deadline - clock()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        try:
            return proc.wait(timeout=min(POLL_S, left) if on_records is not None else left)
        except subprocess.TimeoutExpired:
            if on_records is not None:
                on_records(tail.new())


def run_worker(side: Side, index: int, nodeids: Sequence[str], *, settings: Mapping[str, Any], work_dir: Path,
               timeout_s: float, extra_args: Sequence[str] = (),
               batch_sizes: Mapping[str, Sequence[int]] | None = None, tag: str | None = None,
               wrapper: Sequence[str] = (), environ: Mapping[str, str] | None = None,
               on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
               on_records: OnRecords | None = None) -> WorkerRun:
    """Run one worker to completion; raise WorkerError if it did not complete. `on_records` gets what it
    appends while it runs (progress). `wrapper` goes before its command and `environ` into its environment;
    `on_start` gets its process (counting workers under valgrind, run from threads: orchestrate/counting.py
    stops them when the controller is interrupted)."""
    tag = tag or f"{side.name or 'worker'}{index}"
    out = work_dir / f"{tag}.jsonl"
    log = work_dir / f"{tag}.log"
    out.unlink(missing_ok=True)
    env = side.environ()
    env.update({ENV_OUT: str(out), ENV_SETTINGS: json.dumps(dict(settings)), ENV_PROCESS: str(index),
                "PYTHONUNBUFFERED": "1"})
    if batch_sizes:
        env[ENV_BATCHES] = json.dumps({nodeid: list(sizes) for nodeid, sizes in batch_sizes.items()})
    if settings.get("malloc") == "steady":
        env.update(steady_malloc_env())
    env.update(environ or {})
    started = time.monotonic()
    with open(log, "wb") as log_handle:
        proc = subprocess.Popen(die_with_parent([*wrapper, *worker_command(nodeids, extra_args)], env=env,
                                                cwd=side.root),
                                cwd=side.root, stdout=log_handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        if on_start is not None:
            on_start(proc)
        try:
            code = wait(proc, timeout_s, on_records, RecordTail(out))
        except subprocess.TimeoutExpired:
            stop_tree(proc.pid, grace_s=5, session=True)
            proc.wait()
            raise WorkerError(f"worker process {index} on {side.label} did not finish within {timeout_s:g} s "
                              f"(--llmperf-worker-timeout); it was stopped. {_kept(log, settings)} ends with:\n"
                              f"{_indent(tail(log))}") from None
        except BaseException:  # Ctrl-C, or the controller failing: no worker outlives it
            stop_tree(proc.pid, grace_s=5, session=True)
            proc.wait()
            raise
        stop_tree(proc.pid, grace_s=5, session=True, root=False)  # anything it left behind in its session
    run = WorkerRun(side, index, seconds=time.monotonic() - started)
    hello = _read(out, run)
    if code not in COMPLETE_EXIT_CODES or hello is None:
        why = (f"exited with code {code}" if code not in COMPLETE_EXIT_CODES else
               "reported nothing (does the pytest-llmperf it imports on that side support worker processes?)")
        raise WorkerError(f"worker process {index} on {side.label} {why}. {_kept(log, settings)} ends with:\n"
                          f"{_indent(tail(log))}")
    return run


def _kept(log: Path, settings: Mapping[str, Any]) -> str:
    """A failed worker's log copied to <report dir>/worker-logs/ (the temporary directory goes); what to call it."""
    kept = Path(str(settings.get("report_dir") or "reports")).resolve() / "worker-logs" / log.name
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, kept)
    except OSError as exc:
        return f"Its log could not be kept ({exc}); it"
    return f"Its log ({kept})"


def _read(out: Path, run: WorkerRun) -> dict[str, Any] | None:
    hello = None
    try:
        lines = out.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a worker killed mid-line: the lines before it stand
            continue
        if record.get("type") == "hello" and record.get("protocol") in PROTOCOLS:
            hello = record
            run.counts = bool(record.get("counts"))
        elif record.get("type") == "result":
            result = BenchmarkResult.from_json(record["result"])
            if record.get("counters_better") and not result.counters_better:  # protocol 1 sent them beside it
                result.counters_better = dict(record["counters_better"])
            run.measured.append(Measured(record["nodeid"], result))
        elif record.get("type") == "report":
            run.reports.append(record)
    return hello


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in (text or "(empty)").splitlines())
