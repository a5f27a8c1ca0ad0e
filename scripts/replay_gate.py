"""Replay the gate of per-process medians on real jobs: the tolerance and looks a runner afforded before the A/B gate
tested every run (docs/notes/noise.md, "Real jobs on this VM"). The A/B gate as it is (judge/stats.py's `nested`
on every run, planned looks) is simulated by scripts/ab_job_simulator.py and measured by scripts/gate_vs_asv.py.

Input: the JSON reports (`--llmperf-json`) of A/B jobs of unchanged code, each taken with one look of many
processes at rtol 0, so that every row keeps every round:

    pytest benchmarks/test_seed000_prefill_decode.py --llmperf-compare HEAD --llmperf-rtol=0 \\
        --llmperf-processes=16 -o llmperf_max_processes=16 --llmperf-json=aa_1.json

For each candidate (rtol, first look, cap) this replays the shipped procedure (judge/stats.py's paired estimate,
judge/procedure.py's decisions, look by look on the rounds in the order they ran, every gated row of the job in
one family) and prints the share of jobs that would go red (a regressed or inconclusive row), the rows left
inconclusive, and the processes per side each test would have used. `--slowdown decode:0.10` multiplies the
working tree's decode by 1.10 in every process (throughput follows through each process's own prefill/decode
mix): a real job's noise around a known effect, for power.

    python scripts/replay_gate.py aa_*.json --rtol 0.03 0.05 --first 5 --cap 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_llmperf.judge import procedure, stats  # noqa: E402
from pytest_llmperf.judge.verdicts import Verdict  # noqa: E402
from pytest_llmperf.measure.metrics import metric_better  # noqa: E402

GATED = ("prefill_ms", "decode_token_ms", "throughput_tokens_per_s")

#: (test key, metric, batch size) -> (reference medians by process, current medians by process)
Rows = dict[tuple[str, str, int], tuple[dict[int, float], dict[int, float]]]


def _current(batch: dict, slowdown: tuple[str, float] | None) -> dict[str, dict[int, float]]:
    per: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in batch.get("runs") or []:
        values = dict(run["values"])
        if slowdown is not None and slowdown[0] == "decode" and "decode_token_ms" in values:
            extra = slowdown[1] * values.get("decode_total_ms", 0.0)
            values["decode_token_ms"] *= 1 + slowdown[1]
            if "throughput_tokens_per_s" in values and values.get("e2e_ms"):
                values["throughput_tokens_per_s"] *= values["e2e_ms"] / (values["e2e_ms"] + extra)
        if slowdown is not None and slowdown[0] == "prefill" and "prefill_ms" in values:
            extra = slowdown[1] * values["prefill_ms"]
            values["prefill_ms"] *= 1 + slowdown[1]
            if "throughput_tokens_per_s" in values and values.get("e2e_ms"):
                values["throughput_tokens_per_s"] *= values["e2e_ms"] / (values["e2e_ms"] + extra)
        for metric, value in values.items():
            per[metric][int(run["process"])].append(value)
    return {m: {p: float(np.median(v)) for p, v in by.items()} for m, by in per.items()}


def rows_of(report: dict, slowdown: tuple[str, float] | None = None) -> Rows:
    references = {o["key"]: o["reference"] for o in report.get("outcomes", []) if o.get("reference")}
    rows: Rows = {}
    for bench in report["benchmarks"]:
        reference = references.get(bench["key"])
        if reference is None:
            continue
        ref_batches = {b["batch_size"]: b for b in reference["batches"]}
        for batch in bench["batches"]:
            ref = ref_batches.get(batch["batch_size"], {}).get("processes")
            if not ref:
                raise SystemExit("this report keeps no per-process medians of the reference side: it was written "
                                 "before they were kept (re-run the job)")
            current = _current(batch, slowdown)
            for metric in GATED:
                if metric in current and metric in ref:
                    rows[(bench["key"], metric, batch["batch_size"])] = (
                        {int(p): v for p, v in ref[metric].items()}, current[metric])
    return rows


def replay(rows: Rows, rtol: float, first: int, cap: int, alpha: float,
           looks: str = "every_round") -> tuple[dict, dict[str, int]]:
    """Every row's final verdict and each test's processes per side, as the campaign would have taken them
    (`looks`: the Schedule constructor, "every_round" as the plugin's workers, or "doubling")."""
    schedule = getattr(procedure.Schedule, looks)(first, cap, alpha, family=len(rows))
    verdicts: dict = {}
    used: dict[str, int] = {}
    for look in schedule.looks:
        open_rows = [k for k in rows if k not in verdicts]
        if not open_rows:
            break
        for key in {k[0] for k in open_rows}:
            used[key] = look
        for key in open_rows:
            reference, current = rows[key]
            rounds = sorted(set(reference) & set(current))[:look]
            estimate = stats.paired([reference[r] for r in rounds], [current[r] for r in rounds],
                                    better=metric_better(key[1]))
            decided = procedure.decide(estimate, rtol=rtol, schedule=schedule, final=look == schedule.cap,
                                        units=look)
            if decided.verdicts[()] is not None:
                verdicts[key] = decided.verdicts[()]
    return verdicts, used


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--rtol", type=float, nargs="+", default=[0.02, 0.03, 0.05, 0.075, 0.10])
    parser.add_argument("--first", type=int, nargs="+", default=[4, 5, 6, 8])
    parser.add_argument("--cap", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--slowdown", default=None, help="PHASE:FRACTION injected into the working tree's runs")
    parser.add_argument("--looks", choices=("every_round", "doubling"), default="every_round",
                        help="every_round: the plugin's (a look after every round, alpha spent at the doublings); "
                             "doubling: looks at the doublings only, as before 2026-11-27")
    args = parser.parse_args(argv)
    slowdown = None
    if args.slowdown:
        phase, fraction = args.slowdown.split(":")
        slowdown = (phase, float(fraction))
    jobs = [rows_of(json.loads(Path(p).read_text()), slowdown) for p in args.reports]
    print(f"{len(jobs)} job(s), {len(jobs[0])} gated rows each, cap {args.cap}, looks {args.looks}" +
          (f", {args.slowdown} injected" if slowdown else ""))
    print("| rtol | first look | red jobs | regressed rows | inconclusive rows | processes per test (median, max) |")
    print("|---|---|---|---|---|---|")
    for rtol in args.rtol:
        for first in args.first:
            red = regressed = inconclusive = total = 0
            used: list[int] = []
            for rows in jobs:
                verdicts, per_test = replay(rows, rtol, first, args.cap, args.alpha, args.looks)
                found = list(verdicts.values())
                red += any(v in (Verdict.REGRESSED, Verdict.INCONCLUSIVE) for v in found)
                regressed += found.count(Verdict.REGRESSED)
                inconclusive += found.count(Verdict.INCONCLUSIVE)
                total += len(found)
                used += per_test.values()
            print(f"| {rtol:g} | {first} | {red}/{len(jobs)} | {regressed}/{total} | {inconclusive}/{total} | "
                  f"{statistics.median(used):g}, {max(used)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
