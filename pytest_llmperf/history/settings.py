"""The history's option values, parsed (the options themselves are rows of orchestrate/options.py's table)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_STORE = ".llmperf/history.sqlite"
# The analysis a job leaves in its report directory for the reports (history/job.py writes it, report/ reads it).
ANALYSIS_FILE = "history.json"
ANALYSIS_FORMAT = "pytest-llmperf history analysis"
CHECKS = ("off", "report", "fail")


def store_location(text: str) -> str:
    """A store's location as given; its form is checked here, the path resolved against the rootdir at the end."""
    from .databases import parse_location  # sqlite3 loads when a session ends, not with the plugin

    value = str(text).strip()
    parse_location(value, Path("."))
    return value


def check_mode(text: str) -> str:
    value = str(text).strip().lower()
    if value not in CHECKS:
        raise ValueError(f"expected one of {', '.join(CHECKS)}, got {text!r}")
    return value
