"""Shared by tests/test_server_*.py: where the doubles live and an inner-pytest runner."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

DOUBLES = Path(__file__).parent / "doubles"
LAUNCHER = DOUBLES / "bin" / "text-generation-launcher"
TGI_DOUBLE = DOUBLES / "tgi_double.py"
JETSTREAM_DOUBLE = DOUBLES / "jetstream_double.py"
PYTHON = sys.executable
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """scripts/NAME.py as a module (scripts/ is not a package), for the real-server tests' launchers."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("LLMPERF_TGI_DOUBLE"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def run_inner(pytester: pytest.Pytester, *args: str, subprocess: bool = False) -> pytest.RunResult:
    """Run pytest on the pytester project with our fixtures loaded (the lead's plugin imports them
    too once wired; loading them twice is harmless)."""
    common = ("-p", "pytest_llmperf.servers.fixtures", "-p", "no:cacheprovider", "--llmperf-device=cpu",
              "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)
    if subprocess:
        return pytester.runpytest_subprocess(*common, timeout=300)
    return pytester.runpytest(*common)
