"""How many runs a worker process needs: the spread of per-process medians taken from its first k runs.

The gate tests per-process medians (docs/gate.md). If the medians of 3 runs spread between processes as much as
those of all the runs, the process, not the runs within it, sets the noise, and more runs per process only cost
time. Reads JSON reports (`--llmperf-json`) of jobs with many worker processes and at least 5 runs each, e.g. the
A/A jobs of docs/notes/noise.md ("Real jobs on this VM"):

    python scripts/runs_per_process.py /work/data/aa/quiet_*.json
"""

import argparse
import json
import math
import statistics
from collections import defaultdict

METRICS = ("prefill_ms", "decode_token_ms", "throughput_tokens_per_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 3, 5], help="first k runs of each process")
    args = parser.parse_args()
    most = max(args.runs)
    spreads: dict[str, list[list[float]]] = defaultdict(list)
    for path in args.reports:
        with open(path) as handle:
            report = json.load(handle)
        for bench in report["benchmarks"]:
            for batch in bench["batches"]:
                by_process = defaultdict(list)
                for run in batch["runs"]:
                    by_process[run["process"]].append(run["values"])
                processes = [runs for runs in by_process.values() if len(runs) >= most]
                if len(processes) < 8:
                    continue
                for metric in METRICS:
                    spreads[metric].append([statistics.stdev(
                        [math.log(statistics.median(r[metric] for r in runs[:k])) for runs in processes])
                        for k in args.runs])
    print("| metric | rows | " + " | ".join(f"SD of log medians, {k} run(s)" for k in args.runs)
          + f" | ratio {args.runs[-2]}/{args.runs[-1]} runs |")
    print("|---|---|" + "---|" * (len(args.runs) + 1))
    for metric, rows in spreads.items():
        medians = [statistics.median(row[i] for row in rows) for i in range(len(args.runs))]
        ratio = statistics.median(row[-2] / row[-1] for row in rows)
        print(f"| {metric} | {len(rows)} | " + " | ".join(f"{m:.4f}" for m in medians) + f" | {ratio:.3f} |")


if __name__ == "__main__":
    main()
