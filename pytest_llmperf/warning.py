"""The category of every warning pytest-llmperf gives, for `-W` and `filterwarnings` (e.g. to make them errors),
and where each is located: at a user's file (the test, a baseline file, a report), never at a line of this
package, so pytest's warnings summary never shows our source (issue 22: `outcome = judge_outcome(...)`)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest


class PytestLLMPerfWarning(pytest.PytestWarning):
    """A warning from pytest-llmperf (e.g. a baseline from another CPU model, not compared)."""


def warn_at(
    text: str, path: str | os.PathLike[str], line: int = 0, category: type[Warning] = PytestLLMPerfWarning
) -> None:
    """Warn located at `path`: with `line` (1-based) pytest shows that line of the user's file, with 0 none."""
    warnings.warn_explicit(category(text), category, str(path), line)


def current_test_file(root: str | os.PathLike[str]) -> Path | None:
    """The file of the test running now (pytest's PYTEST_CURRENT_TEST), for warnings raised while a
    session-scoped fixture starts something for it; None outside a test."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    return Path(root) / current.split("::", 1)[0] if current else None
