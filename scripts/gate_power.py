"""How often the gate fails a job: unchanged code (false alarms) and injected slowdowns (power).

Runs K real jobs of a shipped benchmark test per condition (the conditions taking turns, so that the machine's
hours fall on each alike) and prints, per mode and condition, the share of jobs that failed, and for a slowdown
whether the failure named the slowed phase. A slowdown is injected as the README's recipe does: a `conftest.py`
in the test's directory (written here, untracked, removed afterwards) that busy-waits a fraction of each forward
pass, in prefill or in decode. So in A/B mode (`--llmperf-compare HEAD`) only the working tree's workers are slowed.
Modes: `ab` (A/B against HEAD) and `stored` (baselines recorded once, unchanged, then gated).
Run it in a clean checkout (the A/B mode compares the working tree with HEAD).

    python scripts/gate_power.py --mode ab --jobs 20 --condition 0 --condition decode:0.10 \
        --condition decode:0.05 --condition prefill:0.10 -- --llmperf-rtol=0.02
"""

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SLOWDOWN_CONFTEST = '''"""Written by scripts/gate_power.py: a {fraction:.0%} slowdown in {phase}. Remove me."""
import functools
import time

import torch
from transformers import BloomForCausalLM, LlamaForCausalLM


def _slowed(forward):
    # wraps: the backend (as transformers' generate) reads forward's signature to pass logits_to_keep=1
    @functools.wraps(forward)
    def slowed_forward(self, *args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        cuda = ids is not None and ids.is_cuda  # on a GPU the forward returns before its kernels finish
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = forward(self, *args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        if ids is not None and (ids.shape[1] > 1) == ({phase!r} == "prefill"):
            until = time.perf_counter() + {fraction!r} * (time.perf_counter() - start)
            while time.perf_counter() < until:
                pass
        return out
    return slowed_forward


for cls in (LlamaForCausalLM, BloomForCausalLM):
    cls.forward = _slowed(cls.forward)
'''
# Host-side changes of fixed size per decode step, for the signals' table (docs/notes/instructions.md, "What each
# signal catches"): `work:N` runs N iterations of a Python loop (the same instructions in every process: what
# instruction counts see), `sleep:S` sleeps S seconds (wall time only).
STEP_CHANGE_CONFTEST = '''"""Written by scripts/gate_power.py: {kind} {amount} per decode step. Remove me."""
import functools
import time

from transformers import BloomForCausalLM, LlamaForCausalLM


def _changed(forward):
    @functools.wraps(forward)  # the backend reads forward's signature to pass logits_to_keep=1
    def changed_forward(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] == 1:
            if {kind!r} == "sleep":
                time.sleep({amount!r})
            else:
                total = 0
                for i in range({amount!r}):
                    total += i * i
        return out
    return changed_forward


for cls in (LlamaForCausalLM, BloomForCausalLM):
    cls.forward = _changed(cls.forward)
'''
PHASE_METRICS = {"prefill": "prefill_ms", "decode": "decode_token_ms", "work": "decode_step_instructions",
                 "sleep": "decode_token_ms"}


@contextlib.contextmanager
def slowdown(test_dir: Path, condition: str):
    path = test_dir / "conftest.py"
    if condition in ("0", "none"):
        yield None
        return
    if path.exists():
        raise SystemExit(f"{path} exists: this script writes its own conftest there; move it away first")
    phase, amount = condition.split(":")
    if phase in ("work", "sleep"):
        size = int(amount) if phase == "work" else float(amount)
        path.write_text(STEP_CHANGE_CONFTEST.format(kind=phase, amount=size))
    else:
        path.write_text(SLOWDOWN_CONFTEST.format(phase=phase, fraction=float(amount)))
    try:
        yield phase
    finally:
        path.unlink(missing_ok=True)


def job(test: str, args: list[str], report: Path) -> tuple[int, dict, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", test, "-p", "no:cacheprovider", "-q",
                           f"--llmperf-json={report}", *args], capture_output=True, text=True)
    seconds = time.monotonic() - started
    data = json.loads(report.read_text()) if report.exists() else {}
    if done.returncode not in (0, 1):
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"pytest exited with {done.returncode}")
    return done.returncode, data, seconds


