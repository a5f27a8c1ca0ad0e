"""Metric definitions (written once, here; docs/metrics.md is made from them) and per-run values.

The run is the unit of replication: every metric is reduced to one value per run, and the gate
compares runs (or worker processes' medians of runs), never tokens. Definitions follow TGI's
benchmark tool where it has one: decode (token) = decode total / steps, and its throughputs are
batch size / step latency (its report: 28.75 ms at batch 1 is 34.78 tokens/secs). Per-request latency
(TTFT, ITL, TPOT, E2EL) follows vLLM's `bench serve`, each request timed from its own send.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from .gpu import ENERGY_MIN_RUN_S
from .records import RunSample

PERCENTILE_METHOD: Final = "linear"  # numpy.percentile's method; named in the JSON report
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    better: str  # "lower" or "higher"
    definition: str


# Latency per request, as vLLM's `bench serve` defines it: each request is timed from its own send, a token
# (a streamed chunk, for a server) counts when it arrives; a run is reduced to the median over its requests
# (ITL: over all the gaps of its requests), and the report and the gate take medians over runs and processes.
# In-process engines send every sequence at the run's start and give them the same times.
METRICS: Mapping[str, Metric] = {
    m.name: m
    for m in (
        Metric("prefill_ms", "ms", "lower", "One forward pass over the whole batch of prompts (in-process backends)."),
        Metric("decode_token_ms", "ms", "lower", "Decode (token): decode total / number of decode steps, per run."),
        Metric(
            "decode_total_ms", "ms", "lower", "Decode (total): all decode steps after prefill; decode length - 1 steps."
        ),
        Metric(
            "ttft_ms",
            "ms",
            "lower",
            "Time to first token: first token's arrival - the request's own send "
            "(tokenization included); median over the run's requests.",
        ),
        Metric(
            "itl_ms",
            "ms",
            "lower",
            "Inter-token latency: gap between successive token arrivals of a request, "
            "the first token excluded; median over all gaps of the run's requests.",
        ),
        Metric(
            "itl_p90_ms",
            "ms",
            "lower",
            "90th percentile of the run's inter-token gaps (gated only when a run holds >= 29 gaps).",
        ),
        Metric(
            "itl_p99_ms",
            "ms",
            "lower",
            "99th percentile of the run's inter-token gaps (gated only when a run holds >= 299 gaps).",
        ),
        Metric(
            "tpot_ms",
            "ms",
            "lower",
            "Time per output token: (last token - first token) / (output tokens - 1) "
            "of a request; median over the run's requests.",
        ),
        Metric(
            "e2e_ms",
            "ms",
            "lower",
            "End-to-end latency (E2EL): last token's arrival - the request's own send; median over the run's requests.",
        ),
        Metric("tokenize_ms", "ms", "lower", "Tokenizing the batch's prompts."),
        Metric("detokenize_ms", "ms", "lower", "Decoding the generated ids back to text."),
        Metric(
            "prefill_tokens_per_s",
            "tokens/secs",
            "higher",
            "TGI's prefill throughput: batch size / prefill latency in seconds.",
        ),
        Metric(
            "decode_tokens_per_s",
            "tokens/secs",
            "higher",
            "TGI's decode throughput: batch size / decode (token) latency in seconds.",
        ),
        Metric(
            "throughput_tokens_per_s",
            "tokens/secs",
            "higher",
            "Generated tokens of the whole batch / the run's "
            "wall time, its first send to its last request's "
            "end (bigcode-inference-benchmark's tokens/s).",
        ),
        Metric("ms_per_token", "ms", "lower", "1000 / throughput_tokens_per_s (bigcode's msec/token)."),
        # Servers give no prefill/decode split; these give TGI's batch-level rows from token arrivals instead.
        Metric(
            "first_to_last_token_ms",
            "ms",
            "lower",
            "Decode (total) of a server: last token - first token of each request, mean over the batch's requests.",
        ),
        Metric(
            "ttft_tokens_per_s",
            "tokens/secs",
            "higher",
            "Prefill throughput of a server: batch size / TTFT in seconds (first tokens per second).",
        ),
        Metric(
            "itl_tokens_per_s",
            "tokens/secs",
            "higher",
            "Decode throughput of a server: batch size / inter-token latency in seconds.",
        ),
        # Peak memory during the run (measure/memory.py), held to a tolerance rather than a rank test.
        Metric("peak_rss_mib", "MiB", "lower", "Peak resident set of the measuring process during the run (Linux)."),
        Metric(
            "server_peak_rss_mib",
            "MiB",
            "lower",
            "Peak resident set of a started server's process tree during the run, summed over its processes (Linux).",
        ),
        Metric("cuda_peak_allocated_mib", "MiB", "lower", "torch.cuda.max_memory_allocated over the run."),
        Metric("gpu_used_mib", "MiB", "lower", "NVML's used memory of the GPUs after the run (every process on them)."),
        # NVML around the run (measure/gpu.py); absent on a CPU target.
        Metric(
            "energy_j_per_token",
            "J/token",
            "lower",
            "GPU energy over the run (NVML's total energy counter, all "
            "GPUs) / generated tokens of the batch; runs of 1 s or more.",
        ),
        Metric("sm_clock_mhz", "MHz", "higher", "Lowest SM clock of the GPUs at the end of the run (NVML)."),
        # Counted under callgrind in a counting process (measure/instructions.py, --llmperf-instructions): the host's
        # work, the same in every process; held to a tolerance (judge/rows.py).
        Metric(
            "prefill_instructions",
            "instructions",
            "lower",
            "Instructions executed by the pytest process during prefill, counted under callgrind.",
        ),
        Metric(
            "decode_step_instructions",
            "instructions",
            "lower",
            "Instructions per decode step: decode total / decode steps, counted under callgrind.",
        ),
        Metric(
            "e2e_instructions_per_token",
            "instructions",
            "lower",
            "Instructions of the whole run (tokenization to "
            "the last token) / generated tokens of the batch, "
            "counted under callgrind.",
        ),
    )
}

#: Memory metrics: gated by a tolerance (judge/verdicts.py), always, where both sides measured them.
MEMORY_METRICS = ("peak_rss_mib", "server_peak_rss_mib", "cuda_peak_allocated_mib", "gpu_used_mib")

#: Gated by default, by whether the backend splits prefill from decode.
DEFAULT_GATED_SPLIT = ("prefill_ms", "decode_token_ms", "throughput_tokens_per_s")
DEFAULT_GATED_SERVER = ("ttft_ms", "itl_ms", "throughput_tokens_per_s")

#: Gaps a run must hold before its own tail percentile is a measurement rather than its maximum
#: (one-sided 95% order-statistic bound: n >= 29 for p90, 299 for p99).
TAIL_MIN_GAPS = {"itl_p90_ms": 29, "itl_p99_ms": 299}


def gated_metrics(metrics: Sequence[str] | None, splits_prefill: bool) -> tuple[str, ...]:
    """The metrics a benchmark gates: those its scenario names, else the default set for its backend."""
    if metrics is not None:
        return tuple(metrics)
    return DEFAULT_GATED_SPLIT if splits_prefill else DEFAULT_GATED_SERVER


def metric_better(name: str, counters_better: Mapping[str, str] | None = None) -> str:
    if name in METRICS:
        return METRICS[name].better
    if counters_better and name in counters_better:
        return counters_better[name]
    return "lower"


@dataclass(frozen=True)
class Request:
    """One sequence of a run: when it was sent, when its tokens arrived (ns from the run's start), and how
    many tokens it generated (the server's count where it gives one, else its arrivals)."""

    sent: int
    times: Sequence[int]
    tokens: int


def requests_of(sample: RunSample) -> list[Request]:
    sent = sample.sent_ns or [0] * len(sample.token_times_ns)
    if sample.sequence_tokens is not None:
        counts = list(sample.sequence_tokens)
    elif sample.generated_tokens is not None and sample.token_times_ns:  # fixed length: every sequence alike
        counts = [sample.generated_tokens // len(sample.token_times_ns)] * len(sample.token_times_ns)
    else:
        counts = [len(t) for t in sample.token_times_ns]
    return [Request(s, t, n) for s, t, n in zip(sent, sample.token_times_ns, counts)]


def generated_tokens(sample: RunSample) -> int:
    """The run's generated tokens: the backend's count (a server's usage), else the arrivals."""
    if sample.generated_tokens is not None:
        return sample.generated_tokens
    return sum(len(t) for t in sample.token_times_ns)


def _median(values: Sequence[float]) -> float:
    return float(np.median(values))


def run_values(sample: RunSample) -> dict[str, float]:
    """Reduce one run to one value per metric (only the metrics the backend could measure)."""
    ms = 1e-6
    values: dict[str, float] = {}
    if sample.prefill_ns is not None:
        values["prefill_ms"] = sample.prefill_ns * ms
        values["prefill_tokens_per_s"] = sample.batch_size / (sample.prefill_ns * 1e-9)
    if sample.decode_steps_ns:
        total = sum(sample.decode_steps_ns)
        values["decode_total_ms"] = total * ms
        values["decode_token_ms"] = total * ms / len(sample.decode_steps_ns)
        values["decode_tokens_per_s"] = sample.batch_size / (total * 1e-9 / len(sample.decode_steps_ns))
    requests = [r for r in requests_of(sample) if r.times]
    if requests:  # per request, from its own send (vLLM's bench serve)
        values["ttft_ms"] = _median([r.times[0] - r.sent for r in requests]) * ms
        values["e2e_ms"] = _median([r.times[-1] - r.sent for r in requests]) * ms
        tpots = [(r.times[-1] - r.times[0]) / (r.tokens - 1) for r in requests if r.tokens > 1]
        if tpots:
            values["tpot_ms"] = _median(tpots) * ms
    else:
        values["e2e_ms"] = sample.end_to_end_ns * ms
    gaps = [b - a for r in requests for a, b in zip(r.times, r.times[1:])]
    if gaps:
        values["itl_ms"] = _median(gaps) * ms
        values["itl_p90_ms"] = float(np.percentile(gaps, 90, method=PERCENTILE_METHOD)) * ms
        values["itl_p99_ms"] = float(np.percentile(gaps, 99, method=PERCENTILE_METHOD)) * ms
    tokens = generated_tokens(sample)
    if sample.end_to_end_ns > 0 and tokens:
        values["throughput_tokens_per_s"] = tokens / (sample.end_to_end_ns * 1e-9)
        values["ms_per_token"] = 1000.0 / values["throughput_tokens_per_s"]
    if sample.prefill_ns is None:
        values.update(_server_values(sample, values))
    if sample.tokenize_ns is not None:
        values["tokenize_ms"] = sample.tokenize_ns * ms
    if sample.detokenize_ns is not None:
        values["detokenize_ms"] = sample.detokenize_ns * ms
    values.update({k: float(v) for k, v in sample.counters.items()})
    values.update({k: float(v) for k, v in sample.memory.items()})
    if "energy_j" in sample.gpu and tokens and sample.end_to_end_ns >= ENERGY_MIN_RUN_S * 1e9:
        # shorter runs see too few of the counter's steps for a figure of their own (gpu.py; the report sums them)
        values["energy_j_per_token"] = sample.gpu["energy_j"] / tokens
    if "sm_clock_mhz" in sample.gpu:
        values["sm_clock_mhz"] = sample.gpu["sm_clock_mhz"]
    return values


def _server_values(sample: RunSample, values: Mapping[str, float]) -> dict[str, float]:
    """TGI's batch-level rows for a backend without a prefill/decode split: TGI's Decode (total) and
    its throughputs, batch size over TTFT and over ITL."""
    out: dict[str, float] = {}
    spans = [times[-1] - times[0] for times in sample.token_times_ns if times]
    if spans:
        out["first_to_last_token_ms"] = float(np.mean(spans)) * 1e-6
    if values.get("ttft_ms"):
        out["ttft_tokens_per_s"] = sample.batch_size / (values["ttft_ms"] / 1000)
    if values.get("itl_ms"):
        out["itl_tokens_per_s"] = sample.batch_size / (values["itl_ms"] / 1000)
    return out


def gaps_per_run(sample: RunSample) -> int:
    return sum(max(len(t) - 1, 0) for t in sample.token_times_ns)


def values_by_metric(samples: Sequence[RunSample]) -> dict[str, list[float]]:
    """Per-run values of every metric that all runs measured, in run order."""
    per_run = [run_values(s) for s in samples]
    if not per_run:
        return {}
    names = set(per_run[0]).intersection(*per_run[1:])
    return {name: [v[name] for v in per_run] for name in sorted(names)}


def min_runs_for_percentile(q: float) -> int:
    """Runs needed before the q-th percentile is not just the extreme value: n >= 1 / (1 - q/100)."""
    return math.ceil(1 / (1 - q / 100) - 1e-9)


@dataclass(frozen=True)
class Summary:
    n: int
    average: float
    lowest: float
    highest: float
    percentiles: Mapping[int, float | None]  # None: too few runs for that percentile

    def to_json(self) -> dict[str, object]:
        return {
            "n": self.n,
            "average": self.average,
            "lowest": self.lowest,
            "highest": self.highest,
            **{f"p{q}": v for q, v in self.percentiles.items()},
        }


def summarize(values: Sequence[float]) -> Summary:
    arr = np.asarray(values, dtype=float)
    return Summary(
        n=len(arr),
        average=float(arr.mean()),
        lowest=float(arr.min()),
        highest=float(arr.max()),
        percentiles={
            q: (
                float(np.percentile(arr, q, method=PERCENTILE_METHOD))
                if len(arr) >= min_runs_for_percentile(q)
                else None
            )
            for q in PERCENTILES
        },
    )


def values_by_process(samples: Sequence[RunSample]) -> dict[str, list[list[float]]]:
    """Per-run values of every metric, one list per worker process (in process order)."""
    processes = sorted({s.process for s in samples})
    per_process = [values_by_metric([s for s in samples if s.process == p]) for p in processes]
    if not per_process:
        return {}
    names = set(per_process[0]).intersection(*per_process[1:])
    return {name: [values[name] for values in per_process] for name in sorted(names)}


def unit_values(samples: Sequence[RunSample]) -> tuple[str, dict[str, list[float]]]:
    """What the gate tests: ("process", the median of each worker process's runs) when the runs come from
    several processes, since runs of one process share its speed and are not independent of each other;
    ("run", the per-run values) when all were measured in one process."""
    if len({s.process for s in samples}) <= 1:
        return "run", values_by_metric(samples)
    return "process", {
        m: [float(np.median(v)) for v in per_process] for m, per_process in values_by_process(samples).items()
    }
