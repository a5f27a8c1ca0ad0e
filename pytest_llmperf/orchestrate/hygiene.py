"""Baseline hygiene hooks: entries of tests that no longer exist, and schema-1 entries an update dropped.

A baseline file keeps entries until something removes them, so a renamed or deleted test leaves its
entry behind forever. After a run this names, per baseline file of a module whose tests were all
collected, the keys whose test is gone; `--llmperf-update` over such a module with none of its tests
deselected (`pytest benchmarks/test_x.py --llmperf-update`) removes them. A partial selection
(`file::test`, `-k`, `-m`) never prunes: the other tests were not looked at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..judge.baseline_layout import key_of_test, stale_keys
from ..warning import warn_at
from .session import LLMPerfSession


class BaselineHygiene:
    """Registered by plugin.py in the controlling process, with the session it reads: the store, the mode, the
    outcomes."""

    def __init__(self, config: pytest.Config, perf_session: LLMPerfSession) -> None:
        self.config = config
        self.perf_session = perf_session
        self.collected: dict[str, set[str]] = {}  # module -> keys of every test collected from it
        self.paths: dict[str, Path] = {}  # module -> its file
        self.deselected: set[str] = set()  # modules with a deselected test
        self.benchmarked: set[str] = set()  # modules with a selected llmperf test
        self.stale: dict[str, list[str]] = {}  # module -> stale keys (reported; pruned under --llmperf-update)

    def _active(self) -> bool:
        """The session benchmarked something (the store is read only then)."""
        return bool(self.benchmarked)

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        module = item.nodeid.split("::", 1)[0]
        self.collected.setdefault(module, set()).add(key_of_test(item.nodeid))
        self.paths[module] = Path(item.path)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected.update(item.nodeid.split("::", 1)[0] for item in items)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.benchmarked = {
            item.nodeid.split("::", 1)[0]
            for item in items
            if item.get_closest_marker("llmperf") is not None or "llmperf" in getattr(item, "fixturenames", ())
        }

    def _whole_modules(self) -> set[str]:
        """Modules that the command line collected whole (a file or directory argument, not `file::test`)."""
        base = Path(self.config.invocation_params.dir)
        roots = [(base / arg).resolve() for arg in self.config.args if "::" not in arg]
        return {
            m
            for m, path in self.paths.items()
            if any(path.resolve() == root or root in path.resolve().parents for root in roots)
        }

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self._active():
            return
        from ..judge.baselines import BaselineError

        store = self.perf_session.store
        for module in sorted(self.benchmarked & self._whole_modules()):
            try:
                stored = list(store.entries(module))
            except BaselineError:
                continue  # the tests of the module already report the file
            stale = stale_keys(stored, self.collected.get(module, set()))
            if not stale:
                continue
            if self.perf_session.mode == "update" and module not in self.deselected:
                try:
                    store.prune(module, stale)
                    continue
                except BaselineError as exc:
                    warn_at(f"llmperf: stale entries not pruned: {exc}", store.path_for(module))
            self.stale[module] = stale
        for path, module, keys in store.dropped_entries():
            warn_at(
                f"llmperf: baseline file {path} was rewritten as schema 3; the schema-1 entries of tests not "
                f"re-recorded in this run cannot be converted and were dropped: {', '.join(keys)}. Re-record them "
                f"with: {store.update_command(module)}",
                path,
            )

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self._active():
            return
        store = self.perf_session.store
        lines = [
            f"pruned stale baseline entries from {path} (their tests no longer exist): {', '.join(keys)}"
            for path, keys in sorted(store.pruned.items())
        ]
        lines += [
            f"removed {path}: a temporary file that an interrupted baseline write left (the file it was "
            "writing is whole)"
            for path in store.cleared
        ]
        lines += [
            f"stale baseline entries in {store.path_for(module)} (their tests no longer exist in {module}): "
            f"{', '.join(keys)}. Remove them with: {store.update_command(module)} (the whole module, "
            "no -k)"
            for module, keys in sorted(self.stale.items())
        ]
        if not lines:
            return
        if not self.perf_session.outcomes:
            terminalreporter.write_sep("=", f"llmperf: {self.perf_session.device}")
        for line in lines:
            terminalreporter.write_line(line)
