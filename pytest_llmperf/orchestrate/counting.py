"""Counting workers: the benchmarks that ask for instruction counts, run once per side under callgrind.

How they fit the campaign (orchestrate/campaign.py): before the timing rounds, the controller starts one counting
worker per side, `valgrind --tool=callgrind --instr-atstart=no --dump-line=no python -c WORKER_MAIN NODEID...` (A/B:
the ref's and the working tree's at once, one per core), and attaches their counted runs to each side's timed
result. A count is the same in every process, so these rows are decided at the first look, however many timing
rounds follow; an update records BASELINE_PROCESSES of them, so that the baseline holds their spread.

What the counting process measures is its own host-side work: start-up and warmups run uninstrumented (valgrind's
base cost), instrumentation starts at the first counted run (measure/instructions.py). Its environment fixes what
would make a count differ between processes or cost hours under valgrind: Python's hash seed, glibc's malloc for
Python's objects (pymalloc's cost depends on where its arenas lie), one thread, and MKL's compatible code path
(valgrind 3.19 emulates AVX2's FMA slowly: one 128x384x384 matmul took 1.8 s in MKL's AVX2 path under valgrind,
0.01 s in the compatible one; docs/notes/instructions.md, "What counting costs").
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any

import pytest

from ..measure.instructions import COUNTS_TAKEN_WITH, platform_problem
from ..measure.records import BenchmarkResult
from .options import marker_kwargs
from .pool import WorkerPool
from .protocol import ENV_COUNT, Side, WorkerError, WorkerRun, WorkerSpec
from .session import LLMPerfSession

VALGRIND_ARGS = ("--tool=callgrind", "--instr-atstart=no", "--dump-line=no")
# PYTHONMALLOC=malloc: pymalloc's free() costs 4 instructions more for a block in the part of its 1 MiB arena below
# the next 1 MiB address boundary (address_in_range's radix-tree test), and where arenas lie depends on the process's
# history (a random docstring scipy.stats draws at import, files in the working directory): a pure-Python loop's
# count moved 0.3-0.7% between processes of unchanged code. glibc's malloc has no such address test.
COUNTING_ENV = {
    "PYTHONHASHSEED": "0",
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    **dict([COUNTS_TAKEN_WITH.split("=", 1)]),
}
#: Counting processes an update records per benchmark: their spread goes into the baseline.
BASELINE_PROCESSES = 3
INSTALL_HINT = (
    "install it: apt-get install valgrind (Debian, Ubuntu), dnf install valgrind (Fedora), "
    "or drop --llmperf-instructions"
)


def wants_instructions(item: pytest.Item, option: bool) -> bool:
    """A test counts instructions when its markers (merged nearest first, as every keyword) say instructions=True,
    or --llmperf-instructions is given and they do not say instructions=False."""
    given = marker_kwargs(item).get("instructions")
    return bool(option if given is None else given)


def check_setup(perf_session: LLMPerfSession) -> None:
    """Refuse --llmperf-instructions up front where it cannot count: a UsageError naming the fix."""
    only = perf_session.settings.instructions_only
    if only and perf_session.mode != "gate":
        # a baseline holds wall time and counts; one recorded from counts alone would lose its timings
        raise pytest.UsageError(
            "llmperf: --llmperf-instructions-only measures no wall time, so it cannot record a "
            "baseline (--llmperf-update and --llmperf-update-missing record both): record with "
            "--llmperf-update --llmperf-instructions, then gate with --llmperf-instructions-only"
        )
    problem: str | None
    if perf_session.device != "cpu":
        problem = (
            f"instructions are counted on the cpu target only (callgrind sees the host's instructions, not "
            f"a GPU's); this session measures --llmperf-device={perf_session.device}"
        )
    elif perf_session.in_process:
        problem = (
            "instructions are counted in a worker process under valgrind; --llmperf-processes=1 measures in "
            "this process: give --llmperf-processes=2 or more, or compare with --llmperf-compare REF"
        )
    else:
        problem = setup_problem()
    if problem is not None:
        raise pytest.UsageError(f"llmperf: --llmperf-instructions{'-only' if only else ''}: {problem}")


def setup_problem(which: Any = shutil.which, torch_supported: Any = None) -> str | None:
    """Why instructions cannot be counted on this machine (valgrind missing, a platform torch or we cannot count
    on), said before anything runs; None when they can."""
    problem = platform_problem()
    if problem is not None:
        return problem
    if which("valgrind") is None:
        return f"instruction counts are taken under valgrind (callgrind), which is not installed here; {INSTALL_HINT}"
    supported = torch_supported() if torch_supported is not None else _torch_supports_valgrind()
    if supported is False:
        return (
            "torch says this platform does not support valgrind (torch._C._valgrind_supported_platform() is "
            "False): its build cannot run under callgrind here; drop --llmperf-instructions"
        )
    return None


def _torch_supports_valgrind() -> bool | None:
    """torch's own answer, where torch is installed (None: no torch, nothing to ask)."""
    try:
        import torch
    except ImportError:
        return None
    check = getattr(torch._C, "_valgrind_supported_platform", None)
    return bool(check()) if check is not None else None


