"""What the report layer is given at a session's end, and what it gives back: typed, so that it never reaches into
the orchestrate layer's session (which fills a `SessionSummary` once, at the session's end)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..judge.verdicts import Outcome


@dataclass(frozen=True)
class SessionSummary:
    device: str
    mode: str  # gate | update | update-missing
    outcomes: Sequence[Outcome]
    selected: int = 0  # llmperf tests this session selected
    skipped_here: int = 0  # of those, skipped: they run on other devices
    invalid_here: int = 0  # of those, refused at setup: settings that cannot work
    fail_on: Sequence[str] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)  # every option's value (the JSON report's)
    report_dir: Path = Path("reports")
    json_path: Path | None = None  # --llmperf-json
    export: Sequence[str] = ()  # --llmperf-export's formats
    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    compared_to: str | None = None  # the ref of an A/B job, as checked out
    compared_commit: str | None = None  # its commit
    processes_used: Sequence[int] = ()  # per benchmark test, units per side at its last look
    environment_lines: Sequence[str] = ()  # an A/B job's sides' environments (environments/records.py)
    changed_packages: Sequence[str] = ()  # an A/B job whose sides' environments differ: the packages that do
    rerun: Callable[..., str] = lambda *args, **kwargs: "pytest"  # the re-run command (orchestrate/options.py)

    @property
    def gating(self) -> bool:
        return self.mode == "gate"


@dataclass
class Written:
    """What the reports of a session came to: the files written, and the lines that say what failed."""

    paths: list[Path | str] = field(default_factory=list)  # a str: a report skipped, and why (no matplotlib)
    errors: list[str] = field(default_factory=list)  # a report that could not be written: the session fails
    warnings: list[str] = field(default_factory=list)
