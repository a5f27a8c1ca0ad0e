"""What one greedy generation of the offload engine (engine.py) returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Generation:
    """One greedy generation: the new tokens, per-step times (ns, from the engine's clock) and counters."""

    tokens: torch.Tensor  # [batch, new_tokens]
    step_times_ns: list[int]  # time at which each new token was available, from the start of prefill
    prefill_ns: int
    decode_steps_ns: list[int]
    counters: dict[str, float] = field(default_factory=dict)
