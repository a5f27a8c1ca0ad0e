"""Issue 15's goals for the offload engine's cost model, measured on this machine (the seed-004 cpu setup:
tiny Mixtral, fast = slow = cpu, 7 of 32 experts resident, threads=1, batch 1, 16 prompt tokens).

    python scripts/offload_costs.py recovery  [--rounds 30 --new 16]  # start-up CPU cost 100x off, per decode step
    python scripts/offload_costs.py neighbour [--reps 5]              # start-up costs with a CPU-burning thread
    python scripts/offload_costs.py processes [--procs 8 --rounds 15] # CV of per-process medians, fresh processes
    python scripts/offload_costs.py processes --source /tmp/base      # also on another checkout, alternately
    python scripts/offload_costs.py pairs     [--pairs 30 --new 8]    # ours vs Fiddler's policy, interleaved pairs

- recovery: engines started with the measured costs, and with the CPU tier's start-up cost x100 and x0.01,
  with the live model (online_costs) and without; every round resets each engine's live model to its start-up
  costs (set_costs) and generates, engines in rotating order. Prints the median time of each decode step
  relative to the correctly-costed engine, and the first step from which it stays within 10%.
- neighbour: the start-up microbenchmark (measure_costs on the engine's own expert) quiet, beside a thread
  running torch matmuls, and beside a pure-Python spinning thread (it holds the GIL), interleaved `--reps`
  times. Prints the fitted figures and the largest ratio to the quiet median.
- processes: `--procs` fresh processes one after the other, each starting the engine (measuring its costs)
  and running the seed-004 configurations in rotating order; prints the coefficient of variation of each
  configuration's per-process medians, raw and "beside the others" (divided by the geometric mean of the
  other configurations in the same process, so the machine's state at the time cancels).
- pairs: ours (`makespan`, measured costs, live model) and Fiddler's policy (`fiddler`, 7/70) one after
  the other, the order alternating; decode tokens/s of each, the share of pairs ours wins, and the paired
  paired ratio ours/Fiddler with its 95% interval (pytest_llmperf.judge.stats.paired).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

# `processes --source DIR` runs its children on another checkout (e.g. the commit before issue 15).
sys.path.insert(0, os.environ.get("OFFLOAD_COSTS_SOURCE") or str(Path(__file__).resolve().parents[1]))

from pytest_llmperf.backends.models import make_prompt, resolve_model  # noqa: E402
from pytest_llmperf.judge.stats import paired  # noqa: E402
from pytest_llmperf.offload import OffloadEngine, OffloadOptions  # noqa: E402
from pytest_llmperf.offload.costs import LinearFit, measure_costs  # noqa: E402

EXPERT_GB = 3 * 256 * 512 * 4 / 2**30  # one tiny-Mixtral expert in fp32
SEED004 = {"ours-measured-costs": {"schedule": "makespan"},
           "fiddler-default": {"schedule": "fiddler", "latency_cpu": 7, "latency_gpu": 70},
           "fiddler-cpu7-gpu1": {"schedule": "fiddler", "latency_cpu": 7, "latency_gpu": 1},
           "fiddler-cpu1-gpu1": {"schedule": "fiddler", "latency_cpu": 1, "latency_gpu": 1}}


def engine(costs=None, **options) -> OffloadEngine:
    path = resolve_model("tiny-mixtral", local_models={}, cache_dir=None)
    opts = OffloadOptions(fast_device="cpu", threads=1, expert_budget_gb=7 * EXPERT_GB, **options)
    return OffloadEngine(path, opts, costs=costs)


def prompt(eng: OffloadEngine, n: int = 16) -> torch.Tensor:
    return eng.tokenizer(make_prompt(n), add_special_tokens=False, return_tensors="pt").input_ids[:, :n]


def decode_tps(out) -> float:
    return len(out.decode_steps_ns) / (sum(out.decode_steps_ns) / 1e9)


def rotated(names: list[str], r: int) -> list[str]:
    return names[r % len(names):] + names[: r % len(names)]


def load_line() -> str:
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def recovery(args: argparse.Namespace) -> None:
    right = engine()
    measured = right.measured_costs
    cpu = measured.cpu
    engines = {"right": right}
    for factor in (100.0, 0.01):
        wrong = replace(measured, cpu=LinearFit(cpu.a_ms * factor, cpu.b_ms * factor))
        engines[f"x{factor:g}"] = engine(costs=wrong)
        engines[f"x{factor:g} uncorrected"] = engine(costs=wrong, online_costs=False)
    ids = prompt(right)
    steps: dict[str, list[list[int]]] = {name: [] for name in engines}
    live_cpu: dict[str, list[list[float]]] = {name: [] for name in engines}  # after prefill, after each step
    trace: list[float] = []
    for eng in engines.values():  # the live 1-token CPU cost after every forward (prefill, then each step)
        eng.model.register_forward_hook(lambda *a, eng=eng: trace.append(eng.costs.cpu_ms(1)))
    print(f"{load_line()}; start-up costs: {measured.summary()}")
    names = list(engines)
    for r in range(-1, args.rounds):  # one warm-up round
        for name in rotated(names, r):
            eng = engines[name]
            eng.set_costs()  # the live model starts again from this engine's start-up costs
            trace.clear()
            out = eng.generate(ids, args.new)
            if r >= 0:
                steps[name].append(out.decode_steps_ns)
                live_cpu[name].append(list(trace))
    med = {name: np.median(np.asarray(v), axis=0) / 1e6 for name, v in steps.items()}
    cpu_med = {name: np.median(np.asarray(v), axis=0) for name, v in live_cpu.items()}
    n = len(med["right"])
    print("\nlive 1-token CPU expert cost relative to the correctly-costed engine's, after prefill (0) and "
          "after each decode step (medians)")
    print("| start-up CPU cost | " + " | ".join(f"after {i}" for i in range(n + 1)) + " | within 10% from |")
    print("|---" * (n + 3) + "|")
    for name in names[1:]:
        ratio = cpu_med[name] / cpu_med["right"]
        within = next((i for i in range(n + 1) if np.all(np.abs(np.log(ratio[i:])) <= np.log(1.10))), None)
        print(f"| {name} | " + " | ".join(f"{x:.3g}" for x in ratio) + f" | {'never' if within is None else within} |")
    print(f"\nmedian decode step time relative to the correctly-costed engine ({args.rounds} rounds, "
          f"{args.new} new tokens; right engine's step 1 = {med['right'][0]:.2f} ms); {load_line()}")
    print("| start-up CPU cost | " + " | ".join(f"step {i + 1}" for i in range(n)) + " | within 10% from step |")
    print("|---" * (n + 2) + "|")
    for name in names[1:]:
        ratio = med[name] / med["right"]
        within = next((i + 1 for i in range(n) if np.all(ratio[i:] <= 1.10)), None)
        print(f"| {name} | " + " | ".join(f"{x:.2f}" for x in ratio) + f" | {within or 'never'} |")
    first8 = {name: 8 / np.sum(med[name][:8]) * 1000 for name in names}
    print("\ndecode tokens/s over the first 8 steps: " + ", ".join(f"{k} {v:.1f}" for k, v in first8.items()))
    for eng in engines.values():
        eng.close()


def neighbour(args: argparse.Namespace) -> None:
    from pytest_llmperf.offload.costs import CostWarning

    eng = engine()
    layer = next(lay for lay in eng.layers if lay.slow_gate_up is not None)
    stop = threading.Event()

    def torch_burn() -> None:
        torch.set_num_threads(1)
        a = torch.randn(512, 512)
        while not stop.is_set():
            a @ a

    def python_burn() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    conditions = {"quiet": None, "torch thread": torch_burn, "python thread (GIL)": python_burn}
    figures: dict[str, list[dict[str, float]]] = {c: [] for c in conditions}
    print(load_line())
    for rep in range(args.reps):
        for name in rotated(list(conditions), rep):
            burner = conditions[name]
            thread = None
            if burner is not None:
                stop.clear()
                thread = threading.Thread(target=burner, daemon=True)
                thread.start()
                time.sleep(0.2)
            with eng.threads_applied(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", CostWarning)
                c = measure_costs(slow_weights=(layer.slow_gate_up[0], layer.slow_down[0]), fast_device="cpu",
                                  act=layer.module.act_fn)
            if thread is not None:
                stop.set()
                thread.join()
            cal = c.calibration
            figures[name].append({"cpu_1": c.cpu(1), "cpu_32": c.cpu(32), "copy": c.fetch_copy_ms(),
                                  "gpu_1": c.gpu(1), "sibling_cores": cal.sibling_cores,
                                  "foreign_cores": cal.foreign_cores, "rounds": cal.rounds,
                                  "warned": float(bool(caught))})
    keys = ["cpu_1", "cpu_32", "copy", "gpu_1"]
    quiet = {k: statistics.median(f[k] for f in figures["quiet"]) for k in keys}
    print(f"\nfitted start-up costs (ms), median of {args.reps} interleaved repetitions; "
          "ratio = worst repetition / quiet median")
    print("| condition | CPU expert, 1 token | CPU expert, 32 tokens | fetch copy | fast expert, 1 token "
          "| worst ratio | other threads (cores) | other processes (cores) | rounds | warned |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, runs in figures.items():
        med = {k: statistics.median(f[k] for f in runs) for k in keys}
        worst = max(max(f[k] / quiet[k], quiet[k] / f[k]) for f in runs for k in keys)
        print(f"| {name} | " + " | ".join(f"{med[k]:.4f}" for k in keys) + f" | {worst:.2f} | "
              f"{statistics.median(f['sibling_cores'] for f in runs):.2f} | "
              f"{statistics.median(f['foreign_cores'] for f in runs):.2f} | "
              f"{statistics.median(f['rounds'] for f in runs):.0f} | "
              f"{sum(f['warned'] for f in runs):.0f}/{len(runs)} |")
    eng.close()


def child(args: argparse.Namespace) -> None:
    """One fresh process: start the engine (its costs measured now) and run the seed-004 configurations."""
    warnings.simplefilter("ignore")  # the start-up CostWarning (not in older checkouts)
    eng = engine()
    ids = prompt(eng)
    schedulers = {}
    for name, knobs in SEED004.items():
        eng.set_costs(**knobs)
        schedulers[name] = eng.runtime.scheduler  # each configuration keeps its own live model
    tps: dict[str, list[float]] = {n: [] for n in SEED004}
    prefill: dict[str, list[float]] = {n: [] for n in SEED004}
    for r in range(-1, args.rounds):
        for name in rotated(list(SEED004), r):
            eng.runtime.scheduler = schedulers[name]
            out = eng.generate(ids, 8)
            if r >= 0:
                tps[name].append(decode_tps(out))
                prefill[name].append(out.prefill_ns / 1e6)
    print(json.dumps({"decode_tps": {n: statistics.median(v) for n, v in tps.items()},
                      "prefill_ms": {n: statistics.median(v) for n, v in prefill.items()},
                      "cpu_1tok_ms": eng.measured_costs.cpu(1)}))
    eng.close()


def cv(values: np.ndarray) -> float:
    return float(np.std(values, ddof=1) / np.mean(values))


def beside(runs: list[dict], metric: str, name: str) -> np.ndarray:
    """Each process's median of `name` over the geometric mean of the other configurations' in that process:
    what the machine did to all of them at the time cancels, the configuration's own spread remains."""
    return np.array([r[metric][name] / np.exp(np.mean([np.log(v) for k, v in r[metric].items() if k != name]))
                     for r in runs])


