"""The manager's half of worker processes: start them, stop them, read what they measured (worker.py is the
other half of the protocol; pyperf splits its manager and workers the same way).

A worker is pytest run on NODEID... by the same interpreter in the same environment (WORKER_MAIN: it leaves without
tearing down its modules), in the root of one side of a comparison (the working tree, or a git worktree of the
reference). Its output goes to a log whose tail is in every error; a worker that crashes, hangs past its deadline
or reports nothing is stopped with its whole process tree and raised as a WorkerError naming the side. While it
runs, the records it appends are read every POLL_S and handed to the caller (live progress,
report/campaign_progress.py).
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

from ..measure.allocator import steady_malloc_env
from ..measure.records import BenchmarkResult
from ..processes import die_with_parent, stop_tree, tail
from .forkserver import ForkedProcess, ForkServer, ForkServerError
from .turns import ENV_TURNS, TurnBroker
from .worker import ENV_BATCHES, ENV_OUT, ENV_PROCESS, ENV_SETTINGS, PROTOCOL

#: Protocols this manager reads: a side of an A/B comparison may import an older pytest-llmperf (this repository's
#: own benchmarks import the plugin of the side they measure); protocol 1 ignores ENV_BATCHES (measures all).
PROTOCOLS = (1, 2, 3, PROTOCOL)
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


#: A pytest of this interpreter and environment, as the ref's collection runs it (the workers: WORKER_MAIN).
PYTEST = (sys.executable, "-m", "pytest")


#: A worker's interpreter: pytest (`python -m pytest` with its arguments), then out without tearing down its modules.
#: With torch and transformers imported that teardown took 1.3-1.5 s after the last record, at the end of every
#: round (a worker of one small test: 8.1 s in all, 7.2 s without; docs/noise.md). Everything pytest does at its
#: end is done by then (unconfigure, cleanups, the records file closed), and the atexit handlers still run (a
#: user's conftest may stop a server there); only non-daemon threads still running are not waited for.
WORKER_MAIN = ("import atexit, os, sys; import pytest; code = pytest.console_main(); atexit._run_exitfuncs(); "
               "sys.stdout.flush(); sys.stderr.flush(); os._exit(code)")


def worker_args(nodeids: Sequence[str], extra_args: Sequence[str] = ()) -> list[str]:
    # -s: a test's output goes straight to the worker's log, so a crash leaves its last words in the tail
    return [*nodeids, "-q", "-s", "--no-header", "-p", "no:cacheprovider", *extra_args]


def worker_command(nodeids: Sequence[str], extra_args: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-c", WORKER_MAIN, *worker_args(nodeids, extra_args)]


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


def wait(proc: subprocess.Popen[bytes] | ForkedProcess, timeout_s: float, on_records: OnRecords | None,
         tail: RecordTail, clock: Callable[[], float] = time.monotonic) -> int:
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


@dataclass
class Launched:
    """A started worker, before its results are read."""

    side: Side
    index: int
    proc: subprocess.Popen[bytes] | ForkedProcess
    out: Path
    log: Path
    log_handle: Any
    settings: Mapping[str, Any]
    started: float
    tail: RecordTail


def launch(side: Side, index: int, nodeids: Sequence[str], *, settings: Mapping[str, Any], work_dir: Path,
           extra_args: Sequence[str] = (), batch_sizes: Mapping[str, Sequence[int]] | None = None,
           tag: str | None = None, wrapper: Sequence[str] = (), environ: Mapping[str, str] | None = None,
           fds_env: Mapping[str, Sequence[int]] | None = None, server: ForkServer | None = None) -> Launched:
    """Start one worker (pytest on NODEID... on its side, `worker_command`) with its log and records file: forked
    by `server` where there is one (orchestrate/forkserver.py), else from scratch (always with a `wrapper`). The
    descriptors of `fds_env` are inherited, each variable naming its descriptors comma-separated."""
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
    fds_env = fds_env or {}
    log_handle = open(log, "wb")  # noqa: SIM115 - closed by finish() or stop()
    try:
        proc: subprocess.Popen[bytes] | ForkedProcess
        if server is not None and not wrapper:
            try:
                proc = server.spawn(worker_command(nodeids, extra_args), worker_args(nodeids, extra_args),
                                    cwd=side.root, env=env, pythonpath=side.pythonpath, log_fd=log_handle.fileno(),
                                    fds_env=fds_env)
            except ForkServerError as exc:
                raise WorkerError(f"worker process {index} on {side.label} could not start: {exc}") from None
        else:
            env.update({name: ",".join(map(str, fds)) for name, fds in fds_env.items()})
            proc = subprocess.Popen(die_with_parent([*wrapper, *worker_command(nodeids, extra_args)], env=env,
                                                    cwd=side.root),
                                    cwd=side.root, stdout=log_handle, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                    pass_fds=tuple(fd for fds in fds_env.values() for fd in fds))
    except BaseException:
        log_handle.close()
        raise
    return Launched(side, index, proc, out, log, log_handle, settings, time.monotonic(), RecordTail(out))


def stop(worker: Launched) -> None:
    """Stop a worker with its whole process tree (Ctrl-C, a deadline, the other worker of its round failing)."""
    stop_tree(worker.proc.pid, grace_s=5, session=True)
    worker.proc.wait()
    worker.log_handle.close()


def timed_out(worker: Launched, timeout_s: float, workers: int = 1) -> WorkerError:
    """A worker past its deadline: `timeout_s` for one alone, `workers` times that for a round taking turns."""
    within = (f"within {timeout_s:g} s (--llmperf-worker-timeout)" if workers == 1 else
              f"within its A/B round's {timeout_s * workers:g} s ({workers} x --llmperf-worker-timeout)")
    return WorkerError(f"worker process {worker.index} on {worker.side.label} did not finish {within}; it was stopped. "
                       f"{_kept(worker.log, worker.settings)} ends with:\n{_indent(tail(worker.log))}")


def finish(worker: Launched, code: int) -> WorkerRun:
    """Read an exited worker's results; raise WorkerError if it did not complete."""
    stop_tree(worker.proc.pid, grace_s=5, session=True, root=False)  # anything it left behind in its session
    worker.log_handle.close()
    run = WorkerRun(worker.side, worker.index, seconds=time.monotonic() - worker.started)
    hello = _read(worker.out, run)
    if code not in COMPLETE_EXIT_CODES or hello is None:
        why = (f"exited with code {code}" if code not in COMPLETE_EXIT_CODES else
               "reported nothing (does the pytest-llmperf it imports on that side support worker processes?)")
        raise WorkerError(f"worker process {worker.index} on {worker.side.label} {why}. "
                          f"{_kept(worker.log, worker.settings)} ends with:\n{_indent(tail(worker.log))}")
    return run


