"""From repeated runs of unchanged code (A/A), the tolerance a target needs.

Input: the JSON reports of N runs of the same suite (`--llmperf-json=run_i.json`, taken with
`--llmperf-rtol=0 --llmperf-max-runs=<runs>` so every comparison is recorded and no second look is
taken) and the baseline directory they were gated against. For each candidate rtol it re-applies the
gate's first look (one-sided Mann-Whitney, BH per test, alpha/2) to the raw per-run values and counts
the runs in which any test would have failed, and the failing test-runs. The shipped two-look gate
fails no more often than this first look, so the rtol found is on the safe side.
Usage: python scripts/aa_rtol.py --baselines baselines/cpu run_*.json
"""

import argparse
import json
from pathlib import Path

from pytest_llmperf import gate
from pytest_llmperf.baselines import BaselineStore
from pytest_llmperf.metrics import DEFAULT_GATED_SPLIT, metric_better


def failures(reports, store, rtol, alpha, max_load):
    failed_runs, failed_tests, tests = 0, 0, 0
    for report in reports:
        any_failed = False
        for bench in report["benchmarks"]:
            baseline = store.get(bench["module"], bench["key"])
            comparisons = []
            for batch in bench["batches"]:
                base = baseline.batches.get(batch["batch_size"]) if baseline else None
                if not base or batch["status"] != "ok":
                    continue
                if (batch.get("foreign_load") or 0) > max_load or baseline.foreign_load.get(batch["batch_size"], 0) > max_load:
                    continue  # the gate refuses a busy side; it is neither a pass nor a failure
                for metric in DEFAULT_GATED_SPLIT:
                    values = [run["values"][metric] for run in batch["runs"]][: len(base[metric])]
                    comparisons.append(gate.compare(metric, batch["batch_size"], base[metric], values,
                                                    better=metric_better(metric), rtol=rtol, with_ci=False))
            tests += 1
            if any(c.verdict == gate.REGRESSED for c in gate.decide(comparisons, alpha)):
                failed_tests += 1
                any_failed = True
        failed_runs += any_failed
    return failed_runs, failed_tests, tests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--baselines", required=True, help="the device's baseline directory, e.g. baselines/cpu")
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--max-load", type=float, default=0.25)
    args = parser.parse_args()
    reports = [json.loads(Path(p).read_text()) for p in args.reports]
    root = Path(args.baselines)
    store = BaselineStore(root.parent, root.name)
    print(f"{len(reports)} runs of unchanged code; first look at alpha/2 = {args.alpha / 2}")
    print("| rtol | runs with a failure | failing test-runs |")
    print("|---|---|---|")
    for rtol in (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.40, 0.50):
        runs, failed, total = failures(reports, store, rtol, args.alpha / 2, args.max_load)
        print(f"| {rtol:.2f} | {runs}/{len(reports)} | {failed}/{total} ({100 * failed / total:.1f}%) |")


if __name__ == "__main__":
    main()
