"""`OffloadOptions`: everything the offload engine can be told, checked before anything is loaded."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from .scheduler import SCHEDULES
from .seam import OffloadError

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def physical_cores() -> int:
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


@dataclass(frozen=True)
class OffloadOptions:
    """Everything the engine can be told. Each field is documented in docs/offload.md."""

    fast_device: str = "auto"  # "auto": cuda if available, else cpu
    slow_device: str = "cpu"
    dtype: str = "fp32"
    expert_budget_gb: float | None = None  # most GiB of experts on the fast tier (None: as many as fit)
    device_memory_gb: float | None = None  # emulate a fast device of this size (e.g. 24 for an RTX 3090)
    reserve_gb: float | None = None  # fast memory for KV + activations; None: computed. Staging is added on top
    max_batch_size: int = 8  # the reserve is sized for this batch ...
    max_seq_len: int = 1024  # ... and this many tokens per sequence
    popularity: str | None = None  # a profile JSON from calibrate(); None: round robin across layers
    schedule: str = "makespan"  # makespan | fiddler | cpu | fetch
    latency_cpu: float | None = None  # override: slow-tier ms per token (Fiddler's 7)
    latency_gpu: float | None = None  # override: ms per fetched expert (Fiddler's 70)
    online_costs: bool = True  # correct the (non-overridden) costs from the engine's own timings while it runs
    online_window: int = 8  # observations per tier and token-count bucket the live estimate is the median of
    online_probe_every: int = 32  # plans a learning tier may go unobserved before one expert is sent there
    threads: int | None = None  # torch threads during generate; None: physical cores (split with the worker on cpu)
    overlap: bool = True  # run CPU experts on the worker thread while the fast tier works
    pin_memory: bool | None = None  # pin the slow tier; None: when the fast device is CUDA
    cpu_timeout_s: float | None = 300.0  # a worker-thread CPU job slower than this is an error, not a hang

    def validated(self) -> OffloadOptions:
        def bad(name: str, value: Any, want: str) -> OffloadError:
            return OffloadError(f"offload option {name}={value!r}: {want}")

        if self.dtype not in DTYPES:
            raise bad("dtype", self.dtype, f"use one of {', '.join(DTYPES)}")
        if self.schedule not in SCHEDULES:
            raise bad("schedule", self.schedule, f"use one of {', '.join(SCHEDULES)}")
        for name in (
            "expert_budget_gb",
            "device_memory_gb",
            "reserve_gb",
            "latency_cpu",
            "latency_gpu",
            "cpu_timeout_s",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0 or math.isnan(value)):
                raise bad(name, value, "use a number >= 0, or leave it unset")
        if not isinstance(self.online_costs, bool):
            raise bad("online_costs", self.online_costs, "use True or False")
        for name in ("max_batch_size", "max_seq_len", "online_window", "online_probe_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise bad(name, getattr(self, name), "use an integer >= 1")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise bad("threads", self.threads, "use an integer >= 1, or leave it unset for the physical core count")
        fast = self.resolved_fast_device()
        if torch.device(fast).type == "cuda" and not torch.cuda.is_available():
            raise bad("fast_device", self.fast_device, "CUDA is not available here; use fast_device='cpu'")
        if torch.device(self.slow_device).type != "cpu":
            raise bad("slow_device", self.slow_device, "the slow tier is host memory; use 'cpu'")
        return self

    def resolved_fast_device(self) -> str:
        if self.fast_device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.fast_device