def specs_for(
    perf_session: LLMPerfSession, items: Sequence[pytest.Item], sides: Sequence[Side], pool: WorkerPool
) -> list[WorkerSpec]:
    """The counting workers of a campaign: none when no test asks for instructions (or off the cpu target); an
    update records BASELINE_PROCESSES per side, else one. A WorkerError when this machine cannot count."""
    nodeids = tuple(item.nodeid for item in items if wants_instructions(item, perf_session.settings.instructions))
    if not nodeids or perf_session.device != "cpu":
        return []
    problem = setup_problem()  # asked by a marker only: not checked at configure time
    if problem is not None:
        raise WorkerError(problem)
    processes = BASELINE_PROCESSES if perf_session.mode != "gate" and not perf_session.settings.compare else 1
    return [counting_spec(pool, WorkerSpec(side, i, nodeids)) for i in range(1, processes + 1) for side in sides]


def counting_spec(pool: WorkerPool, spec: WorkerSpec, valgrind_args: Sequence[str] = ()) -> WorkerSpec:
    """`spec` as a counting worker: under callgrind (VALGRIND_ARGS, then `valgrind_args`), with COUNTING_ENV."""
    tag = f"count-{spec.side.name or 'worker'}{spec.index}"
    out = pool.work_dir / f"{tag}.callgrind"
    wrapper = (
        "valgrind",
        *VALGRIND_ARGS,
        *valgrind_args,
        f"--callgrind-out-file={out}",
        f"--log-file={pool.work_dir / tag}.valgrind",
    )
    return replace(spec, tag=tag, wrapper=wrapper, environ={**COUNTING_ENV, ENV_COUNT: str(out)})


def count(
    pool: WorkerPool,
    specs: Sequence[WorkerSpec],
    concurrency: int = 2,
    on_wait: Callable[[float, int], None] | None = None,
) -> dict[str, list[WorkerRun]]:
    """Run the counting workers of `specs`, `concurrency` at a time (two: one per core), by side; a WorkerError if
    one failed. `on_wait` gets the seconds so far and the workers done, every second while they run (from this
    thread: the workers run in others)."""
    with ThreadPoolExecutor(max_workers=concurrency) as threads:
        futures = [threads.submit(pool.run, spec) for spec in specs]
        try:
            started, pending = time.monotonic(), set(futures)
            while pending:
                finished, pending = wait(pending, timeout=1.0, return_when=FIRST_EXCEPTION)
                for future in finished:
                    future.result()  # a failed worker raises here, whichever finished first
                if on_wait is not None and pending:
                    on_wait(time.monotonic() - started, len(futures) - len(pending))
            done = [future.result() for future in futures]
        except BaseException:  # Ctrl-C, SIGTERM or a failed worker: none of them outlives the controller
            for future in futures:
                future.cancel()
            pool.stop_all()
            raise
    runs: dict[str, list[WorkerRun]] = {}
    for run in done:
        runs.setdefault(run.side.name, []).append(run)
    return runs


def attach(result: BenchmarkResult, runs: Sequence[WorkerRun], label: str) -> BenchmarkResult:
    """`result` with the runs its side's counting workers counted, or, per batch size, why there are none."""
    if not runs:
        return result
    parts = [m.result for run in runs for m in run.measured if m.nodeid == result.nodeid and m.result.key == result.key]
    why = None
    if not all(run.counts for run in runs):
        why = f"instructions not counted on {label}: its pytest-llmperf does not count them"
    elif not parts:
        failed = "; ".join(
            r.text.strip().splitlines()[-1] for run in runs for r in run.failures(result.nodeid) if r.text.strip()
        )
        why = f"instructions not counted: the counting process on {label} measured nothing" + (
            f" ({failed})" if failed else ""
        )
    batches = []
    for batch in result.batches:
        found = [b for part in parts if (b := part.batch(batch.batch_size)) is not None]
        error = why or next((b.count_error or b.error for b in found if b.count_error or b.error), None)
        counted = [s for b in found for s in b.counted] if error is None else []
        batches.append(
            replace(
                batch,
                counted=counted,
                count_error=error
                or (None if counted else f"instructions not counted on {label}: no counted run of this batch size"),
            )
        )
    return replace(result, batches=batches)
