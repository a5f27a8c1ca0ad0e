"""Our MoE offload engine (Fiddler-style): experts split between a fast and a slow device.

Public API: `OffloadEngine`, `OffloadOptions`, `OffloadBackend` (the pytest-llmperf backend), the cost
model (`CostModel`, `fixed_costs`, the live `OnlineCosts`) and the scheduler (`Scheduler`). See docs/offload.md.

The names below are imported on first use (PEP 562): the plugin imports this package's `fixture`
module, and that must not import torch, so that pytest runs where the [hf] extra is not installed.
`from pytest_llmperf.offload import OffloadEngine` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the module of this package that defines it.
_HOMES = {
    "CostModel": "costs",
    "LinearFit": "costs",
    "fixed_costs": "costs",
    "measure_costs": "costs",
    "Calibration": "costs",
    "CostWarning": "costs",
    "OnlineCosts": "online",
    "Generation": "engine",
    "OffloadEngine": "engine",
    "OffloadOptions": "engine",
    "OffloadBackend": "backend",
    "PlacementError": "placement",
    "SCHEDULES": "scheduler",
    "LayerPlan": "scheduler",
    "Scheduler": "scheduler",
    "IMPLEMENTATION": "seam",
    "OffloadError": "seam",
    "OffloadStats": "runtime",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from .backend import OffloadBackend
    from .costs import Calibration, CostModel, CostWarning, LinearFit, fixed_costs, measure_costs
    from .engine import Generation, OffloadEngine, OffloadOptions
    from .online import OnlineCosts
    from .placement import PlacementError
    from .runtime import OffloadStats
    from .scheduler import SCHEDULES, LayerPlan, Scheduler
    from .seam import IMPLEMENTATION, OffloadError
