"""Instruction counts: the host-side work of a run, counted under callgrind, the same in every process.

A counting worker (orchestrate/counting.py) runs `python -m pytest` under `valgrind --tool=callgrind
--instr-atstart=no`: start-up (importing torch, loading the model) and the warmups run uninstrumented, at
valgrind's base cost. Before the first counted run this process asks callgrind to start instrumenting (the
client request CALLGRIND_START_INSTRUMENTATION; torch's own `_valgrind_toggle` only switches *collection*,
which counts nothing while instrumentation is off). From then on the backend's clock is an `InstructionClock`:
each reading dumps callgrind's counters (CALLGRIND_DUMP_STATS_AT, which also zeroes them) and returns the
instructions executed since the run started. A backend that times its phases with `self.clock` therefore
returns a RunSample in instructions instead of nanoseconds, and `count_values` turns it into the metrics.

Client requests are a magic instruction sequence that valgrind recognises and a CPU runs as a no-op. They are
issued here from a few bytes of x86-64 code (the sequence of valgrind.h's VALGRIND_DO_CLIENT_REQUEST_EXPR) in an
executable page, called through ctypes: no compiler and no valgrind headers needed on the machine.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import platform
from collections.abc import Sequence
from pathlib import Path

from .backend import Backend, GenerationRequest
from .records import RunSample

#: The metrics of a counted run (measure/metrics.py METRICS defines them).
INSTRUCTION_METRICS = ("prefill_instructions", "decode_step_instructions", "e2e_instructions_per_token")
#: Runs counted per batch size in a counting process. Where instrumentation starts (the process's first batch size,
#: after uninstrumented warmups) one instrumented run comes first and is not kept: the first runs after
#: instrumentation starts count CPython's own settling (its adaptive interpreter, its allocator, this clock's first
#: calls: up to 3.7% of a 12 M-instruction pure-Python prefill), the later ones agree to 0.01%. A test's batch sizes
#: all warm up before instrumentation starts (measure/runner.py), so the later ones need no settling run: their first
#: counted run agrees with the next ones to a few hundredths of a percent (docs/notes/instructions.md, "What counting
#: costs"). A count does not vary between runs after that; its spread over processes is what a baseline records
#: (orchestrate/counting.py).
COUNTED_RUNS = 1
SETTLING_RUNS = 1
#: How counts are taken, recorded with a baseline that holds counts (its fingerprint's "counts"): a count taken
#: otherwise is not comparable. Python's objects come from glibc's malloc in a counting worker (PYTHONMALLOC=malloc),
#: since pymalloc's free costs more below an arena's 1 MiB boundary and arenas lie where each process's history put
#: them; with it a tiny-llama decode step counts 1.6% more (docs/notes/instructions.md, "The fix: glibc's malloc in
#: counting workers").
COUNTS_TAKEN_WITH = "PYTHONMALLOC=malloc"
#: Clock readings taken once, right after instrumentation starts: the clock's own first calls settle too.
CLOCK_WARMUP_READINGS = 24

# mov rax,rdi; mov rdx,rsi; rol rdi,3; rol rdi,13; rol rdi,61; rol rdi,51 (valgrind's preamble: rdi is
# unchanged, 3+13+61+51 = 128); xchg rbx,rbx (the request: rax -> args, rdx = default, result in rdx);
# mov rax,rdx; ret.  C signature: uint64_t request(uint64_t args[6], uint64_t default).
_X86_64_REQUEST = bytes.fromhex("4889f84889f248c1c70348c1c70d48c1c73d48c1c7334887db4889d0c3")
_RUNNING_ON_VALGRIND = 0x1001
_CALLGRIND_BASE = (ord("C") << 24) | (ord("T") << 16)  # VG_USERREQ_TOOL_BASE('C', 'T'): callgrind.h's requests
_DUMP_STATS_AT, _ZERO_STATS, _TOGGLE_COLLECT = _CALLGRIND_BASE + 3, _CALLGRIND_BASE + 1, _CALLGRIND_BASE + 2
_START_INSTRUMENTATION, _STOP_INSTRUMENTATION = _CALLGRIND_BASE + 4, _CALLGRIND_BASE + 5


class CountingError(RuntimeError):
    """Instructions cannot be counted here: the message says why and what to do."""


def platform_problem(machine: str | None = None, system: str | None = None) -> str | None:
    """Why this machine cannot issue callgrind's client requests from Python, or None."""
    machine = (machine or platform.machine()).lower()
    system = system or platform.system()
    if system != "Linux" or machine not in ("x86_64", "amd64"):
        return (
            f"instruction counts are taken on x86-64 Linux (callgrind's client requests are issued from x86-64 "
            f"code); this machine is {system} {machine}"
        )
    return None


class ClientRequests:
    """Callgrind's client requests, issued from this process (no-ops when it does not run under valgrind)."""

    def __init__(self) -> None:
        problem = platform_problem()
        if problem is not None:
            raise CountingError(problem)
        self._page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        self._page.write(_X86_64_REQUEST)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        self._call = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64)(address)

    def request(self, code: int, argument: int = 0) -> int:
        args = (ctypes.c_uint64 * 6)(code, argument, 0, 0, 0, 0)
        return int(self._call(args, 0))

    def running_on_valgrind(self) -> bool:
        return self.request(_RUNNING_ON_VALGRIND) > 0

    def start_instrumentation(self) -> None:
        self.request(_START_INSTRUMENTATION)

    def stop_instrumentation(self) -> None:
        self.request(_STOP_INSTRUMENTATION)

    def zero(self) -> None:
        self.request(_ZERO_STATS)

    def toggle_collect(self) -> None:
        self.request(_TOGGLE_COLLECT)

    def dump(self, label: str) -> None:
        text = ctypes.create_string_buffer(label.encode())
        self.request(_DUMP_STATS_AT, ctypes.addressof(text))


