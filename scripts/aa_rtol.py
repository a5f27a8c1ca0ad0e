"""From repeated jobs of unchanged code (A/A), the tolerance a target needs, on per-process values.

Input: the JSON reports of N jobs of the same suite, taken with `--llmperf-rtol=0 --llmperf-json=job_i.json`,
either against one set of stored baselines (pass `--baselines`) or as A/B comparisons
(`--llmperf-compare HEAD`; the reports carry the reference side's runs). At rtol 0 every metric any
larger rtol could find inconclusive is inconclusive and gets its extra processes, so each report
holds every process the campaign would measure at any rtol. For each candidate rtol this replays the
shipped look-by-look gate: judge the first N processes at alpha / looks, and where a metric is still
inconclusive, all processes of the next look; it counts the jobs in which any test would have failed,
and the failing test-runs.
Usage: python scripts/aa_rtol.py [--baselines baselines/cpu/<machine>] job_*.json
"""

import argparse
import dataclasses
import json
from pathlib import Path

from pytest_llmperf.judge import gate
from pytest_llmperf.judge import verdicts as judge
from pytest_llmperf.judge.baselines import BaselineStore
from pytest_llmperf.judge.sequential import looks_for, reference_entry
from pytest_llmperf.measure.records import BenchmarkResult
from pytest_llmperf.measure.scenario import Scenario

# Counters where more is better (the offload backend's); any other metric: lower is better.
COUNTERS_BETTER = {"hit_rate": "higher", "decode_hit_rate": "higher"}
CANDIDATES = (0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.10, 0.15, 0.20, 0.30)


def result_of(bench: dict) -> BenchmarkResult:
    """A report's benchmark (runs with their values) back as a BenchmarkResult."""
    batches = [{"batch_size": b["batch_size"], "error": b.get("error"), "oom": b.get("status") == "oom",
                "foreign_load": b.get("foreign_load"), "samples": b.get("runs", [])} for b in bench["batches"]]
    return BenchmarkResult.from_json({**bench, "batches": batches})


def up_to(result: BenchmarkResult, processes: int) -> BenchmarkResult:
    """The result as a look after the first `processes` processes saw it."""
    batches = [dataclasses.replace(b, samples=[s for s in b.samples if s.process <= processes])
               for b in result.batches]
    return dataclasses.replace(result, batches=batches)


def replay(result: BenchmarkResult, baseline, scenario: Scenario, max_load: float, first_look: int,
           paired: bool) -> list[judge.Row]:
    """The shipped gate's looks: N processes, then (where inconclusive) all processes of the next look."""
    processes = max((s.process for b in result.batches for s in b.samples), default=1)
    looks = looks_for(min(first_look, processes), processes)
    splits = any(b.ok and b.samples[0].prefill_ns is not None for b in result.batches)
    rows: list[judge.Row] = []
    for look in looks:
        rows = judge.compare(up_to(result, look), baseline, scenario, splits_prefill=splits,
                             alpha=scenario.alpha / len(looks), max_load=max_load, counters_better=COUNTERS_BETTER,
                             paired=paired)
        if not any(r.verdict == gate.INCONCLUSIVE for r in rows):
            break
    return rows


def failures(reports: list[dict], store: BaselineStore | None, rtol: float, first_look: int,
             paired: bool = True) -> tuple[int, int, int]:
    failed_jobs, failed_tests, tests = 0, 0, 0
    for report in reports:
        job_failed = False
        references = {(o["nodeid"], o["key"]): o["reference"] for o in report.get("outcomes", []) if o.get("reference")}
        for bench in report["benchmarks"]:
            result = result_of(bench)
            scenario = dataclasses.replace(Scenario.from_json(bench["scenario"]), rtol=rtol, rtol_per_metric={})
            if store is not None:
                baseline, max_load = store.get(bench["module"], bench["key"]), scenario.max_load
            else:
                ref = references.get((bench["nodeid"], bench["key"]))
                baseline = reference_entry(BenchmarkResult.from_json(ref), "A") if ref else None
                max_load = float("inf")
            if baseline is None:
                continue
            rows = replay(result, baseline, scenario, max_load, first_look, paired and store is None)
            tests += 1
            if any(r.verdict == gate.REGRESSED for r in rows):
                failed_tests += 1
                job_failed = True
        failed_jobs += job_failed
    return failed_jobs, failed_tests, tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--baselines", help="the stored baselines' directory, e.g. baselines/cpu/<machine> (omit for A/B)")
    parser.add_argument("--processes", type=int, default=8, help="processes of the first look (default 8)")
    parser.add_argument("--unpaired", action="store_true", help="A/B: Mann-Whitney on the two sides, not pairs")
    args = parser.parse_args()
    reports = [json.loads(Path(p).read_text()) for p in args.reports]
    store = None
    if args.baselines:
        store = BaselineStore.at(args.baselines)
    mode = "against stored baselines" if store else "A/B"
    test = "Mann-Whitney" if store or args.unpaired else "paired signed-rank"
    print(f"{len(reports)} jobs ({mode}, {test}), replayed through the look-by-look gate")
    print("| rtol | jobs with a failure | failing test-runs |")
    print("|---|---|---|")
    for rtol in CANDIDATES:
        jobs, failed, total = failures(reports, store, rtol, args.processes, not args.unpaired)
        print(f"| {rtol:.3f} | {jobs}/{len(reports)} | {failed}/{total} ({100 * failed / max(total, 1):.1f}%) |")


if __name__ == "__main__":
    main()
