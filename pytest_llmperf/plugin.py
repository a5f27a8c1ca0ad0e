"""pytest-llmperf's hooks. Thin: the work happens in the session, runner, judge and report modules."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .report import markdown as report
from .report import terminal
from .measure.allocator import steady_malloc
from .judge.baselines import now_iso
from .fixtures import SESSION_KEY, llmperf, llmperf_hf  # noqa: F401  (fixtures)
from .offload.fixture import llmperf_offload  # noqa: F401
from .servers.fixtures import (llmperf_jetstream, llmperf_openai, llmperf_servers, llmperf_tgi,  # noqa: F401
                               llmperf_vllm)
from .options import Settings, add_options
from .judged import failing, failing_line, judged_line
from .measure.scenario import MARKER_HELP, ScenarioError, build_scenario, check_marker_kwargs
from .session import LLMPerfSession, marker_devices

INVALID_MARKER_KEY = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    config.stash[SESSION_KEY] = LLMPerfSession(Settings.from_config(config))


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash.__delitem__(SESSION_KEY) if SESSION_KEY in config.stash else None


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash[SESSION_KEY]
    s = session.settings
    return [
        f"llmperf: device={session.device} ({'given' if session.device_given else 'detected'}), mode={session.mode}, "
        f"runs={s['runs']}, warmups={s['warmups']}, max_runs={s['max_runs']}, alpha={s['alpha']}, rtol={s['rtol']}, "
        f"malloc={s['malloc']}, threads={session.threads_text()}, fail_on={','.join(s['fail_on']) or 'none'}",
        f"llmperf: baselines={session.store.device_dir}, reports={s['report_dir']}",
    ]


def _is_llmperf(item: pytest.Item) -> bool:
    return item.get_closest_marker("llmperf") is not None or "llmperf" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = config.stash[SESSION_KEY]
    selected = [item for item in items if _is_llmperf(item)]
    session.selected = len(selected)
    on_xdist_worker = hasattr(config, "workerinput")
    if selected and not on_xdist_worker:  # before any fixture loads a model
        session.malloc = steady_malloc() if session.settings["malloc"] == "steady" else "system (--llmperf-malloc)"
    for item in selected:
        if on_xdist_worker:  # refuse: timed tests must not run side by side with other tests
            item.stash[INVALID_MARKER_KEY] = (
                "timed benchmark tests must not run under pytest-xdist (side by side they measure each other). "
                "Run them without -n (pytest -p no:xdist, or -n 0), or deselect them with -m 'not llmperf'")
            continue
        marker = item.get_closest_marker("llmperf")
        if marker is not None:
            try:  # also the marker's runs against alpha, with the session's options underneath
                kwargs = check_marker_kwargs(marker.args, marker.kwargs)
                build_scenario({k: v for k, v in session.settings.for_test(kwargs).items() if k != "devices"})
            except ScenarioError as exc:
                item.stash[INVALID_MARKER_KEY] = str(exc)
                continue
        devices = marker_devices(item)
        if devices is not None and session.device not in devices:
            item.add_marker(pytest.mark.skip(
                reason=f"llmperf: runs on {', '.join(devices)}; the current device is {session.device}"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if INVALID_MARKER_KEY in item.stash:
        pytest.fail(f"{item.nodeid}: {item.stash[INVALID_MARKER_KEY]}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or not session.outcomes:
        return
    terminalreporter.write_sep("=", f"llmperf: {session.device}")
    line, colour = judged_line(session.outcomes)  # first: a run that judged nothing must say so
    terminalreporter.write_line(line, **{colour: True, "bold": colour != "green"})
    failed = failing(session.outcomes, session.settings["fail_on"])
    if failed:
        terminalreporter.write_line(failing_line(failed, session.settings["fail_on"]), red=True, bold=True)
    for line in terminal.summary_lines(session):
        terminalreporter.write_line(line)
    for path in getattr(session, "written", []):
        terminalreporter.write_line(f"report: {path}")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    llm = session.config.stash.get(SESSION_KEY, None)
    # An outcome listed in --llmperf-fail-on fails its test; should a test have swallowed that failure, the
    # session still exits non-zero (the pytest-cov way: set the status here, never raise from the summary).
    if llm is not None and session.exitstatus == pytest.ExitCode.OK and failing(llm.outcomes, llm.settings["fail_on"]):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if llm is None or not llm.outcomes or hasattr(session.config, "workerinput"):
        return
    created = now_iso()
    results = [o.result for o in llm.outcomes]
    rows = [r for o in llm.outcomes for r in o.rows]
    counts_line = terminal.counts_line(llm.counts())
    report_dir = Path(llm.settings["report_dir"])
    md = report.markdown(llm.device, created, llm.fingerprint, results, rows, counts_line)
    doc = report.json_document(llm.device, created, llm.fingerprint, llm.settings.values, results, llm.outcomes,
                               llm.counts())
    written = [report_dir / f"{llm.device}.md", report_dir / f"{llm.device}.json"]
    try:
        report.write_atomic(written[0], md)
        report.write_json(written[1], doc)
        if llm.settings["json"]:
            written.append(Path(llm.settings["json"]))
            report.write_json(written[-1], doc)
    except OSError as exc:
        raise pytest.UsageError(f"llmperf: cannot write the report under {report_dir}: {exc}. "
                                "Make it writable or set --llmperf-report-dir") from None
    llm.written = written
    _write_benchmark_json_alone(session.config)
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        with open(summary_path, "a", encoding="utf-8") as handle:
            handle.write(f"## llmperf: {llm.device}\n\n{counts_line}\n\n{report.verdict_table(rows)}\n\n")


def _write_benchmark_json_alone(config: pytest.Config) -> None:
    """pytest-benchmark writes --benchmark-json only when its own benchmarks ran; when only ours did,
    write it through its own hooks so the file still appears, in its schema, with our results."""
    bench = getattr(config, "_benchmarksession", None)
    if bench is None or not getattr(bench, "json", None) or bench.benchmarks:
        return
    import json

    machine_info = config.hook.pytest_benchmark_generate_machine_info(config=config)
    commit_info = config.hook.pytest_benchmark_generate_commit_info(config=config)
    document = config.hook.pytest_benchmark_generate_json(config=config, benchmarks=[], include_data=True,
                                                          machine_info=machine_info, commit_info=commit_info)
    config.hook.pytest_benchmark_update_json(config=config, benchmarks=[], output_json=document)
    report.write_atomic(Path(bench.json), json.dumps(document, indent=4, default=str))


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    """Add our results to pytest-benchmark's --benchmark-json, in its schema, for tools that read it."""
    llm = config.stash.get(SESSION_KEY, None)
    if llm is None:
        return
    from .measure.metrics import summarize, values_by_metric

    for outcome in llm.outcomes:
        result = outcome.result
        for batch in result.batches:
            for metric, values in values_by_metric(batch.samples).items():
                if not metric.endswith("_ms"):
                    continue
                s = summarize([v / 1000 for v in values])  # pytest-benchmark's unit is seconds
                output_json.setdefault("benchmarks", []).append({
                    "group": f"llmperf:{llm.device}", "name": f"{result.key}[bs={batch.batch_size}]:{metric}",
                    "fullname": f"{result.nodeid}[bs={batch.batch_size}]:{metric}", "params": {"batch_size": batch.batch_size},
                    "param": str(batch.batch_size), "extra_info": {"device": llm.device, "metric": metric},
                    "options": {"runs": len(values)},
                    "stats": {"min": s.lowest, "max": s.highest, "mean": s.average, "median": s.percentiles[50],
                              "rounds": s.n, "data": [v / 1000 for v in values]},
                })