def dump_total(path: Path) -> int:
    """The instructions a callgrind dump file counted: its `totals:` line, the file's last lines."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(handle.tell() - 4096, 0))
        tail = handle.read().decode("ascii", "replace")
    for line in reversed(tail.splitlines()):
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise CountingError(f"callgrind's dump {path} holds no 'totals:' line")


class InstructionClock:
    """A Clock (measure/backend.py) that reads instructions executed since `reset()` instead of nanoseconds.

    Each reading dumps callgrind's counters to `<out>.<n>` (callgrind numbers its dumps; `<out>.<n>-<thread>`, one
    per thread, under --separate-threads=yes), reads the total with collection switched off (so that reading it is
    not counted) and deletes the files, unless `keep` (to diff where two processes' counts differ:
    scripts/callgrind_diff.py)."""

    def __init__(self, requests: ClientRequests, out: Path, keep: bool = False) -> None:
        self.requests = requests
        self.out = out  # callgrind's --callgrind-out-file
        self.keep = keep
        self.dumps = 0
        self.total = 0
        self.instrumenting = False

    def start(self) -> None:
        """Instrument from now on. Once per process: starting again would throw away every translation."""
        if not self.instrumenting:
            self.requests.start_instrumentation()
            self.instrumenting = True
            for _ in range(CLOCK_WARMUP_READINGS):
                self()

    def stop(self) -> None:
        """Back to valgrind's base cost once the process has counted its last run: its teardown and the interpreter's
        exit are not counted, and ran instrumented for ~20 s of a seed-000 counting process's 177 s."""
        if self.instrumenting:
            self.requests.stop_instrumentation()
            self.instrumenting = False

    def reset(self) -> None:
        self.requests.zero()
        self.total = 0

    def __call__(self) -> int:
        self.dumps += 1
        self.requests.dump(f"llmperf {self.dumps}")
        self.requests.toggle_collect()  # off: reading the file is not the run's work
        try:
            path = Path(f"{self.out}.{self.dumps}")
            paths = [path] if path.exists() else sorted(path.parent.glob(f"{path.name}-*"))  # one per thread
            if not paths:
                raise CountingError(f"callgrind wrote no dump {path}")
            for each in paths:
                self.total += dump_total(each)
                if not self.keep:
                    each.unlink()
        finally:
            self.requests.toggle_collect()
        return self.total


def not_counted(backend: Backend) -> str:
    """Why a backend's runs are not counted: its work is not timed with its clock in this process."""
    if backend.server_pids() or not backend.splits_prefill:
        where = "works in a server process, which callgrind does not see (only the pytest process is counted)"
    else:
        where = "does not time its phases with its clock in this process"
    return f"instructions not counted: the {backend.kind} backend {where}"


def count_values(sample: RunSample) -> dict[str, float]:
    """The instruction metrics of a run a backend timed with an InstructionClock (its times are instructions)."""
    values: dict[str, float] = {}
    if sample.prefill_ns is not None:
        values["prefill_instructions"] = float(sample.prefill_ns)
    if sample.decode_steps_ns:
        values["decode_step_instructions"] = sum(sample.decode_steps_ns) / len(sample.decode_steps_ns)
    tokens = sample.generated_tokens or sum(len(t) for t in sample.token_times_ns)
    if tokens and sample.end_to_end_ns > 0:
        values["e2e_instructions_per_token"] = sample.end_to_end_ns / tokens
    return values


def counted_runs(
    backend: Backend,
    request: GenerationRequest,
    runs: int,
    warmups: int,
    clock: InstructionClock,
    settling: int = SETTLING_RUNS,
) -> list[RunSample]:
    """Warmups (at valgrind's base cost until instrumentation starts), then `settling` runs counted and dropped where
    instrumentation starts here, and `runs` runs counted, with the backend's clock swapped for `clock`.
    Each run starts from a collected heap, frozen (gc.freeze), so that the garbage collector's passes fall alike in
    every run and cost what the run allocated, not what the session holds."""
    for _ in range(warmups):
        backend.generate(request)
    if clock.instrumenting:  # instrumentation started at an earlier batch size, whose settling run settled this
        settling = 0
    clock.start()
    timing_clock, backend.clock = backend.clock, clock
    samples = []
    try:
        for index in range(settling + runs):
            gc.collect()
            gc.freeze()  # the collector's passes scan only what the run allocates, not the whole test session
            clock.reset()
            counted = backend.generate(request)
            if index >= settling:
                samples.append(
                    RunSample(
                        batch_size=request.batch_size,
                        token_times_ns=[],
                        end_to_end_ns=0,
                        generated_tokens=counted.generated_tokens,
                        instructions=count_values(counted),
                    )
                )
            gc.unfreeze()
    finally:
        backend.clock = timing_clock
        gc.unfreeze()
    return samples


def count_table(samples: Sequence[RunSample]) -> dict[str, list[list[float]]]:
    """Per-run instruction values of every metric all counted runs hold, one list per counting process."""
    processes = sorted({s.process for s in samples})
    names = set.intersection(*(set(s.instructions) for s in samples)) if samples else set()
    return {
        name: [[s.instructions[name] for s in samples if s.process == p] for p in processes] for name in sorted(names)
    }
