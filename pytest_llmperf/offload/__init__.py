"""Our MoE offload engine (Fiddler-style): experts split between a fast and a slow device.

Public API: `OffloadEngine`, `OffloadOptions`, `OffloadBackend` (the pytest-llmperf backend), the cost
model (`CostModel`, `fixed_costs`) and the scheduler (`Scheduler`). See docs/offload.md.
"""

from .costs import CostModel, LinearFit, fixed_costs, measure_costs
from .engine import Generation, OffloadEngine
from .options import OffloadOptions
from .placement import PlacementError
from .scheduler import SCHEDULES, LayerPlan, Scheduler
from .seam import IMPLEMENTATION, OffloadError
from .stats import OffloadStats

__all__ = [
    "IMPLEMENTATION", "SCHEDULES", "CostModel", "Generation", "LayerPlan", "LinearFit", "OffloadEngine",
    "OffloadError", "OffloadOptions", "OffloadStats", "PlacementError", "Scheduler", "fixed_costs", "measure_costs",
]
