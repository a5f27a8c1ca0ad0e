"""How well two processes of one round pair up on this machine: taking turns block by block, or one after the other.

Each round starts an A and a B process that each load the same embedded model and time it (one thread, glibc's
thresholds fixed as the plugin fixes them); per block each takes `--runs` runs. `--mode turns` keeps both alive and
lets them measure one at a time, ABBA over the blocks (what `-o llmperf_interleave=batch` does); `--mode sequential`
runs all of A's blocks in one process, then all of B's in another (`-o llmperf_interleave=process`). Rounds alternate
which side goes first. Prints, per metric, the spread of the per-process medians on each side, the correlation of
a round's A and B, and the spread of their log ratio: what the A/B gate tests (docs/notes/noise.md, "Turns: pairs
measured seconds apart").

    python scripts/pair_timing.py --mode turns --rounds 16
    python scripts/pair_timing.py --mode sequential --rounds 16 --model tiny-bloom --batch-size 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

METRICS = ("prefill", "decode")


def worker(args: argparse.Namespace) -> None:
    """One process: load the model, then per byte read from --turn's first descriptor time one run, print it as
    a JSON line and write a byte back (end of file: done)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pytest_llmperf.measure.memory import steady_malloc

    steady_malloc()
    import torch

    torch.set_num_threads(1)
    from pytest_llmperf.backends.hf import HFBackend
    from pytest_llmperf.backends.models import build_embedded
    from pytest_llmperf.measure.runner import request_for
    from pytest_llmperf.measure.scenario import Scenario

    backend = HFBackend(build_embedded(args.model, Path(args.cache)), dtype="fp32")
    request = request_for(Scenario(batch_sizes=(args.batch_size,), sequence_length=128, decode_length=8),
                          args.batch_size)
    backend.generate(request)  # warmup
    read_fd, write_fd = args.turn
    while os.read(read_fd, 1):
        sample = backend.generate(request)
        decode = sum(sample.decode_steps_ns) / len(sample.decode_steps_ns)
        print(json.dumps({"prefill": sample.prefill_ns / 1e6, "decode": decode / 1e6}), flush=True)
        os.write(write_fd, b"x")


class Process:
    def __init__(self, args: argparse.Namespace, hash_seed: int | None = None) -> None:
        go_r, self.go = os.pipe()
        self.done, done_w = os.pipe()
        command = [sys.executable, __file__, "--worker", "--turn", str(go_r), str(done_w), "--model", args.model,
                   "--batch-size", str(args.batch_size), "--cache", args.cache]
        env = dict(os.environ)
        if hash_seed is not None:
            env["PYTHONHASHSEED"] = str(hash_seed)
        if args.layout == "fixed":  # no address-space randomization: both sides get the same layout
            command = ["setarch", os.uname().machine, "-R", *command]
        self.proc = subprocess.Popen(command, pass_fds=(go_r, done_w), stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        os.close(go_r)
        os.close(done_w)

    def block(self, runs: int) -> list[dict[str, float]]:
        taken = []
        for _ in range(runs):
            os.write(self.go, b"g")
            taken.append(json.loads(self.proc.stdout.readline()))  # type: ignore[union-attr]
            os.read(self.done, 1)
        return taken

    def close(self) -> None:
        os.close(self.go)
        self.proc.wait()
        os.close(self.done)


def one_round(args: argparse.Namespace, first: str, seed: int | None) -> dict[str, list[dict[str, float]]]:
    order = [first, "B" if first == "A" else "A"]
    taken: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    if args.mode == "turns":
        processes = {side: Process(args, seed) for side in order}
        for block in range(args.blocks):
            for side in (order if block % 2 == 0 else order[::-1]):
                taken[side] += processes[side].block(args.runs)
        for process in processes.values():
            process.close()
    else:
        for side in order:
            process = Process(args, seed)
            for _ in range(args.blocks):
                taken[side] += process.block(args.runs)
            process.close()
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("turns", "sequential"), default="turns")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3, help="runs per block")
    parser.add_argument("--blocks", type=int, default=3, help="blocks per process")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "llmperf-pair-timing"))
    parser.add_argument("--hash-seed", choices=("each", "round"), default="each",
                        help="each: every process its own random hash seed (Python's default); round: the two "
                             "processes of a round share one, drawn per round")
    parser.add_argument("--layout", choices=("random", "fixed"), default="random",
                        help="fixed: start the processes without address-space randomization (setarch -R)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--turn", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    medians: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    seeds = np.random.default_rng().integers(1, 2**32 - 1, size=args.rounds)
    for index in range(args.rounds):
        seed = int(seeds[index]) if args.hash_seed == "round" else None
        taken = one_round(args, "A" if index % 2 == 0 else "B", seed)
        for side in medians:
            medians[side].append({m: float(np.median([run[m] for run in taken[side]])) for m in METRICS})
    print(f"{args.model}, batch size {args.batch_size}, {args.mode}, {args.rounds} rounds of {args.blocks} blocks x "
          f"{args.runs} runs; hash seed per {'round' if args.hash_seed == 'round' else 'process'}, "
          f"{args.layout} layout")
    for metric in METRICS:
        a = np.log([m[metric] for m in medians["A"]])
        b = np.log([m[metric] for m in medians["B"]])
        print(f"  {metric}: sd of the processes {a.std(ddof=1):.3f} (A) {b.std(ddof=1):.3f} (B), correlation of a "
              f"round's A and B {np.corrcoef(a, b)[0, 1]:+.2f}, sd of their log ratio {(b - a).std(ddof=1):.3f}")


if __name__ == "__main__":
    main()
