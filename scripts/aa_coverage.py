"""Are A/A jobs calibrated? Each row's confidence interval should cover 1 as often as it claims, job after job.

Input: JSON reports (`--llmperf-json`) of A/A jobs of unchanged code, e.g. from
`python scripts/user_project_ab.py --jobs 4 --condition 0 --out DIR -- --llmperf-rtol=0 --llmperf-processes=10
-o llmperf_max_processes=10`. A bias that every process of a job shares (a memory layout fixed for the whole job, a
side that always runs second) is invisible inside one job, where it looks like a real difference: over several jobs
it shows as rows whose intervals miss 1 more often than 5%, and as a spread of the estimates between jobs wider
than the intervals say. Per metric it prints the rows, the share of intervals that miss 1, the RMS of the log
estimates (between jobs) and the median half-width of the log intervals divided by 1.96 (within a job).

    python scripts/aa_coverage.py DIR/*.json
"""

import argparse
import json
import math
import statistics
from collections import defaultdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+")
    args = parser.parse_args()
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for path in args.reports:
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
        for row in report.get("verdicts", []):
            if row.get("ratio") is None or row.get("ci_low") is None or row.get("ci_high") is None:
                continue
            estimate = math.sqrt(row["ci_low"] * row["ci_high"])  # the interval's centre on the log scale
            rows[f"{row['key']} {row['metric']}"].append((estimate, row["ci_low"], row["ci_high"]))
    print(f"{len(args.reports)} reports")
    print(f"{'rows':<45} {'n':>3} {'miss 1':>7} {'RMS log estimate':>17} {'CI half-width/1.96':>19}")
    for name, found in sorted(rows.items()):
        misses = sum(not (low <= 1 <= high) for _, low, high in found)
        rms = math.sqrt(statistics.fmean(math.log(e) ** 2 for e, _, _ in found))
        width = statistics.median((math.log(high) - math.log(low)) / 2 / 1.96 for _, low, high in found)
        print(f"{name:<45} {len(found):>3} {misses / len(found):>7.0%} {rms:>17.2%} {width:>19.2%}")


if __name__ == "__main__":
    main()
