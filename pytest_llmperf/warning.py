"""The category of every warning pytest-llmperf gives, for `-W` and `filterwarnings` (e.g. to make them errors)."""

from __future__ import annotations

import pytest


class PytestLLMPerfWarning(pytest.PytestWarning):
    """A warning from pytest-llmperf (e.g. a baseline from another CPU model, not compared)."""
