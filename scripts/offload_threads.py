"""Main thread and CPU-expert worker on the same cores (fast = slow = cpu): share the torch threads or not?

    python scripts/offload_threads.py [--rounds 20] [--threads 2] [--batch 1] [--prompt 16] [--new 8]

Tiny Mixtral with 7 of its 32 experts resident (the seed-004 cpu setup), makespan schedule with the cost
model measured at start-up (or the given overrides), overlap on. Configurations, run once each per round
in rotating order:

- shared: the main thread and the worker each use `--threads` torch threads, also while they overlap;
- split:  while a CPU job runs beside the fast tier, the worker uses threads // 2 and the main thread the rest;
- one:    threads=1 for everything (the reference for a 2-core machine under load).

Prints median prefill ms and decode ms/token per configuration, and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import torch

from pytest_llmperf.backends.models import make_prompt, resolve_model
from pytest_llmperf.offload import OffloadEngine, OffloadOptions

EXPERT_GB = 3 * 256 * 512 * 4 / 2**30  # one tiny-Mixtral expert in fp32
CONFIGS = {"shared": (None, False), "split": (None, True), "one": (1, False)}  # name: (threads, split_threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=8)
    parser.add_argument("--latency-cpu", type=float, default=None, help="cost override (default: measured)")
    parser.add_argument("--latency-gpu", type=float, default=None, help="cost override (default: measured)")
    parser.add_argument("--cache-dir", default=None, help="where the embedded tiny Mixtral is built")
    args = parser.parse_args()

    path = resolve_model("tiny-mixtral", local_models={}, cache_dir=Path(args.cache_dir) if args.cache_dir else None)
    engine = OffloadEngine(path, OffloadOptions(fast_device="cpu", threads=args.threads,
                                                expert_budget_gb=7 * EXPERT_GB, schedule="makespan",
                                                latency_cpu=args.latency_cpu, latency_gpu=args.latency_gpu))
    ids = engine.tokenizer(make_prompt(args.prompt), add_special_tokens=False, return_tensors="pt").input_ids
    ids = ids[:, : args.prompt].expand(args.batch, -1).contiguous()
    print(f"load average before: {os.getloadavg()[0]:.2f}; torch {torch.__version__}; "
          f"costs {engine.report()['costs']}")
    prefill: dict[str, list[float]] = {name: [] for name in CONFIGS}
    decode: dict[str, list[float]] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for round_ in range(-2, args.rounds):  # two warm-up rounds
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            threads, split = CONFIGS[name]
            engine.threads = threads or args.threads
            engine.runtime.split_threads = split
            out = engine.generate(ids, args.new)
            if round_ >= 0:
                prefill[name].append(out.prefill_ns / 1e6)
                decode[name].append(statistics.fmean(out.decode_steps_ns) / 1e6)
    counters = out.counters
    print(f"load average after: {os.getloadavg()[0]:.2f}; last run: cpu_expert_calls "
          f"{counters['cpu_expert_calls']:.0f}, fetches {counters['fetches']:.0f}, hit_rate {counters['hit_rate']:.3f}")
    print(f"{'config':8} {'prefill ms':>11} {'decode ms/token':>16}   (medians of {args.rounds}; "
          f"batch {args.batch}, prompt {args.prompt}, new {args.new}, threads {args.threads})")
    for name in names:
        print(f"{name:8} {statistics.median(prefill[name]):11.2f} {statistics.median(decode[name]):16.2f}")
    engine.close()


if __name__ == "__main__":
    main()
