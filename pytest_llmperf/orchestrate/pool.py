"""The pool of worker processes (pyperf's manager): start a worker from a spec, wait for it or for an A/B round of
them taking turns, and stop every one still running when the controller is interrupted.

A pool holds what every worker of a job shares: the work directory of their logs and records files, the settings
they measure with, their deadline, the fork server of each environment that forks them (or none: each starts from
scratch) and who hears their records while they run (live progress). Where a worker runs, with which interpreter and
pytest options, is its side's (protocol.Side). So starting a worker or a round takes a `WorkerSpec` (protocol.py)
and nothing else.

Each worker is a `RunningWorker` until it exits: one worker process, from its start to what it reported, started
from scratch or forked by the fork server, its output in a log whose tail is in every error, stopped with its whole
process tree, read once it exits. protocol.py says what they are told and what they answer. A worker that crashes,
hangs past its deadline or reports nothing is a WorkerError naming its side, and its whole log is kept in the report
directory (`worker-logs/`, a CI job's artifact), so the temporary directory of the workers never outlives the
campaign.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..processes import die_with_parent, stop_tree, tail
from .forkserver import ForkedProcess, ForkServer, ForkServerError
from .protocol import (
    ENV_BATCHES,
    ENV_OUT,
    ENV_PROCESS,
    ENV_ROOTS,
    ENV_SETTINGS,
    ENV_TURNS,
    Hello,
    Record,
    Side,
    WorkerError,
    WorkerRun,
    WorkerSpec,
    from_json,
    hello_problem,
    read_records,
)
from .turns import TurnBroker

#: pytest's exit codes after which the worker's reports are complete: all passed, some failed.
COMPLETE_EXIT_CODES = (0, 1)
#: Seconds between two reads of a running worker's records.
POLL_S = 0.5
#: A worker's interpreter: pytest (`python -m pytest` with its arguments; pytest.main, as console_main is deprecated
#: from pytest 9.2 and fails under PYTHONWARNINGS=error::DeprecationWarning), then out without tearing down its modules.
#: With torch and transformers imported that teardown took 1.3-1.5 s after the last record, at the end of every
#: round (a worker of one small test: 8.1 s in all, 7.2 s without; docs/notes/noise.md, "What a job pays besides
#: measuring"). Everything pytest does at its
#: end is done by then (unconfigure, cleanups, the records file closed), and the atexit handlers still run (a
#: user's conftest may stop a server there); only non-daemon threads still running are not waited for.
WORKER_MAIN = (
    "import atexit, os, sys; import pytest; code = int(pytest.main()); atexit._run_exitfuncs(); "
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(code)"
)

Process = subprocess.Popen[bytes] | ForkedProcess


def worker_args(nodeids: Sequence[str], extra_args: Sequence[str] = ()) -> list[str]:
    """pytest's arguments in a worker: its tests, quiet, and the invocation's own options (`extra_args`)."""
    # -s: a test's output goes straight to the worker's log, so a crash leaves its last words in the tail
    return [*nodeids, "-q", "-s", "--no-header", "-p", "no:cacheprovider", *extra_args]


def worker_command(args: Sequence[str], python: str = sys.executable) -> list[str]:
    """The command line of a worker started from scratch by `python` (its side's environment's)."""
    return [python, "-c", WORKER_MAIN, *args]


class RecordTail:
    """The whole records a running worker has appended to its records file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def new(self) -> list[Record]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:  # not written yet
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [record for line in lines if (record := from_json(line)) is not None]


