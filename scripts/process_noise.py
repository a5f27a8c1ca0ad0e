"""How noisy a runner is between processes, and how many worker processes a slowdown needs.

Input: JSON reports of runs with worker processes (`--llmperf-json`), e.g. an A/A comparison of
unchanged code, `pytest benchmarks --llmperf-compare HEAD --llmperf-rtol=0 --llmperf-json=aa.json`.
For every gated metric and batch size it prints the spread of runs within one process (median over
processes of their coefficient of variation), the spread between processes (the CV of the
per-process medians, sigma_p: the noise the gate sees), and the processes per side a one-sided test
at alpha with power 1 - beta needs to see a slowdown delta (normal approximation):
    N per side ~ 2 (z_alpha + z_beta)^2 (sigma_p / delta)^2
For an A/B comparison it also prints how the two sides pair up, round by round: the correlation of a round's A
and B medians and the spread of their log ratio (what the paired gate tests), and the medians of both over the
rows (docs/notes/noise.md, "Turns: pairs measured seconds apart").
Usage: python scripts/process_noise.py aa.json [more.json ...] [--alpha 0.005] [--power 0.95]
"""

import argparse
import json
import math
from collections import defaultdict

import numpy as np
from scipy import stats

GATED = ("prefill_ms", "decode_token_ms", "throughput_tokens_per_s", "ttft_ms", "itl_ms")


def per_process(runs: list[dict], metric: str) -> dict[int, list[float]]:
    found: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        if metric in run.get("values", {}):
            found[run.get("process", 0)].append(run["values"][metric])
    return found


def log_cv(values: list[float]) -> float:
    """The standard deviation of the logs: for small spreads the CV, and symmetric for ratios."""
    return float(np.std(np.log(values), ddof=1)) if len(values) > 1 else float("nan")


def needed(sigma: float, delta: float, alpha: float, power: float) -> int:
    z = stats.norm.ppf(1 - alpha) + stats.norm.ppf(power)
    return max(2, math.ceil(2 * z * z * (sigma / math.log1p(delta)) ** 2))


def sides(report: dict):
    """(label, key, batch size, {metric: {process: [values]}}): the measured side's runs and, for an A/B
    comparison, the reference side's per-process medians (one value a process: no within-process spread)."""
    ab = any(o.get("reference") for o in report.get("outcomes", []))
    for bench in report["benchmarks"]:
        for batch in bench["batches"]:
            yield "B" if ab else "", bench["key"], batch["batch_size"], {
                m: per_process(batch.get("runs", []), m) for m in GATED}
    for outcome in report.get("outcomes", []):
        for batch in (outcome.get("reference") or {}).get("batches", []):
            medians = batch.get("processes") or {}
            yield "A", outcome["key"], batch["batch_size"], {
                m: {int(p): [v] for p, v in medians.get(m, {}).items()} for m in GATED}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--alpha", type=float, default=0.005, help="per-look alpha (default 0.005: 0.01 over 2 looks)")
    parser.add_argument("--power", type=float, default=0.95)
    args = parser.parse_args()
    pooled: dict[tuple, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(dict))
    for i, path in enumerate(args.reports):
        report = json.load(open(path))
        for side, key, batch_size, by_metric in sides(report):
            for metric, processes in by_metric.items():
                for process, values in processes.items():
                    pooled[(key, metric, batch_size)][side][(i, process)] = values
    print(f"{'benchmark':<40} {'metric':<24} {'batch':>5} {'side':>4} {'procs':>5} {'within':>7} "
          f"{'between':>7}  N(5%) N(10%)")
    correlations, pair_spreads = [], []
    for (key, metric, bs), by_side in sorted(pooled.items()):
        for side, processes in sorted(by_side.items()):
            medians = [float(np.median(v)) for v in processes.values()]
            within = float(np.nanmedian([log_cv(v) for v in processes.values()]))
            between = log_cv(medians)
            print(f"{key[:40]:<40} {metric:<24} {bs:>5} {side or '-':>4} {len(medians):>5} {within:>7.2%} "
                  f"{between:>7.2%}  {needed(between, 0.05, args.alpha, args.power):>5} "
                  f"{needed(between, 0.10, args.alpha, args.power):>5}")
        rounds = sorted(set(by_side.get("A", {})) & set(by_side.get("B", {})))
        if len(rounds) > 2:
            a = np.log([float(np.median(by_side["A"][r])) for r in rounds])
            b = np.log([float(np.median(by_side["B"][r])) for r in rounds])
            correlations.append(float(np.corrcoef(a, b)[0, 1]))
            pair_spreads.append(float(np.std(b - a, ddof=1)))
            print(f"{'':<40} {'':<24} {'':>5} {'pair':>4} {len(rounds):>5} correlation {correlations[-1]:+.2f}, "
                  f"sd of the log ratio {pair_spreads[-1]:.2%}")
    if correlations:
        print(f"pairs over {len(correlations)} rows: correlation of a round's A and B median "
              f"{np.median(correlations):+.2f} [{min(correlations):+.2f}, {max(correlations):+.2f}], sd of their log "
              f"ratio median {np.median(pair_spreads):.1%} [{min(pair_spreads):.1%}, {max(pair_spreads):.1%}]")


if __name__ == "__main__":
    main()