def processes(args: argparse.Namespace) -> None:
    """Fresh processes one after the other; with --source, alternately on this checkout and on that one."""
    print(load_line())
    sources = ["this checkout", *([args.source] if args.source else [])]
    results: dict[str, list[dict]] = {src: [] for src in sources}
    for i in range(args.procs):
        for src in rotated(sources, i):
            env = {**os.environ, "OFFLOAD_COSTS_SOURCE": src} if src != "this checkout" else None
            out = subprocess.run([sys.executable, __file__, "child", "--rounds", str(args.rounds)], check=True,
                                 capture_output=True, text=True, env=env)
            results[src].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for src, runs in results.items():
        print(f"\n{args.procs} fresh processes x {args.rounds} rounds each (8 new tokens), package from {src}; "
              "start-up CPU expert cost per process (ms): " + ", ".join(f"{r['cpu_1tok_ms']:.3f}" for r in runs))
        print("| configuration | decode tokens/s, median of process medians | CV | CV beside the others | "
              "prefill ms | CV | CV beside the others |")
        print("|---|---|---|---|---|---|---|")
        for name in SEED004:
            d = np.array([r["decode_tps"][name] for r in runs])
            p = np.array([r["prefill_ms"][name] for r in runs])
            print(f"| {name} | {np.median(d):.1f} | {cv(d):.1%} | {cv(beside(runs, 'decode_tps', name)):.1%} | "
                  f"{np.median(p):.2f} | {cv(p):.1%} | {cv(beside(runs, 'prefill_ms', name)):.1%} |")
    print(load_line())


