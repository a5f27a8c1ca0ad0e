"""The transformers seam: our experts implementation, and the adapters that read a model's experts.

transformers 5.x routes in the MoE block and then calls `experts(hidden, top_k_index, top_k_weights)`,
dispatched through `ExpertsInterface` by `config._experts_implementation`. We register one function,
`llmperf_offload`, once (the registry is global in transformers); it forwards to the `OffloadedLayer`
(experts.py) stored on each experts module, so all per-model state lives on the model and its engine.
Routing, shared experts (Qwen2-MoE) and every non-expert weight stay untouched on the fast device.

An adapter turns an experts module into per-expert `(gate_up [2I, H], down [H, I])` weights and runs
one expert. `FusedExpertsAdapter` covers every model whose experts class uses the fused v5 layout
(Mixtral, Qwen2/3-MoE, OLMoE, ...); another layout needs only another adapter in `ADAPTERS`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

IMPLEMENTATION = "llmperf_offload"
_register_lock = threading.Lock()


class OffloadError(RuntimeError):
    """The engine cannot run this model or this step (unsupported layout, a failed CPU expert...)."""


class ExpertsForward(Protocol):
    """What an experts module carries to run its experts (experts.py's OffloadedLayer)."""

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor: ...


def _offload_experts_forward(
    self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    layer: ExpertsForward | None = getattr(self, "_llmperf_offload", None)
    if layer is None:
        raise OffloadError(
            f"{type(self).__name__} uses experts_implementation={IMPLEMENTATION!r} but was not "
            "prepared by an OffloadEngine; load the model through OffloadEngine"
        )
    return layer.forward(hidden_states, top_k_index, top_k_weights)


def register_implementation() -> str:
    """Register the experts function with transformers once per process; returns its name."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    with _register_lock:
        if ALL_EXPERTS_FUNCTIONS.get(IMPLEMENTATION) is not _offload_experts_forward:
            ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, _offload_experts_forward)
    return IMPLEMENTATION


class FusedExpertsAdapter:
    """v5 experts with fused, untransposed, bias-free `gate_up_proj [E, 2I, H]` and `down_proj [E, H, I]`."""

    name = "fused"

    @staticmethod
    def matches(module: torch.nn.Module) -> bool:
        gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        return isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and gu.dim() == 3 and dn.dim() == 3

    @staticmethod
    def check(module: torch.nn.Module) -> None:
        unsupported = [
            flag
            for flag, ok in (
                ("has_bias", not getattr(module, "has_bias", False)),
                ("is_transposed", not getattr(module, "is_transposed", False)),
                ("has_gate", getattr(module, "has_gate", True)),
                ("is_concatenated", getattr(module, "is_concatenated", True)),
                ("has_post_expert_norm", not getattr(module, "has_post_expert_norm", False)),
            )
            if not ok
        ]
        if unsupported:
            raise OffloadError(
                f"{type(module).__name__}: expert layout with {', '.join(unsupported)} is not "
                "supported by the fused adapter; add an adapter to pytest_llmperf.offload.seam.ADAPTERS"
            )

    @staticmethod
    def weights(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        return module.gate_up_proj.data, module.down_proj.data

    @staticmethod
    def run(module: torch.nn.Module, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        # Same ops as the eager implementation, so results match it.
        return F.linear(module._apply_gate(F.linear(x, gate_up)), down)

    @staticmethod
    def detach(module: torch.nn.Module, device: torch.device) -> None:
        """Drop the module's own expert weights (the tiers hold them now)."""
        empty = torch.empty(0, dtype=module.gate_up_proj.dtype, device=device)
        module.gate_up_proj = torch.nn.Parameter(empty, requires_grad=False)
        module.down_proj = torch.nn.Parameter(empty.clone(), requires_grad=False)


ADAPTERS: tuple[type[FusedExpertsAdapter], ...] = (FusedExpertsAdapter,)


@dataclass(frozen=True)
class ExpertsSite:
    """One MoE layer's experts module, found in a model."""

    layer: int
    name: str
    module: torch.nn.Module
    adapter: type[FusedExpertsAdapter]
    num_experts: int


def find_experts(model: torch.nn.Module) -> list[ExpertsSite]:
    """Every experts module dispatched through `ExpertsInterface`, in layer order."""
    sites: list[ExpertsSite] = []
    for name, module in model.named_modules():
        if not hasattr(module, "_apply_gate") or not hasattr(module, "num_experts"):
            continue  # not a `@use_experts_implementation` class
        adapter = next((a for a in ADAPTERS if a.matches(module)), None)
        if adapter is None:
            raise OffloadError(f"{name} ({type(module).__name__}) has no adapter; add one to ADAPTERS")
        adapter.check(module)
        sites.append(ExpertsSite(len(sites), name, module, adapter, int(module.num_experts)))
    if not sites:
        raise OffloadError(
            f"{type(model).__name__} has no experts module dispatched through transformers' "
            "ExpertsInterface (a transformers>=5 MoE model such as Mixtral, Qwen2-MoE or OLMoE)"
        )
    return sites
