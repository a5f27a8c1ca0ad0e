"""Turns: the two workers of an A/B round take turns run by run (or batch size by batch size), so that each pair is
measured a fraction of a second apart.

On a shared machine the speed changes within seconds (other tenants of the host, invisible to the load meter). Two
worker processes run one after the other are 15-30 s apart, so that change lands between them and their pair hardly
correlates; alive together and taking turns, the pair correlates and its log ratio scatters about half as much
(docs/notes/noise.md, "Turns: pairs measured seconds apart"). Turns at every run rather than every batch size cut a
whole job's variance to a quarter (docs/notes/noise.md, "Run by run"), so `run` is the default.

The protocol, over two pipes per worker (the descriptors in `ENV_TURNS`, inherited):

- The worker, before it measures (-o llmperf_interleave=run: before a batch size's warmups and before each of its
  runs; batch: before a batch size's warmups and runs), writes one byte ("my turn?") and waits for one byte back
  ("go"). Everything it does until its next request (the runs, then the next test's set-up: loading a
  model) happens in its turn; its start-up (imports, its first model) happens before its first request, beside the
  other worker's start-up, when nothing is measured.
- The broker (in the controlling process) gives the first turn only when every worker of the round has asked
  (or exited), then one turn at a time, ABBA over the turns: A B, B A, A B, ...; a worker that exits
  (end of file on its pipe) drops out. A worker whose hello lacks `turns` (a side that imports an older
  pytest-llmperf) ignores the pipes: while it runs no turn is given, so it measures alone.

If the controller dies, the worker reads end of file and measures without waiting (die_with_parent stops it).
"""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Sequence
from dataclasses import dataclass, field

from .protocol import ENV_TURNS  # "READ_FD,WRITE_FD": the worker's ends of its two pipes

_ASK, _GO = b"?", b"g"


class TurnClient:
    """The worker's half: `wait()` before each run or batch size blocks until the broker gives this worker the turn."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.open = True

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> TurnClient | None:
        raw = (environ if environ is not None else os.environ).get(ENV_TURNS)
        if not raw:
            return None
        try:
            read_fd, write_fd = (int(part) for part in raw.split(","))
            os.fstat(read_fd), os.fstat(write_fd)
        except (ValueError, OSError):  # not ours to use (a worker of a worker, a stale environment)
            return None
        return cls(read_fd, write_fd)

    def wait(self) -> None:
        if not self.open:
            return
        try:
            os.write(self.write_fd, _ASK)
            if os.read(self.read_fd, 1) != _GO:  # end of file: the controller is gone
                self.open = False
        except OSError:
            self.open = False


@dataclass
class Turn:
    """One worker as the broker sees it."""

    name: str  # the side: "A" or "B"
    asks: int  # the read end of its requests
    gives: int  # the write end of its turns
    asking: bool = False
    running: bool = False  # holds the turn
    done: bool = False  # exited (end of file)
    free: bool = False  # ignores turns (it could not use its pipes): runs alone
    given: int = 0  # turns given so far (its runs or batch sizes)


@dataclass
class TurnBroker:
    """The controller's half: owns the pipes of a round's workers and gives turns (`step`)."""

    order: Sequence[str]  # the round's first side first: A B, then B A, ... over the turns
    turns: dict[str, Turn] = field(default_factory=dict)
    started: bool = False  # every worker asked once: turns are given from now on

    def pipes(self, name: str) -> tuple[int, int]:
        """For the worker of side `name`: the descriptors it must inherit, named in its `ENV_TURNS` in this order."""
        ask_r, ask_w = os.pipe()
        give_r, give_w = os.pipe()
        self.turns[name] = Turn(name, ask_r, give_w)
        return give_r, ask_w

    @staticmethod
    def release_child_ends(fds: Sequence[int]) -> None:
        """Close this process's copy of a started worker's ends, so its exit reads as end of file here."""
        for fd in fds:
            os.close(fd)

    def ignores_turns(self, name: str) -> None:
        self.turns[name].free = True

    @property
    def finished(self) -> bool:
        return all(t.done for t in self.turns.values())

    def holding_up(self) -> str | None:
        """The side the round waits for: the worker holding the turn, else one that has not asked for one."""
        live = [t for t in self.turns.values() if not t.done]
        holder = next((t for t in live if t.running or t.free), None) or next((t for t in live if not t.asking), None)
        return holder.name if holder is not None else None

    def step(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for requests and exits, then give the turn where it is due."""
        open_turns = [t for t in self.turns.values() if not t.done]
        if not open_turns:
            return
        ready, _, _ = select.select([t.asks for t in open_turns], [], [], timeout_s)
        for turn in open_turns:
            if turn.asks not in ready:
                continue
            if os.read(turn.asks, 1):
                turn.asking, turn.running = True, False
            else:
                self._close(turn)
        self._give()

    def _give(self) -> None:
        live = [t for t in self.turns.values() if not t.done]
        if any(t.running for t in live) or any(t.free for t in live):
            return
        if not self.started:
            if not all(t.asking for t in live):
                return  # a worker is still starting up: nothing is measured beside a start-up
            self.started = True
        asking = [t for t in live if t.asking]
        if not asking:
            return
        turn = min(asking, key=lambda t: (t.given, self._rank(t.name, t.given)))
        turn.asking, turn.running = False, True
        turn.given += 1
        try:
            os.write(turn.gives, _GO)
        except OSError:  # it died between asking and now: its end of file follows
            turn.running = False

    def _rank(self, name: str, block: int) -> int:
        order = list(self.order) if block % 2 == 0 else list(reversed(self.order))
        return order.index(name) if name in order else len(order)

    def _close(self, turn: Turn) -> None:
        turn.done, turn.asking, turn.running = True, False, False
        for fd in (turn.asks, turn.gives):
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        for turn in self.turns.values():
            if not turn.done:
                self._close(turn)
