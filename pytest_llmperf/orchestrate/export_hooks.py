"""Hooks that hand our results to other tools' formats (the logic is in report/exports.py, imported when a
benchmark's results are there to hand over)."""

from __future__ import annotations

from typing import Any

import pytest
from _pytest.junitxml import xml_key  # the LogXML of --junitxml, as record_testsuite_property finds it

from .session import SESSION_KEY


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """This test's outcome, medians, ratios and verdicts (exports.junit_properties): with --junitxml in
    pytest's default family, xunit2, whose schema has no <testcase> properties, they are testsuite properties;
    otherwise the test's own user_properties (xunit1's <testcase> properties, pytest-reportlog). A test
    measured in worker processes gets the time of its timed runs as its duration."""
    llm = item.config.stash.get(SESSION_KEY, None)
    outcomes = [o for o in llm.outcomes if o.result.nodeid == item.nodeid] if llm is not None else []
    if call.when == "call" and outcomes:
        from ..report import exports

        properties = exports.junit_properties(outcomes)
        xml = item.config.stash.get(xml_key, None)
        if xml is not None and xml.family == "xunit2":
            for name, value in properties:
                xml.add_global_property(name, value)
        else:
            item.user_properties.extend(properties)
    report = yield
    if call.when == "call" and outcomes:
        from ..report import exports

        report.duration = max(report.duration, exports.measured_seconds(outcomes))
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Any:
    """Before pytest-benchmark finishes (its own wrapper writes --benchmark-json, saves and compares): our
    results join its benchmarks, with its own statistics."""
    llm = session.config.stash.get(SESSION_KEY, None)
    if (
        llm is not None
        and llm.outcomes
        and not hasattr(session.config, "workerinput")
        and getattr(llm, "recorder", None) is None
    ):
        from ..report import exports

        exports.add_to_pytest_benchmark(session.config, llm.device, [o.result for o in llm.outcomes])
    return (yield)