def pairs(args: argparse.Namespace) -> None:
    from pytest_llmperf.offload.costs import CostWarning

    warnings.simplefilter("ignore", CostWarning)
    eng = engine()
    ids = prompt(eng)
    schedulers = {}
    for name in ("ours-measured-costs", "fiddler-default"):
        eng.set_costs(**SEED004[name])
        schedulers[name] = eng.runtime.scheduler
    ours, fiddler = [], []
    what: dict[str, list[list[float]]] = {name: [] for name in schedulers}  # prefill ms, CPU experts, fetches
    print(load_line())
    for i in range(-2, args.pairs):  # two warm-up pairs
        tps = {}
        for name in rotated(list(schedulers), i):
            eng.runtime.scheduler = schedulers[name]
            out = eng.generate(ids, args.new)
            tps[name] = decode_tps(out)
            what[name].append([out.prefill_ns / 1e6, out.counters["cpu_expert_calls"], out.counters["fetches"]])
        if i >= 0:
            ours.append(tps["ours-measured-costs"])
            fiddler.append(tps["fiddler-default"])
    ours_a, fid_a = np.array(ours), np.array(fiddler)
    c = paired(fid_a, ours_a, better="higher")
    low, high = c.interval()
    print(f"{args.pairs} interleaved pairs, {args.new} new tokens each: ours wins {int(np.sum(ours_a >= fid_a))}"
          f"/{args.pairs} (first 10: {int(np.sum(ours_a[:10] >= fid_a[:10]))}/10); medians ours "
          f"{np.median(ours_a):.1f}, Fiddler {np.median(fid_a):.1f} tokens/s; ratio ours/Fiddler "
          f"{float(c.ratio()):.3f} [{float(low):.3f}, {float(high):.3f}], p(ours worse) {float(c.p_worse()):.3f}")
    for name, rows in what.items():
        prefill, cpu_calls, fetches = np.median(np.asarray(rows[2:]), axis=0)
        print(f"{name}: prefill {prefill:.2f} ms; per generation (prefill + decode) {cpu_calls:.0f} CPU experts, "
              f"{fetches:.0f} fetches (medians)")
    live = schedulers["ours-measured-costs"].costs.snapshot()
    print(f"our live model at the end: scale {live['scale']}, sequential plans {live['sequential_plans']}, "
          f"probes {live['probes']}; {load_line()}")
    eng.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("recovery")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--new", type=int, default=16)
    p = sub.add_parser("neighbour")
    p.add_argument("--reps", type=int, default=5)
    p = sub.add_parser("processes")
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--source", default=None, help="also run children on another checkout's package, alternately")
    p = sub.add_parser("child")
    p.add_argument("--rounds", type=int, default=15)
    p = sub.add_parser("pairs")
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--new", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    {"recovery": recovery, "neighbour": neighbour, "processes": processes, "child": child,
     "pairs": pairs}[args.what](args)


if __name__ == "__main__":
    main()
