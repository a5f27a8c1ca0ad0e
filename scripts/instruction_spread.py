"""Counts of one benchmark in N counting processes (as --llmperf-instructions runs them): per process, the median
of its counted runs, and the spread (highest - lowest) / median over the processes, per batch size and metric.

Every process is `valgrind --tool=callgrind --instr-atstart=no python -m pytest NODEID` in ROOT, exactly the
counting worker of orchestrate/counting.py, two at a time by default (--concurrency 1: one at a time, on a machine
shared with other work). docs/notes/instructions.md took its figures with it; give --root a checkout with a
conftest that injects work to count a changed side, and --json to keep the counts for pairing. --keep-dumps keeps
every callgrind dump in the work directory it prints (--valgrind-arg=--dump-instr=yes for per-instruction costs), for
scripts/callgrind_diff.py to say where two processes' counts differ.
Usage: python scripts/instruction_spread.py NODEID [--processes 5] [--batch-sizes 1] [--root .] [--concurrency 2]
       [--json out.json] [--keep-dumps] [--valgrind-arg=ARG ...]
"""

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from pytest_llmperf.measure.instructions import count_table
from pytest_llmperf.orchestrate.counting import count, counting_spec
from pytest_llmperf.orchestrate.options import OPTIONS
from pytest_llmperf.orchestrate.pool import WorkerPool
from pytest_llmperf.orchestrate.protocol import ENV_KEEP_DUMPS, Side, WorkerSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nodeid")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--batch-sizes", default="", help="comma list; default: the test's own")
    parser.add_argument("--root", default=".")
    parser.add_argument("--concurrency", type=int, default=2, help="counting processes at a time (default 2)")
    parser.add_argument("--json", help="write {batch size: {metric: [per-process medians]}} here")
    parser.add_argument("--keep-dumps", action="store_true", help="keep callgrind's dumps and the work directory")
    parser.add_argument("--valgrind-arg", action="append", default=[], help="one more valgrind argument (repeat)")
    args = parser.parse_args()
    settings = {o.name: o.default for o in OPTIONS} | {"processes": 1, "device": "cpu", "threads": "auto"}
    sizes = {args.nodeid: [int(b) for b in args.batch_sizes.split(",")]} if args.batch_sizes else None
    work_dir = Path(tempfile.mkdtemp(prefix="llmperf-spread-"))
    if args.keep_dumps:
        os.environ[ENV_KEEP_DUMPS] = "1"  # the workers inherit this process's environment
    started = time.monotonic()
    try:
        pool = WorkerPool(work_dir, json.dumps(settings), 3600.0, work_dir)
        side = Side("", Path(args.root).resolve(), args.root)
        specs = [counting_spec(pool, WorkerSpec(side, i, (args.nodeid,), sizes), args.valgrind_arg)
                 for i in range(1, args.processes + 1)]
        runs = count(pool, specs, concurrency=args.concurrency)[""]
    finally:
        if args.keep_dumps:
            print(f"dumps kept in {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    print(f"{args.processes} counting processes in {time.monotonic() - started:.0f} s")
    found: dict[int, dict[str, list[float]]] = {}
    for run in runs:
        for measured in run.measured:
            for batch in measured.result.batches:
                for metric, per_process in count_table(batch.counted).items():
                    found.setdefault(batch.batch_size, {}).setdefault(metric, []).append(float(np.median(per_process)))
    for batch_size, metrics in sorted(found.items()):
        for metric, medians in sorted(metrics.items()):
            spread = (max(medians) - min(medians)) / float(np.median(medians))
            print(f"batch {batch_size} {metric}: spread {spread:.3%} over {len(medians)} processes; "
                  + ", ".join(f"{m:,.0f}" for m in medians))
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
