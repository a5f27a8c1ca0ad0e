"""What an engine counts per run: token-expert assignments per phase, layer and expert, hits, bytes, time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

PHASES = ("prefill", "decode")


@dataclass
class OffloadStats:
    """Counts since the last `reset()`: token-expert assignments per phase/layer/expert, hits, calls, bytes, time."""

    num_layers: int
    num_experts: int
    assignments: np.ndarray = field(init=False)  # [phase, layer, expert]
    hits: np.ndarray = field(init=False)  # [phase, layer]: assignments served by a resident expert
    cpu_expert_calls: int = 0
    fetches: int = 0
    h2d_bytes: int = 0
    cpu_expert_ms: float = 0.0
    gpu_expert_ms: float = 0.0
    fetch_ms: float = 0.0
    _pending_events: list[tuple[str, Any, Any, Any]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.assignments = np.zeros((len(PHASES), self.num_layers, self.num_experts), dtype=np.int64)
        self.hits = np.zeros((len(PHASES), self.num_layers), dtype=np.int64)
        self.cpu_expert_calls = self.fetches = self.h2d_bytes = 0
        self.cpu_expert_ms = self.gpu_expert_ms = self.fetch_ms = 0.0
        self._pending_events = []

    def add_time(self, kind: str, start: Any, end: Any, observe: Any = None) -> None:
        """CUDA event pairs are resolved later (reading them now would synchronise every layer); `observe(ms)`
        then gets the time too, so on CUDA the live cost model learns the fast tier at the end of each run."""
        self._pending_events.append((kind, start, end, observe))

    def settle(self) -> None:
        for kind, start, end, observe in self._pending_events:
            end.synchronize()
            ms = start.elapsed_time(end)
            setattr(self, kind, getattr(self, kind) + ms)
            if observe is not None:
                observe(ms)
        self._pending_events = []

    def counters(self) -> dict[str, float]:
        """The flat counters a `RunSample` carries (the keys the reporter reads)."""
        self.settle()
        total = self.assignments.sum()
        decode = self.assignments[1].sum()
        out = {
            "hit_rate": float(self.hits.sum() / total) if total else 0.0,
            "decode_hit_rate": float(self.hits[1].sum() / decode) if decode else 0.0,
        }
        for layer in range(self.num_layers):
            n = self.assignments[:, layer].sum()
            out[f"hit_rate.layer{layer}"] = float(self.hits[:, layer].sum() / n) if n else 0.0
        out.update(
            cpu_expert_calls=float(self.cpu_expert_calls),
            fetches=float(self.fetches),
            h2d_bytes=float(self.h2d_bytes),
            cpu_expert_ms=self.cpu_expert_ms,
            gpu_expert_ms=self.gpu_expert_ms,
            fetch_ms=self.fetch_ms,
        )
        return out
