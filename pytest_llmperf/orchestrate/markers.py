"""A test's `llmperf` keywords, merged from every `llmperf` marker that applies to it.

A module's `pytestmark`, a class's marker, the function's own and a parametrize case's `marks=` may each give
keywords; the nearest one wins per keyword (parameter case > function > class > module), so a module can set
what its tests share and a test what is its own. Two markers at the same level that give one keyword two values
(stacked decorators) are an error naming both: which one was meant cannot be told.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..measure.keywords import check_marker_kwargs
from ..measure.scenario import ScenarioError

NAME = "llmperf"


def _levels(item: pytest.Item) -> list[tuple[str, list[pytest.Mark]]]:
    """The item's llmperf markers grouped by where they are set, nearest first."""
    callspec = getattr(item, "callspec", None)
    case = [m for m in getattr(callspec, "marks", ()) if m.name == NAME]
    levels: list[tuple[str, list[pytest.Mark]]] = [(f"the parameter case {item.name}", case)] if case else []
    by_node: dict[int, tuple[str, list[pytest.Mark]]] = {}
    for node, mark in item.iter_markers_with_node(NAME):
        if any(mark is m for m in case):
            continue
        where = "the test" if node is item else f"{type(node).__name__.lower()} {node.name}"
        by_node.setdefault(id(node), (where, []))[1].append(mark)
    return levels + list(by_node.values())


def marker_kwargs(item: pytest.Item) -> dict[str, Any]:
    """The test's checked llmperf keywords ({} without a marker); ScenarioError naming a bad or ambiguous one."""
    merged: dict[str, Any] = {}
    for where, marks in reversed(_levels(item)):  # farthest first: nearer levels overwrite
        level: dict[str, Any] = {}
        for mark in marks:
            kwargs = check_marker_kwargs(mark.args, mark.kwargs)
            for name, value in kwargs.items():
                if name in level and level[name] != value:
                    raise ScenarioError(
                        f"two @pytest.mark.llmperf markers on {where} give {name} two values ({level[name]!r} and "
                        f"{value!r}); keep one of them (markers of a class or module are overridden by the test's own)"
                    )
                level[name] = value
        merged.update(level)
    return merged
