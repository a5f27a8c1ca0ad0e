"""What the history store holds, as records that cross modules: a run (one side of one job), a result (a metric at
a batch size of a benchmark in that run) and a mark (a person's word on a change).

A job measures one run, or two in an A/B comparison: the base side (`source` "ab-base", the compared ref, a commit
of the default branch) and the head side ("ab-head", the working tree). A job against stored baselines, or one that
records them, is one run ("stored"). Only runs measured at a commit of the default branch, from a clean tree and not
from the head side, enter a series (history/series.py); the others are kept, and say where they came from.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SOURCES = ("stored", "ab-base", "ab-head")
#: A commit as rows name it: git's sha (SHA-1 or SHA-256, abbreviated from 7), or "unknown" where a job ran outside git
COMMIT = re.compile(r"[0-9a-f]{7,64}|unknown")
MARK_STATES = ("expected", "false_positive")


@dataclass(frozen=True)
class Run:
    run_id: str  # "<job id>:<side>"
    job_id: str
    started_at: str  # UTC ISO 8601
    commit_sha: str
    source: str  # one of SOURCES
    target: str  # the hardware target (--llmperf-device)
    machine: str  # the machine class: baseline set name on the cpu target, GPU product and count on GPU targets
    machine_fp: str  # sha256 of the hardware fingerprint (CPU identity, GPUs, memory)
    env_fp: str  # sha256 of the software fingerprint (python, torch, transformers, CUDA, driver, allocator)
    commit_time: str | None = None
    commit_order: int | None = None  # position on the default branch's first-parent line (1 = its root)
    branch: str | None = None
    on_default_branch: bool = False  # the commit is on the default branch's first-parent line
    dirty: bool = False  # measured from a working tree with uncommitted changes
    env: dict[str, Any] = field(default_factory=dict)
    plugin_version: str = ""
    ci_url: str | None = None
    excluded: bool = False
    exclude_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Run:
        """A run from a rows file, each field checked: a bad one is a ValueError naming it."""
        names = {f.name for f in fields(cls)}
        missing = {"run_id", "job_id", "started_at", "commit_sha", "source", "target", "machine"} - set(data)
        if missing:
            raise ValueError(f"a run without {', '.join(sorted(missing))}")
        for name in ("run_id", "job_id", "started_at", "commit_sha", "source", "target", "machine"):
            if not isinstance(data[name], str) or not data[name]:
                raise ValueError(f"run field {name!r} is {data[name]!r}, not a text")
        if not COMMIT.fullmatch(data["commit_sha"]):
            raise ValueError(f"run field 'commit_sha' is {data['commit_sha']!r}, not a git commit's sha")
        if data["source"] not in SOURCES:
            raise ValueError(f"run field 'source' is {data['source']!r}, not one of {', '.join(SOURCES)}")
        order = data.get("commit_order")
        if order is not None and (isinstance(order, bool) or not isinstance(order, int) or order < 1):
            raise ValueError(f"run field 'commit_order' is {order!r}, not a position from 1")
        for name in ("on_default_branch", "dirty", "excluded"):
            if name in data and not isinstance(data[name], bool):
                raise ValueError(f"run field {name!r} is {data[name]!r}, not true or false")
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)  # slots: made three times faster, and a job's end reads every result of its series
class Result:
    run_id: str
    test: str  # "<module>::<benchmark key>"
    metric: str
    batch_size: int
    series_key: str
    unit: str
    direction: int  # +1: higher is better (tokens/s), -1: lower is better (ms)
    value: float  # the median of the per-process medians (the gate's unit)
    process_medians: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "process_medians": list(self.process_medians)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Result:
        """A result from a rows file, each field checked: a bad one is a ValueError naming it."""
        missing = {f.name for f in fields(cls)} - set(data)
        if missing:
            raise ValueError(f"a result without {', '.join(sorted(missing))}")
        where = f"result {data.get('test')!r} {data.get('metric')!r}"
        batch, direction, value = data["batch_size"], data["direction"], data["value"]
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"{where}: field 'batch_size' is {batch!r}, not a batch size from 1")
        if direction not in (1, -1) or isinstance(direction, bool):
            raise ValueError(f"{where}: field 'direction' is {direction!r}, not 1 (higher is better) or -1")
        medians = data["process_medians"]
        numbers = [value, *medians] if isinstance(medians, list) else None
        if numbers is None or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers):
            raise ValueError(f"{where}: fields 'value' and 'process_medians' must be numbers")
        if math.isnan(value):
            raise ValueError(f"{where}: field 'value' is NaN, not a measurement")
        return cls(
            str(data["run_id"]),
            str(data["test"]),
            str(data["metric"]),
            batch,
            str(data["series_key"]),
            str(data["unit"]),
            direction,
            float(value),
            tuple(float(v) for v in medians),
        )


@dataclass(frozen=True)
class Mark:
    series_key: str
    commit_sha: str  # the change's first commit of the new level
    state: str  # one of MARK_STATES
    note: str = ""
    marked_at: str = ""


@dataclass(frozen=True)
class SeriesId:
    """What a series is: a metric at a batch size of a test, on a target and machine class."""

    test: str
    metric: str
    batch_size: int
    target: str
    machine: str

    @property
    def key(self) -> str:
        text = json.dumps([self.test, self.metric, self.batch_size, self.target, self.machine])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def label(self) -> str:
        return f"{self.test} {self.metric} bs {self.batch_size} ({self.target}, {self.machine})"


def digest(data: Any) -> str:
    """A short stable hash of JSON-able data (the fingerprints)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
