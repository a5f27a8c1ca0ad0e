"""Run quality: what makes a measurement weaker than its verdict looks, said beside it, and a machine so busy that
its measurement is not compared.

- runs inside a process that scatter (robust coefficient of variation above NOISY_CV, typically over the
  processes): the machine or the backend was unsteady while they measured;
- a GPU that throttled (NVML clock-event reasons: thermal, hardware slowdown, or a power cap that cost
  more than 5% of the SM clock) during some runs: those timings say more about the cooling than the code;
- runs whose backend generated fewer tokens than the scenario asked (a server that stopped early):
  every rate computed from them is off;
- server requests that failed while the others of their run went on (a stream cut short, an error event):
  the run is timed on the requests that completed, and the test fails (session.py), as vLLM's bench
  serve counts them apart from the successful ones.

Too few runs for a percentile and software drift since the baseline are said where those are shown
(the latency tables; the summary's drift line).

A machine kept busy by other processes while a side was measured is refused rather than noted: `busy_note` says
which comparisons that refuses, `admitting` the --llmperf-max-load that would admit them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from ..measure.gpu import slowed_by, throttle_names
from ..measure.metrics import gated_metrics, values_by_process
from ..measure.records import BenchmarkResult
from ..measure.scenario import Scenario

#: Within-process CV above which a metric's runs are called noisy: well above the 1.5-4% that the runs of one process
#: scatter on a shared runner (docs/notes/noise.md, "What the cpu target measured").
NOISY_CV = 0.10


def _noisy(result: BenchmarkResult, metrics: Sequence[str]) -> list[str]:
    found = []
    for batch in result.batches:
        if not batch.ok:
            continue
        for metric, per_process in values_by_process(batch.samples).items():
            if metric not in metrics:
                continue
            # robust CV (normal-scaled MAD / median) of each process's runs, typical over the processes: one
            # disturbed run or process does not make the whole measurement noisy (the gate takes medians too)
            cvs = [
                float(stats.median_abs_deviation(v, scale="normal") / np.median(v))
                for v in per_process
                if len(v) > 2 and np.median(v) > 0
            ]
            if cvs and float(np.median(cvs)) > NOISY_CV:
                found.append(
                    f"{metric} at batch size {batch.batch_size}: runs within a process scatter by a "
                    f"robust CV of {float(np.median(cvs)):.0%} (> {NOISY_CV:.0%}; median over "
                    f"{len(cvs)} process(es)); the machine or backend was unsteady"
                )
    return found


def _throttled(result: BenchmarkResult) -> list[str]:
    found = []
    for batch in result.batches:
        slowed = [(slowed_by(s.gpu), s.gpu) for s in batch.samples]
        hit = [(mask, gpu) for mask, gpu in slowed if mask]
        if hit:
            reasons = sorted({name for mask, _ in hit for name in throttle_names(mask)})
            clocks = [(gpu["sm_clock_mhz"], gpu.get("sm_clock_max_mhz")) for _, gpu in hit if "sm_clock_mhz" in gpu]
            clock = ""
            if clocks:
                low, top = min(clocks)
                clock = f"; SM clock as low as {low:.0f}" + (f" of {top:.0f} MHz" if top else " MHz")
            found.append(
                f"batch size {batch.batch_size}: the GPU throttled during {len(hit)} of {len(slowed)} "
                f"runs ({', '.join(reasons)}{clock})"
            )
    return found


def _short(result: BenchmarkResult) -> list[str]:
    asked = result.scenario.get("decode_length")
    found = []
    for batch in result.batches:
        if not asked or not batch.ok:
            continue
        short = [
            s for s in batch.samples if s.generated_tokens is not None and s.generated_tokens < asked * batch.batch_size
        ]
        if short:
            least = min(s.generated_tokens or 0 for s in short)
            found.append(
                f"batch size {batch.batch_size}: {len(short)} of {len(batch.samples)} runs generated "
                f"fewer tokens than asked (as few as {least} of {asked * batch.batch_size})"
            )
    return found


def request_failures(result: BenchmarkResult) -> list[str]:
    """Per batch size, how many server requests failed over its runs, and the first one's reason."""
    found = []
    for batch in result.batches:
        failures = [f for s in batch.samples for f in s.failed_requests]
        if failures:
            asked = sum(s.batch_size for s in batch.samples)
            found.append(
                f"batch size {batch.batch_size}: {len(failures)} of {asked} requests failed, not timed "
                f"(first: {failures[0]})"
            )
    return found


def quality_notes(result: BenchmarkResult) -> list[str]:
    """What weakens this benchmark's measurement, one line each (empty when nothing does). Noise is judged
    on the metrics the gate tests."""
    metrics = gated_metrics(Scenario.from_json(result.scenario).metrics, result.splits_prefill)
    return [*request_failures(result), *_throttled(result), *_short(result), *_noisy(result, metrics)]


def admitting(load: float) -> float:
    """A --llmperf-max-load that admits `load` cores: 0.25 more, rounded up to 2 significant digits (rounding to
    nearest could land below the load: 10.24 + 0.25 -> 10)."""
    value = load + 0.25
    scale = 10.0 ** (1 - math.floor(math.log10(value)))
    return math.ceil(round(value * scale, 9)) / scale


def busy_note(current_load: float | None, baseline_load: float | None, max_load: float) -> str | None:
    """Why a batch size cannot be judged: either side measured while other processes used the CPU."""
    if current_load is not None and current_load > max_load:
        return (
            f"machine busy: other processes used {current_load:.2f} cores during the runs "
            f"(limit {max_load:g}, --llmperf-max-load); not compared"
        )
    if baseline_load is not None and baseline_load > max_load:
        return (
            f"baseline measured on a busy machine ({baseline_load:.2f} cores used by other processes, "
            f"limit {max_load:g}, --llmperf-max-load); not compared"
        )
    return None
