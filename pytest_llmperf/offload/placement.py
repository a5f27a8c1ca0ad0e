"""Which experts live on the fast tier: the budget, the popularity profile, the ranking.

Budget = min(user budget, free fast-device memory - reserve), where the reserve is computed from the
largest batch and sequence the engine is sized for: KV cache, activations (logits included) and the
two staging buffers of the fetch path. No magic factor (Fiddler uses 0.95 of total memory and no reserve).

Ranking: a popularity profile (JSON written by `OffloadEngine.calibrate`) orders (layer, expert) pairs
by how many tokens they served; without one, experts are taken round-robin across layers, so every
layer gets the same share of the budget.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

PROFILE_FORMAT = "pytest-llmperf/expert-popularity"
PROFILE_VERSION = 1
GiB = 1024**3


class PlacementError(ValueError):
    """A budget or profile that cannot be used; the message names the option and the fix."""


@dataclass(frozen=True)
class Reserve:
    """Fast-device memory kept free for everything that is not a resident expert."""

    kv_cache_bytes: int
    activation_bytes: int
    staging_bytes: int

    @property
    def total(self) -> int:
        return self.kv_cache_bytes + self.activation_bytes + self.staging_bytes


def compute_reserve(
    config: Any, *, max_batch_size: int, max_seq_len: int, dtype_bytes: int, expert_bytes: int, staging_slots: int = 2
) -> Reserve:
    """KV cache for `max_batch_size x max_seq_len` tokens in every layer, the activations of one prefill
    over them (residual stream, attention scores of a chunk, expert intermediates, fp32 logits of the
    last position), and the staging slots."""
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    tokens = max_batch_size * max_seq_len
    kv = 2 * layers * kv_heads * head_dim * tokens * dtype_bytes
    inter = getattr(config, "intermediate_size", config.hidden_size * 4)
    top_k = getattr(config, "num_experts_per_tok", 1)
    per_token = (6 * config.hidden_size + 3 * top_k * inter) * dtype_bytes
    scores = max_batch_size * heads * max_seq_len * max_seq_len * dtype_bytes  # eager attention, one layer
    logits = max_batch_size * config.vocab_size * 4
    return Reserve(
        kv_cache_bytes=int(kv),
        activation_bytes=int(tokens * per_token + scores + logits),
        staging_bytes=int(staging_slots * expert_bytes),
    )


@dataclass(frozen=True)
class Budget:
    """How many experts fit on the fast tier, and why."""

    n_experts: int
    budget_bytes: int
    expert_bytes: int
    free_bytes: int
    reserve: Reserve
    user_budget_bytes: int | None
    limited_by: str  # "user budget", "free memory" or "all experts"

    def summary(self) -> dict[str, Any]:
        return {
            "n_fast_experts": self.n_experts,
            "budget_gb": round(self.budget_bytes / GiB, 4),
            "expert_mb": round(self.expert_bytes / 2**20, 3),
            "free_gb": round(self.free_bytes / GiB, 3),
            "reserve_gb": round(self.reserve.total / GiB, 4),
            "reserve_kv_gb": round(self.reserve.kv_cache_bytes / GiB, 4),
            "reserve_activations_gb": round(self.reserve.activation_bytes / GiB, 4),
            "reserve_staging_gb": round(self.reserve.staging_bytes / GiB, 4),
            "user_budget_gb": None if self.user_budget_bytes is None else round(self.user_budget_bytes / GiB, 4),
            "limited_by": self.limited_by,
        }


def plan_budget(
    *, total_experts: int, expert_bytes: int, free_bytes: int, reserve: Reserve, user_budget_bytes: int | None
) -> Budget:
    if user_budget_bytes is not None and user_budget_bytes < 0:
        raise PlacementError(f"expert_budget_gb must be >= 0, got {user_budget_bytes / GiB:g}")
    available = max(0, free_bytes - reserve.total)
    budget = available if user_budget_bytes is None else min(available, user_budget_bytes)
    n = min(total_experts, budget // expert_bytes)
    if n == total_experts:
        limited = "all experts"
    elif user_budget_bytes is not None and user_budget_bytes <= available:
        limited = "user budget"
    else:
        limited = "free memory"
    return Budget(
        n_experts=int(n),
        budget_bytes=int(budget),
        expert_bytes=expert_bytes,
        free_bytes=int(free_bytes),
        reserve=reserve,
        user_budget_bytes=user_budget_bytes,
        limited_by=limited,
    )


def round_robin_ranking(num_layers: int, num_experts: int) -> list[tuple[int, int]]:
    """(0,0), (1,0), ..., (L-1,0), (0,1), ...: each layer gets an equal share of any budget."""
    return [(layer, expert) for expert in range(num_experts) for layer in range(num_layers)]


def profile_ranking(counts: np.ndarray) -> list[tuple[int, int]]:
    """Most tokens first; ties keep round-robin order, so a flat profile degrades to round robin."""
    num_layers, num_experts = counts.shape
    rr = round_robin_ranking(num_layers, num_experts)
    position = {le: i for i, le in enumerate(rr)}
    return sorted(rr, key=lambda le: (-counts[le], position[le]))


def place(ranking: Sequence[tuple[int, int]], n_fast: int, num_layers: int, num_experts: int) -> list[list[bool]]:
    """`resident[layer][expert]` for the first `n_fast` entries of `ranking`."""
    resident = [[False] * num_experts for _ in range(num_layers)]
    for layer, expert in ranking[:n_fast]:
        resident[layer][expert] = True
    return resident


def write_profile(path: Path, counts: np.ndarray, *, model: str, tokens: int) -> Path:
    """The popularity JSON: token-expert assignments per (layer, expert) seen during calibration."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "model": model,
        "tokens": int(tokens),
        "num_layers": int(counts.shape[0]),
        "num_experts": int(counts.shape[1]),
        "counts": counts.astype(int).tolist(),
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    return path


