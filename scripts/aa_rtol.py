"""From repeated runs of unchanged code (A/A), the tolerance a target needs.

Input: the JSON reports of N runs of the same suite, taken with `--llmperf-rtol=0
--llmperf-json=run_i.json` against one set of baselines. At rtol 0 the gate flags every batch that
any larger rtol would flag and takes its confirmation look, so each report holds the runs of both
looks. For each candidate rtol this replays the shipped gate on those runs (judge.compare on the first
`runs` runs, then judge.confirm with the confirmation look's runs where a batch is flagged) and counts
the jobs in which any test would have failed, and the failing test-runs.
Usage: python scripts/aa_rtol.py --baselines baselines/cpu/<machine> run_*.json
"""

import argparse
import dataclasses
import json
from pathlib import Path

from pytest_llmperf.judge import gate
from pytest_llmperf.judge import verdicts as judge
from pytest_llmperf.judge.baselines import BaselineStore
from pytest_llmperf.measure.records import BatchResult, BenchmarkResult, RunSample
from pytest_llmperf.measure.scenario import Scenario

SAMPLE_FIELDS = {f.name for f in dataclasses.fields(RunSample)}
# Counters where more is better (the offload backend's); any other metric: lower is better.
COUNTERS_BETTER = {"hit_rate": "higher", "decode_hit_rate": "higher"}


def scenario_from(data: dict, rtol: float) -> Scenario:
    return Scenario(**{**data, "batch_sizes": tuple(data["batch_sizes"]), "rtol": rtol, "rtol_per_metric": {},
                       "metrics": tuple(data["metrics"]) if data.get("metrics") else None})


def looks(bench: dict, runs: int) -> tuple[BenchmarkResult, BenchmarkResult]:
    """The benchmark as its first look saw it, and the confirmation look's runs (where taken)."""
    first, second = [], []
    for batch in bench["batches"]:
        samples = [RunSample(**{k: v for k, v in run.items() if k in SAMPLE_FIELDS}) for run in batch["runs"]]
        common = {"batch_size": batch["batch_size"], "foreign_load": batch.get("foreign_load")}
        if batch["status"] != "ok":
            first.append(BatchResult(error=batch.get("error") or batch["status"], oom=batch["status"] == "oom",
                                     **common))
            continue
        first.append(BatchResult(samples=samples[:runs], **common))
        if len(samples) > runs:
            second.append(BatchResult(samples=samples[runs:], **common))
    result = BenchmarkResult(bench["key"], bench["nodeid"], bench["module"], bench["scenario"], bench["backend"], first)
    return result, dataclasses.replace(result, batches=second)


def failures(reports: list[dict], store: BaselineStore, rtol: float) -> tuple[int, int, int]:
    failed_jobs, failed_tests, tests = 0, 0, 0
    for report in reports:
        job_failed = False
        for bench in report["benchmarks"]:
            baseline = store.get(bench["module"], bench["key"])
            if baseline is None:
                continue
            scenario = scenario_from(bench["scenario"], rtol)
            first, second = looks(bench, scenario.runs)
            splits = any(b.ok and b.samples[0].prefill_ns is not None for b in first.batches)
            alpha = scenario.alpha / 2  # each look's share, as the gate runs it
            compare = lambda res: judge.compare(res, baseline, scenario, splits_prefill=splits,  # noqa: E731
                                                alpha=alpha, max_load=scenario.max_load,
                                                counters_better=COUNTERS_BETTER)
            rows = compare(first)
            flagged = judge.flagged_batches(rows)
            confirmed = [b for b in flagged if second.batch(b) is not None]
            if confirmed:
                second = dataclasses.replace(second, batches=[second.batch(b) for b in confirmed])
                rows = judge.confirm(rows, compare(second), confirmed)
            tests += 1
            if any(r.verdict == gate.REGRESSED for r in rows):
                failed_tests += 1
                job_failed = True
        failed_jobs += job_failed
    return failed_jobs, failed_tests, tests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--baselines", required=True, help="this machine's baseline set, e.g. baselines/cpu/<machine> or "
                        "baselines/a100")
    args = parser.parse_args()
    reports = [json.loads(Path(p).read_text()) for p in args.reports]
    store = BaselineStore.at(args.baselines)
    print(f"{len(reports)} jobs of unchanged code, replayed through the two-look gate")
    print("| rtol | jobs with a failure | failing test-runs |")
    print("|---|---|---|")
    for rtol in (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.40, 0.50):
        jobs, failed, total = failures(reports, store, rtol)
        print(f"| {rtol:.2f} | {jobs}/{len(reports)} | {failed}/{total} ({100 * failed / total:.1f}%) |")


if __name__ == "__main__":
    main()