@dataclass(eq=False)  # held in the pool's set of running workers: by identity
class RunningWorker:
    """A started worker, before its results are read."""

    spec: WorkerSpec
    proc: Process
    out: Path  # its records file
    log: Path
    log_handle: BinaryIO
    logs_dir: Path  # where its log is kept when it fails
    started: float

    def __post_init__(self) -> None:
        self.tail = RecordTail(self.out)

    @property
    def label(self) -> str:
        return f"worker process {self.spec.index} on {self.spec.side.label}"

    def wait(
        self,
        timeout_s: float,
        on_records: Callable[[list[Record]], None] | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> int:
        """Its exit code; with `on_records`, its new records every POLL_S meanwhile. Past `timeout_s`,
        subprocess.TimeoutExpired."""
        deadline = clock() + timeout_s
        while True:
            left = deadline - clock()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.proc.args, timeout_s)
            try:
                return self.proc.wait(timeout=min(POLL_S, left) if on_records is not None else left)
            except subprocess.TimeoutExpired:
                if on_records is not None:
                    on_records(self.tail.new())

    def stop(self) -> None:
        """Stop it with its whole process tree (Ctrl-C, a deadline, the other worker of its round failing)."""
        stop_tree(self.proc.pid, grace_s=5, session=True)
        self.proc.wait()
        self.log_handle.close()

    def timed_out(self, timeout_s: float, workers: int = 1) -> WorkerError:
        """It ran past its deadline: `timeout_s` alone, `workers` times that in a round taking turns."""
        within = (
            f"within {timeout_s:g} s (llmperf_worker_timeout)"
            if workers == 1
            else f"within its A/B round's {timeout_s * workers:g} s ({workers} x llmperf_worker_timeout)"
        )
        return self.failed(f"did not finish {within}; it was stopped")

    def failed(self, what: str) -> WorkerError:
        return WorkerError(f"{self.label} {what}. {self._kept()} ends with:\n{_indent(tail(self.log))}")

    def finish(self, code: int) -> WorkerRun:
        """Read what it reported once it exited; WorkerError if it did not complete."""
        stop_tree(self.proc.pid, grace_s=5, session=True, root=False)  # anything it left behind in its session
        self.log_handle.close()
        run = WorkerRun(self.spec.side, self.spec.index, seconds=time.monotonic() - self.started)
        run.add(read_records(self.out))
        if code not in COMPLETE_EXIT_CODES:
            raise self.failed(f"exited with code {code}")
        problem = hello_problem(run.hello)
        if problem is not None:
            raise self.failed(problem)
        return run

    def _kept(self) -> str:
        """Its log copied to the logs directory (the temporary directory goes); what to call it."""
        kept = self.logs_dir / self.log.name
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.log, kept)
        except OSError as exc:
            return f"Its log could not be kept ({exc}); it"
        return f"Its log ({kept})"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in (text or "(empty)").splitlines())


#: Hears a running worker's new records (often none), every POLL_S: live progress (progress.py).
Listener = Callable[[Side, list[Record]], None]