def run_worker(side: Side, index: int, nodeids: Sequence[str], *, settings: Mapping[str, Any], work_dir: Path,
               timeout_s: float, extra_args: Sequence[str] = (),
               batch_sizes: Mapping[str, Sequence[int]] | None = None, tag: str | None = None,
               wrapper: Sequence[str] = (), environ: Mapping[str, str] | None = None,
               on_start: Callable[[subprocess.Popen[bytes] | ForkedProcess], None] | None = None,
               on_records: OnRecords | None = None, server: ForkServer | None = None) -> WorkerRun:
    """Run one worker to completion; raise WorkerError if it did not complete. `on_records` gets what it
    appends while it runs (progress). `wrapper` goes before its command and `environ` into its environment;
    `on_start` gets its process (counting workers under valgrind, run from threads: orchestrate/counting.py
    stops them when the controller is interrupted). `server`: forked by it (not from threads: one caller)."""
    worker = launch(side, index, nodeids, settings=settings, work_dir=work_dir, extra_args=extra_args,
                    batch_sizes=batch_sizes, tag=tag, wrapper=wrapper, environ=environ, server=server)
    if on_start is not None:
        on_start(worker.proc)
    try:
        code = wait(worker.proc, timeout_s, on_records, worker.tail)
    except subprocess.TimeoutExpired:
        stop(worker)
        raise timed_out(worker, timeout_s) from None
    except BaseException as exc:  # Ctrl-C, or the controller failing: no worker outlives it
        stop(worker)
        if isinstance(exc, ForkServerError):
            raise WorkerError(f"worker process {index} on {side.label} was lost: {exc}") from None
        raise
    return finish(worker, code)


@dataclass(frozen=True)
class RoundWork:
    """What one side's worker of a round measures."""

    side: Side
    nodeids: Sequence[str]
    batch_sizes: Mapping[str, Sequence[int]] | None = None
    on_records: OnRecords | None = None


def run_round(work: Sequence[RoundWork], index: int, *, settings: Mapping[str, Any], work_dir: Path,
              timeout_s: float, extra_args: Sequence[str] = (), server: ForkServer | None = None,
              clock: Callable[[], float] = time.monotonic) -> list[WorkerRun]:
    """The workers of one A/B round, alive together and taking turns at every run or batch size
    (orchestrate/turns.py), in the order given (A B, or B A); their runs in that order. The round may take
    `timeout_s` per worker; past it, or when one worker fails, every worker of the round is stopped."""
    broker = TurnBroker([w.side.name for w in work])
    workers: list[Launched] = []
    try:
        for item in work:
            child_ends = broker.pipes(item.side.name)
            try:
                workers.append(launch(item.side, index, item.nodeids, settings=settings, work_dir=work_dir,
                                      extra_args=extra_args, batch_sizes=item.batch_sizes,
                                      fds_env={ENV_TURNS: child_ends}, server=server))
            finally:
                broker.release_child_ends(child_ends)
        deadline = clock() + timeout_s * len(work)
        codes: dict[int, int] = {}
        heard: set[int] = set()
        while len(codes) < len(workers):
            broker.step(POLL_S)
            for i, (worker, item) in enumerate(zip(workers, work)):
                records = worker.tail.new()
                for record in records:  # a side whose pytest-llmperf predates turns ignores them: it runs alone
                    if record.get("type") == "hello" and i not in heard:
                        heard.add(i)
                        if not record.get("turns"):
                            broker.ignores_turns(item.side.name)
                if item.on_records is not None:
                    item.on_records(records)
                if i not in codes and worker.proc.poll() is not None:
                    codes[i] = worker.proc.returncode
                    if codes[i] not in COMPLETE_EXIT_CODES:
                        finish(worker, codes[i])  # raises WorkerError with its log; the other worker is stopped
            if clock() > deadline:  # name the worker the round waited for
                late = broker.holding_up()
                running = next((w for i, w in enumerate(workers) if i not in codes and w.side.name == late),
                               next(w for i, w in enumerate(workers) if i not in codes))
                raise timed_out(running, timeout_s, len(work))
        return [finish(worker, codes[i]) for i, worker in enumerate(workers)]
    except BaseException as exc:  # Ctrl-C, a failed or late worker: no worker of the round outlives it
        for worker in workers:
            if not worker.log_handle.closed:
                stop(worker)
        if isinstance(exc, ForkServerError):
            raise WorkerError(f"the workers of round {index} were lost: {exc}") from None
        raise
    finally:
        broker.close()


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
