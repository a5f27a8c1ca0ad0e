"""Hooks that hand our results to other tools' formats (the logic is in report/exports.py, imported when a
benchmark's results are there to hand over)."""

from __future__ import annotations

from typing import Any

import pytest

from .session import SESSION_KEY


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Before the call's report is made: this test's medians, ratios and verdicts as its user_properties
    (--junitxml writes them as <property> elements)."""
    llm = item.config.stash.get(SESSION_KEY, None)
    if call.when == "call" and llm is not None and llm.outcomes:
        from ..report import exports

        item.user_properties.extend(exports.junit_properties(
            o for o in llm.outcomes if o.result.nodeid == item.nodeid))
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Any:
    """Before pytest-benchmark finishes (its own wrapper writes --benchmark-json, saves and compares): our
    results join its benchmarks, with its own statistics."""
    llm = session.config.stash.get(SESSION_KEY, None)
    if llm is not None and llm.outcomes and not hasattr(session.config, "workerinput") \
            and getattr(llm, "recorder", None) is None:
        from ..report import exports

        exports.add_to_pytest_benchmark(session.config, llm.device, [o.result for o in llm.outcomes])
    return (yield)