@dataclass
class WorkerPool:
    """Starts and waits for the workers of one job; `stop_all` stops those still running (from any thread)."""

    work_dir: Path
    settings: str  # JSON: the settings every worker measures with (Settings.for_worker)
    timeout_s: float  # a worker's deadline; a round of N workers taking turns has N times it
    logs_dir: Path  # a failed worker's log is kept here
    environ: Mapping[str, str] = field(default_factory=dict)  # added to every worker's environment
    servers: dict[str, ForkServer] = field(default_factory=dict)  # by interpreter: each environment's fork server
    # (a worker without a wrapper whose environment has one is forked by it; else it starts from scratch)
    listener: Listener | None = None
    running: set[RunningWorker] = field(default_factory=set, repr=False)
    stopping: bool = False  # stop_all was called: a worker that starts now is stopped at once
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self, spec: WorkerSpec, fds_env: Mapping[str, Sequence[int]] | None = None) -> RunningWorker:
        """Start one worker with its log and records file: forked by the server where there is one, else from
        scratch (always with a wrapper). The descriptors of `fds_env` are inherited, each variable naming its
        descriptors comma-separated."""
        out, log = self.work_dir / f"{spec.name}.jsonl", self.work_dir / f"{spec.name}.log"
        out.unlink(missing_ok=True)
        env = self._environ(spec, out)
        args = worker_args(spec.nodeids, spec.side.args)
        server = self.servers.get(spec.side.python)
        fds_env = fds_env or {}
        log_handle = open(log, "wb")  # noqa: SIM115 - closed by RunningWorker.finish() or stop()
        try:
            proc: Process
            if server is not None and not spec.wrapper:
                try:
                    proc = server.spawn(
                        worker_command(args, spec.side.python),
                        args,
                        cwd=spec.side.root,
                        env=env,
                        pythonpath=spec.side.pythonpath,
                        log_fd=log_handle.fileno(),
                        fds_env=fds_env,
                    )
                except ForkServerError as exc:
                    raise WorkerError(
                        f"worker process {spec.index} on {spec.side.label} could not start: {exc}"
                    ) from None
            else:
                env.update({name: ",".join(map(str, fds)) for name, fds in fds_env.items()})
                command = [*spec.wrapper, *worker_command(args, spec.side.python)]
                proc = subprocess.Popen(
                    die_with_parent(command, env=env, cwd=spec.side.root),
                    cwd=spec.side.root,
                    stdout=log_handle,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    pass_fds=tuple(fd for fds in fds_env.values() for fd in fds),
                )
        except BaseException:
            log_handle.close()
            raise
        worker = RunningWorker(spec, proc, out, log, log_handle, self.logs_dir, time.monotonic())
        with self._lock:
            stopping = self.stopping
            if not stopping:
                self.running.add(worker)
        if stopping:  # started from another thread while the pool was being stopped
            worker.stop()
            raise WorkerError(f"{worker.label} was stopped: the job is stopping")
        return worker

    def _environ(self, spec: WorkerSpec, out: Path) -> dict[str, str]:
        env = spec.side.environ()
        roots = os.pathsep.join(spec.side.pythonpath or (str(spec.side.root),))
        env.update(
            {
                ENV_OUT: str(out),
                ENV_SETTINGS: self.settings,
                ENV_PROCESS: str(spec.index),
                ENV_ROOTS: roots,
                "PYTHONUNBUFFERED": "1",
            }
        )
        if spec.batch_sizes:
            env[ENV_BATCHES] = json.dumps({nodeid: dict(sizes) for nodeid, sizes in spec.batch_sizes.items()})
        env.update(self.environ)
        env.update(spec.environ)
        return env

    def run(self, spec: WorkerSpec) -> WorkerRun:
        """Run one worker to completion; WorkerError if it did not complete."""
        worker = self.start(spec)
        listener = self.listener
        hear = (lambda records: listener(spec.side, records)) if listener is not None else None
        try:
            code = worker.wait(self.timeout_s, hear)
        except subprocess.TimeoutExpired:
            self._stop(worker)
            raise worker.timed_out(self.timeout_s) from None
        except BaseException as exc:  # Ctrl-C, or the controller failing: no worker outlives it
            self._stop(worker)
            if isinstance(exc, ForkServerError):
                raise WorkerError(f"{worker.label} was lost: {exc}") from None
            raise
        return self._finish(worker, code)

    def run_round(self, specs: Sequence[WorkerSpec], clock: Callable[[], float] = time.monotonic) -> list[WorkerRun]:
        """The workers of one A/B round, alive together and taking turns at every run or batch size (turns.py), in
        the order given (A B, or B A); their runs in that order. Past the round's deadline, or when one worker
        fails, every worker of the round is stopped."""
        broker = TurnBroker([spec.side.name for spec in specs])
        workers: list[RunningWorker] = []
        try:
            for spec in specs:
                child_ends = broker.pipes(spec.side.name)
                try:
                    workers.append(self.start(spec, {ENV_TURNS: child_ends}))
                finally:
                    broker.release_child_ends(child_ends)
            codes = self._take_turns(workers, broker, clock() + self.timeout_s * len(specs), clock)
            return [self._finish(worker, codes[i]) for i, worker in enumerate(workers)]
        except BaseException as exc:  # Ctrl-C, a failed or late worker: no worker of the round outlives it
            for worker in workers:
                if not worker.log_handle.closed:
                    self._stop(worker)
            if isinstance(exc, ForkServerError):
                raise WorkerError(f"the workers of round {specs[0].index} were lost: {exc}") from None
            raise
        finally:
            broker.close()

    def _take_turns(
        self, workers: list[RunningWorker], broker: TurnBroker, deadline: float, clock: Callable[[], float]
    ) -> dict[int, int]:
        """Give turns until every worker exited; their exit codes by position. A worker that failed raises its
        WorkerError; past the deadline, the one the round waited for is named."""
        codes: dict[int, int] = {}
        heard: set[int] = set()
        while len(codes) < len(workers):
            broker.step(POLL_S)
            for i, worker in enumerate(workers):
                records = worker.tail.new()
                hello = next((r for r in records if isinstance(r, Hello)), None)
                if hello is not None and i not in heard:
                    heard.add(i)
                    if not hello.turns:  # it could not use its pipes: it runs alone, no turn is given meanwhile
                        broker.ignores_turns(worker.spec.side.name)
                if self.listener is not None:
                    self.listener(worker.spec.side, records)
                code = worker.proc.poll() if i not in codes else None
                if code is not None:
                    codes[i] = code
                    if codes[i] not in COMPLETE_EXIT_CODES:
                        self._finish(worker, codes[i])  # raises its WorkerError; the other worker is stopped
            if clock() > deadline:
                late = broker.holding_up()
                running = [w for i, w in enumerate(workers) if i not in codes]
                raise next((w for w in running if w.spec.side.name == late), running[0]).timed_out(
                    self.timeout_s, len(workers)
                )
        return codes

    def _finish(self, worker: RunningWorker, code: int) -> WorkerRun:
        with self._lock:
            self.running.discard(worker)
        return worker.finish(code)

    def _stop(self, worker: RunningWorker) -> None:
        with self._lock:
            self.running.discard(worker)
        worker.stop()

    def stop_all(self) -> None:
        """Stop every worker still running (the controller was interrupted while workers ran in threads)."""
        with self._lock:
            self.stopping = True
            running, self.running = list(self.running), set()
        for worker in running:
            worker.stop()
