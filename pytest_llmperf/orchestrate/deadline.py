"""A deadline for a measurement in the pytest process itself (--llmperf-processes=1), as a worker process has one.

A worker process that runs past llmperf_worker_timeout is stopped by its controller. In one process nothing
could stop a `generate()` that never returns: the whole session hung. `deadline` arms SIGALRM (POSIX, main
thread) and raises `Overtime` in the measuring code when it fires. Overtime is a BaseException, so a backend's
`except Exception` does not swallow it. Python runs the handler between bytecodes: a call that hangs inside
native code without returning is stopped only by worker processes' deadline (their default). Where another
plugin owns SIGALRM (pytest-timeout's signal method), its timer is left alone and this deadline is not armed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class Overtime(BaseException):
    """The measurement ran past its deadline."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[bool]:
    """Raise Overtime in this block after `seconds`; yields whether the deadline could be armed."""
    usable = (
        hasattr(signal, "SIGALRM")
        and threading.current_thread() is threading.main_thread()
        and seconds > 0
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )
    if not usable:
        yield False
        return

    def expire(signum: int, frame: Any) -> None:
        raise Overtime(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
