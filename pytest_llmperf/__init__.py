"""pytest-llmperf: LLM inference benchmarks as pytest regression tests."""

from .measure.backend import Backend, BackendError, GenerationRequest, OutOfMemory
from .measure.records import BatchResult, BenchmarkResult, RunSample
from .measure.scenario import Scenario
from .warning import PytestLLMPerfWarning

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendError",
    "BatchResult",
    "BenchmarkResult",
    "GenerationRequest",
    "OutOfMemory",
    "PytestLLMPerfWarning",
    "RunSample",
    "Scenario",
    "__version__",
]