def read_profile(path: Path, *, num_layers: int, num_experts: int) -> np.ndarray:
    """Load and check a popularity profile; errors name the file and how to make a good one."""
    path = Path(path)
    fix = "write one with OffloadEngine.calibrate(...) for this model, or drop the popularity option"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlacementError(f"popularity profile {path} does not exist; {fix}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise PlacementError(f"popularity profile {path} is not readable JSON ({exc}); {fix}") from None
    if not isinstance(doc, dict) or doc.get("format") != PROFILE_FORMAT or doc.get("version") != PROFILE_VERSION:
        raise PlacementError(f"{path} is not a {PROFILE_FORMAT} v{PROFILE_VERSION} file; {fix}")
    counts = np.asarray(doc.get("counts"), dtype=float)
    if counts.shape != (num_layers, num_experts) or (counts < 0).any():
        raise PlacementError(
            f"popularity profile {path} has counts of shape {counts.shape}, this model needs "
            f"({num_layers}, {num_experts}) non-negative counts; {fix}"
        )
    return counts


def options_budget(
    config: Any, options: Any, free_bytes: int, expert_bytes: int, total_experts: int, dtype_bytes: int
) -> Budget:
    """The experts' budget on a fast device with `free_bytes` free, for a model of `config` run with `options`
    (OffloadOptions): their budget and reserve where given, else the reserve computed from the largest batch."""
    reserve = compute_reserve(
        config,
        max_batch_size=options.max_batch_size,
        max_seq_len=options.max_seq_len,
        dtype_bytes=dtype_bytes,
        expert_bytes=expert_bytes,
    )
    if options.reserve_gb is not None:
        reserve = replace(reserve, kv_cache_bytes=int(options.reserve_gb * GiB), activation_bytes=0)
    user = None if options.expert_budget_gb is None else int(options.expert_budget_gb * GiB)
    return plan_budget(
        total_experts=total_experts,
        expert_bytes=expert_bytes,
        free_bytes=free_bytes,
        reserve=reserve,
        user_budget_bytes=user,
    )