def regressed_metrics(report: dict) -> set[str]:
    return {row["metric"] for row in report.get("verdicts", []) if row["verdict"] == "regressed"}


def decode_ratios(report: dict) -> str:
    """The decode rows' estimated ratios (now / reference) at batch size 1: wall time and instructions."""
    found = {row["metric"]: row.get("ratio") for row in report.get("verdicts", [])
             if row.get("batch_size") == 1 and row["metric"] in ("decode_token_ms", "decode_step_instructions")}
    return ", ".join(f"{m} x{r:.4f}" for m, r in sorted(found.items()) if isinstance(r, (int, float)))


def processes_used(report: dict) -> int:
    """The most worker processes per side any benchmark of the job took (its last look)."""
    counts = [len({run.get("process") for run in batch.get("runs") or []})
              for bench in report.get("benchmarks", []) for batch in bench.get("batches", [])]
    return max(counts, default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--test", default="benchmarks/test_seed000_prefill_decode.py::test_prefill_decode[llama]")
    parser.add_argument("--mode", choices=("ab", "stored"), default="ab")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--condition", action="append", default=[],
                        help="0 (unchanged); PHASE:FRACTION, e.g. decode:0.10 (a busy-wait of that share of each "
                        "forward pass); work:N (N Python loop iterations per decode step) or sleep:S (S seconds per "
                        "decode step); repeatable")
    parser.add_argument("--out", default=None, help="directory for every job's JSON report (default: a temp dir)")
    parser.add_argument("--device", default="cpu", help="the hardware target (--llmperf-device)")
    parser.add_argument("pytest_args", nargs="*", help="after --: options for every job, e.g. --llmperf-rtol=0.02")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="gate-power-"))
    out.mkdir(parents=True, exist_ok=True)
    test_dir = Path(args.test.split("::")[0]).parent
    common = [f"--llmperf-device={args.device}", f"--llmperf-report-dir={out / 'reports'}", *args.pytest_args]
    if args.mode == "ab":
        common.append("--llmperf-compare=HEAD")
    else:
        common.append(f"--llmperf-baseline-dir={out / 'baselines'}")
        code, _, seconds = job(args.test, [*common, "--llmperf-update"], out / "update.json")
        print(f"baselines recorded in {seconds:.0f} s (exit {code})", flush=True)
    print(f"mode {args.mode}, {args.jobs} jobs per condition, reports in {out}", flush=True)
    conditions = args.condition or ["0"]
    failed, named = dict.fromkeys(conditions, 0), dict.fromkeys(conditions, 0)
    times: dict[str, list[float]] = {c: [] for c in conditions}
    used: dict[str, list[int]] = {c: [] for c in conditions}
    for i in range(args.jobs):  # the conditions take turns, so the machine's hours fall on each alike
        for condition in conditions:
            with slowdown(test_dir, condition) as phase:
                name = condition.replace(":", "_")
                code, report, seconds = job(args.test, common, out / f"{args.mode}_{name}_{i:02d}.json")
            times[condition].append(seconds)
            used[condition].append(processes_used(report))
            metrics = regressed_metrics(report)
            failed[condition] += code == 1
            named[condition] += phase is not None and PHASE_METRICS[phase] in metrics
            print(f"{condition:>14} job {i + 1:>2}: exit {code}, regressed {sorted(metrics) or '-'}, "
                  f"{used[condition][-1]} processes per side, {seconds:.0f} s; {decode_ratios(report)}", flush=True)
    summary = [(c, failed[c], named[c], statistics.median(times[c]), statistics.median(used[c])) for c in conditions]
    print("\n| mode | condition | jobs | failed | named the slowed phase | median processes per side "
          "| median job time |")
    print("|---|---|---|---|---|---|---|")
    for condition, failed, named, median, processes in summary:
        print(f"| {args.mode} | {condition} | {args.jobs} | {failed} ({failed / args.jobs:.0%}) | "
              f"{named if condition not in ('0', 'none') else '-'} | {processes:g} | {median:.0f} s |")


if __name__ == "__main__":
    main()
