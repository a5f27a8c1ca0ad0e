"""Each side of an A/B comparison in its own environment: detect how the sides' dependencies differ, build each
side's environment with uv into a cache, or say why not.

    from pytest_llmperf.environments import detect, prepare
    detection = detect(base_root, head_root, extra)   # cheap; nothing is built, no process started
    environments = prepare(detection, mode="auto")    # an Environments record; CannotBuild with the ways out

The names below load on first use (PEP 562), so importing the package costs nothing at plugin load: the parsers
(packaging, tomllib) and uv are reached only when the dependencies differ. docs/environments.md says what is built,
what is measured, and the ways out.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module that defines it.
_EXPORTS = {
    "detect": "detection",
    "Detection": "detection",
    "prepare": "plan",
    "Environments": "records",
    "SideEnvironment": "records",
    "PackageChange": "records",
    "BuildSettings": "records",
    "COMPARE_DEPS_MODES": "records",
    "EnvironmentsError": "errors",
    "CannotBuild": "errors",
    "BuildFailed": "errors",
    "imported_distributions": "installed",
    "check_imported": "installed",
    "default_env_dir": "cache",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
