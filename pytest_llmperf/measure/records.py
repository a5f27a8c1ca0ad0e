"""Records that cross modules: what one run measured, and what one benchmark produced.

Data flows one way: a backend returns a `RunSample` per run; the runner collects them into
`BatchResult`s and a `BenchmarkResult`; statistics, verdicts and reports read those.
All times are integer nanoseconds from `time.perf_counter_ns` (or an injected clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass
class RunSample:
    """Everything one run of one batch measured.

    `token_times_ns[s][i]` is when sequence `s` received its `i`-th generated token (a server: its
    i-th streamed chunk), counted from the start of the run (tokenization included). Batch-synchronous
    engines give every sequence the same times; servers give each concurrent request its own, and
    `sent_ns[s]`, when that request was sent, so that each request is timed from its own send.
    """

    batch_size: int
    token_times_ns: list[list[int]]
    end_to_end_ns: int
    tokenize_ns: int | None = None
    prefill_ns: int | None = None  # one forward over the whole batch; None if the backend cannot split
    decode_steps_ns: list[int] = field(default_factory=list)  # one entry per decode step after prefill
    detokenize_ns: int | None = None
    generated_tokens: int | None = None  # as counted by the backend (server `details`/`usage`)
    counters: dict[str, float] = field(default_factory=dict)  # backend metrics, e.g. offload hit rate
    # The generated token ids per sequence and their decoded text, where the backend knows them (judge/outputs.py)
    output_ids: list[list[int]] | None = None
    output_texts: list[str] | None = None
    memory: dict[str, float] = field(default_factory=dict)  # the run's peak memory in MiB (measure/memory.py)
    gpu: dict[str, float] = field(default_factory=dict)  # energy, clock, throttle reasons via NVML (measure/gpu.py)
    process: int = 0  # which worker process took the run (0: measured in the pytest process itself)
    sent_ns: list[int] | None = None  # per sequence, when its request was sent (None: all at the run's start)
    sequence_tokens: list[int] | None = None  # per sequence, the generated tokens the server counted
    failed_requests: list[str] = field(default_factory=list)  # requests of the run that failed (not timed), why
    instructions: dict[str, float] = field(default_factory=dict)  # a run counted under callgrind (instructions.py)

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "token_times_ns": self.token_times_ns,
            "end_to_end_ns": self.end_to_end_ns,
            "tokenize_ns": self.tokenize_ns,
            "prefill_ns": self.prefill_ns,
            "decode_steps_ns": self.decode_steps_ns,
            "detokenize_ns": self.detokenize_ns,
            "generated_tokens": self.generated_tokens,
            "counters": self.counters,
            "output_ids": self.output_ids,
            "output_texts": self.output_texts,
            "memory": self.memory,
            "gpu": self.gpu,
            "process": self.process,
            "sent_ns": self.sent_ns,
            "sequence_tokens": self.sequence_tokens,
            "failed_requests": self.failed_requests,
            **({"instructions": self.instructions} if self.instructions else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSample:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class BatchResult:
    """The measured runs of one batch size, or why it could not run (`error`, `oom`)."""

    batch_size: int
    samples: list[RunSample] = field(default_factory=list)
    warmups: int = 0
    error: str | None = None
    oom: bool = False
    skipped: bool = False  # not attempted because a smaller batch already ran out of memory
    foreign_load: float | None = None  # cores other processes kept busy during the kept runs (mean)
    retaken: int = 0  # runs discarded and taken again because the machine was busy
    # Runs counted under callgrind by counting processes (measure/instructions.py), kept apart from the timed runs;
    # count_error: why this batch size was not counted
    counted: list[RunSample] = field(default_factory=list)
    count_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.samples)

    @property
    def counted_only(self) -> bool:
        """Counted under callgrind and not timed (--llmperf-instructions-only): no timed runs, and no failure."""
        return self.error is None and not self.samples and bool(self.counted)

    @property
    def measured(self) -> bool:
        """Ran without error and holds runs to judge: timed, or counted only."""
        return self.ok or self.counted_only

    @property
    def processes(self) -> list[int]:
        """The worker processes that took this batch's runs, in order."""
        return sorted({s.process for s in self.samples})

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in asdict(self).items() if k not in ("samples", "counted")},
            "samples": [s.to_json() for s in self.samples],
            "counted": [s.to_json() for s in self.counted],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchResult:
        names = {f.name for f in fields(cls)} - {"samples", "counted"}
        return cls(
            samples=[RunSample.from_json(s) for s in data.get("samples", [])],
            counted=[RunSample.from_json(s) for s in data.get("counted") or []],
            **{k: v for k, v in data.items() if k in names},
        )

    @property
    def status(self) -> str:
        if self.oom:
            return "oom"
        if self.error is not None:
            return "error"
        return "ok"


@dataclass
class BenchmarkResult:
    """One measured benchmark: a test (and optional name) on one backend over a batch sweep."""

    key: str  # unique within its test module: the test name, plus `::name` when a test measures twice
    nodeid: str
    module: str  # test module path relative to the rootdir, as in the nodeid
    scenario: dict[str, Any]
    backend: dict[str, Any]
    batches: list[BatchResult]
    group: str | None = None
    counters_better: dict[str, str] = field(default_factory=dict)  # the backend's counters: "lower"/"higher" is better

    @property
    def splits_prefill(self) -> bool:
        """The backend timed prefill apart from decode (an in-process engine), as its runs show."""
        return any(b.ok and b.samples[0].prefill_ns is not None for b in self.batches)

    def batch(self, batch_size: int) -> BatchResult | None:
        return next((b for b in self.batches if b.batch_size == batch_size), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "nodeid": self.nodeid,
            "module": self.module,
            "scenario": self.scenario,
            "backend": self.backend,
            "group": self.group,
            "counters_better": self.counters_better,
            "batches": [b.to_json() for b in self.batches],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchmarkResult:
        return cls(
            key=data["key"],
            nodeid=data["nodeid"],
            module=data["module"],
            scenario=data["scenario"],
            backend=data["backend"],
            group=data.get("group"),
            counters_better=dict(data.get("counters_better") or {}),
            batches=[BatchResult.from_json(b) for b in data["batches"]],
        )

    @classmethod
    def merge(cls, parts: Sequence[BenchmarkResult]) -> BenchmarkResult:
        """One result from the same benchmark measured by several worker processes: each batch's runs keep
        their process index; a batch that failed in any process failed (with the first reason)."""
        first = parts[0]
        batches = []
        for batch_size in sorted({b.batch_size for result in parts for b in result.batches}):
            found = [b for result in parts if (b := result.batch(batch_size)) is not None]
            failed = next((b for b in found if not b.measured), None)
            if failed is not None:
                batches.append(replace(failed, samples=[]))
                continue
            loads = [b.foreign_load for b in found if b.foreign_load is not None]
            batches.append(
                BatchResult(
                    batch_size,
                    samples=[s for b in found for s in b.samples],
                    warmups=found[0].warmups,
                    foreign_load=sum(loads) / len(loads) if loads else None,
                    retaken=sum(b.retaken for b in found),
                    counted=[s for b in found for s in b.counted],
                    count_error=next((b.count_error for b in found if b.count_error), None),
                )
            )
        return replace(first, scenario={**first.scenario, "processes": len(parts)}, batches=batches)
