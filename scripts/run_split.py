"""How an A/B job's noise splits between processes and runs, and what each summary of a process's runs costs.

Input: JSON reports (`--llmperf-json`) of A/A jobs taken with one look of many processes and runs, e.g.

    pytest tests/perf --llmperf-compare=HEAD --llmperf-rtol=0 --llmperf-processes=12 -o llmperf_max_processes=12 \\
        --llmperf-runs=12 --llmperf-fail-on=none --llmperf-json=aa.json

For every gated row it prints the scatter of one run within its process (`within`, log sd, both sides), the
scatter of a pair's effect beyond what its runs explain (`between`, tau), how a round's A and B processes correlate
(the machine's state they share, which pairing cancels) and how its A and B runs at the same turn do; then the sd of
the pairs' effects when each process is summarised by the mean, trimmed means, the median, Hodges-Lehmann,
or the mean of its faster half, of its first `--runs` runs (the gate uses the mean: judge/stats.py, RUN_TRIM).
The last lines give the geometric mean of those sds over every row of every report.

    python scripts/run_split.py aa_*.json --runs 6 12
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Callable

import numpy as np
from scipy import stats

GATED = ("prefill_ms", "decode_token_ms", "throughput_tokens_per_s")


def rows(report: dict) -> dict[tuple[str, str, int], tuple[np.ndarray, np.ndarray]]:
    """Per (test, metric, batch size): (A runs, B runs) as (pairs, runs) arrays of log values in the bad direction,
    the processes both sides measured, cut to the fewest runs any of them took."""
    found = {}
    references = {o["key"]: o.get("reference") or {} for o in report.get("outcomes", [])}
    for bench in report["benchmarks"]:
        reference = {b["batch_size"]: b for b in references.get(bench["key"], {}).get("batches", [])}
        for batch in bench["batches"]:
            theirs = reference.get(batch["batch_size"], {}).get("process_runs")
            if not theirs:
                continue
            for metric in GATED:
                ours: dict[int, list[float]] = defaultdict(list)
                for run in batch.get("runs") or []:
                    if metric in run["values"]:
                        ours[int(run["process"])].append(run["values"][metric])
                a = {int(p): v for p, v in theirs.get(metric, {}).items()}
                common = sorted(set(a) & set(ours))
                if len(common) < 3:
                    continue
                n = min(min(len(a[p]), len(ours[p])) for p in common)
                sign = -1.0 if metric.startswith("throughput") else 1.0
                found[(bench["key"], metric, batch["batch_size"])] = (
                    sign * np.log([a[p][:n] for p in common]), sign * np.log([ours[p][:n] for p in common]))
    return found


def _hodges_lehmann(x: np.ndarray) -> np.ndarray:
    i, j = np.triu_indices(x.shape[-1])
    return np.median((x[..., i] + x[..., j]) / 2, axis=-1)


SUMMARIES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "mean": lambda x: x.mean(axis=-1),
    "trim10": lambda x: stats.trim_mean(x, 0.1, axis=-1),
    "trim25": lambda x: stats.trim_mean(x, 0.25, axis=-1),
    "median": lambda x: np.median(x, axis=-1),
    "HL": _hodges_lehmann,
    "fast half": lambda x: np.sort(x, axis=-1)[..., : x.shape[-1] // 2].mean(axis=-1),
}


def split(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    n = a.shape[1]
    within = float(np.sqrt((a.var(axis=1, ddof=1).mean() + b.var(axis=1, ddof=1).mean()) / 2))
    effects = b.mean(axis=1) - a.mean(axis=1)
    between = float(np.sqrt(max(effects.var(ddof=1) - 2 * within**2 / n, 0.0)))
    centred_a, centred_b = a - a.mean(axis=1, keepdims=True), b - b.mean(axis=1, keepdims=True)
    return {"pairs": a.shape[0], "runs": n, "within": within, "between": between,
            "process corr": float(np.corrcoef(a.mean(axis=1), b.mean(axis=1))[0, 1]),
            "run corr": float(np.corrcoef(centred_a.ravel(), centred_b.ravel())[0, 1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--runs", type=int, nargs="+", default=[6, 12], help="runs per process summarised")
    args = parser.parse_args()
    logs: dict[tuple[int, str], list[float]] = defaultdict(list)
    print("| report | row | pairs x runs | within | between | process corr | run corr | sd of the pairs' effect: "
          + ", ".join(f"{name} at {n} runs" for n in args.runs for name in SUMMARIES) + " |")
    for path in args.reports:
        for (key, metric, batch_size), (a, b) in rows(json.load(open(path))).items():
            figures = split(a, b)
            sds = []
            for n in args.runs:
                for name, summary in SUMMARIES.items():
                    sd = float((summary(b[:, :n]) - summary(a[:, :n])).std(ddof=1))
                    logs[(n, name)].append(np.log(sd))
                    sds.append(f"{sd:.3f}")
            print(f"| {path} | {metric} @ {batch_size} | {figures['pairs']} x {figures['runs']} | "
                  f"{figures['within']:.3f} | {figures['between']:.3f} | {figures['process corr']:+.2f} | "
                  f"{figures['run corr']:+.2f} | {' '.join(sds)} |")
    for n in args.runs:
        print(f"geometric mean over the rows at {n} runs: " + ", ".join(
            f"{name} {np.exp(np.mean(logs[(n, name)])):.3f}" for name in SUMMARIES))


if __name__ == "__main__":
    main()
