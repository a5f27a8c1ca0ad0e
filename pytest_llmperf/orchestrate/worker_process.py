"""One worker process, from its start to what it reported: started from scratch or forked by the fork server, its
output in a log whose tail is in every error, stopped with its whole process tree, read once it exits.

pool.py starts and waits for them; protocol.py says what they are told and what they answer. A worker that
crashes, hangs past its deadline or reports nothing is a WorkerError naming its side, and its whole log is kept in
the report directory (`worker-logs/`, a CI job's artifact), so the temporary directory of the workers never
outlives the campaign.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..processes import stop_tree, tail
from .forkserver import ForkedProcess
from .protocol import Record, WorkerError, WorkerRun, WorkerSpec, from_json, hello_problem, read_records

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
