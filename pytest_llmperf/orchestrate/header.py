"""The `llmperf:` lines of pytest's header: the device, the settings, how benchmarks are measured and judged.

Shown in every perf_session, so this module imports nothing heavy (the summary's statistics are report/terminal.py's).
"""

from __future__ import annotations

from .session import LLMPerfSession

#: How the two sides of an A/B round alternate, by llmperf_interleave (orchestrate/turns.py).
INTERLEAVED = {
    "run": "taking turns run by run",
    "batch": "taking turns at every batch size",
    "process": "one worker process after the other",
}


def header_lines(perf_session: LLMPerfSession) -> list[str]:
    s = perf_session.settings
    return [
        f"llmperf: device={perf_session.device} ({'given' if perf_session.device_given else 'detected'}), "
        f"mode={perf_session.mode}, "
        f"runs={s.runs}{' (auto)' if perf_session.runs_auto else ''}, warmups={s.warmups}, max_runs={s.max_runs}, "
        f"alpha={s.alpha}, rtol={s.rtol:g}"
        f"{f' ({perf_session.rtol_auto})' if perf_session.rtol_auto else ''}, malloc={s.malloc}, "
        f"threads={perf_session.threads_text()}, "
        f"fail_on={','.join(s.fail_on) or 'none'}",
        f"llmperf: {_measured_how(perf_session)}",
        *(
            [
                "llmperf: instructions only: the tests that count are not timed, their rows are the counts of one "
                "process per side under callgrind (--llmperf-instructions-only)"
            ]
            if s.instructions_only
            else []
        ),
        f"llmperf: baselines={'none (A/B: both sides measured here)' if s.compare else perf_session.baseline_set}, "
        f"reports={s.report_dir}",
    ]


def _measured_how(perf_session: LLMPerfSession) -> str:
    s = perf_session.settings
    if perf_session.recorder is not None:
        return "a worker process of the controlling pytest process"
    where = (
        f"the working tree against {s.compare} (A/B, {INTERLEAVED[s.interleave]})"
        if s.compare
        else "against the stored baselines"
    )
    if perf_session.in_process:
        return (
            f"processes=1: in this pytest process, the gate tests runs {where}: {s.runs} at the first look, "
            f"doubling to max_runs={s.max_runs} for undecided rows"
        )
    auto = " (auto)" if s.processes == "auto" else ""
    if perf_session.mode == "update":
        return (
            f"processes={perf_session.processes}{auto}: a baseline records {perf_session.recording_processes} worker "
            f"processes (twice the first look; the gate tests their medians)"
        )
    if perf_session.mode == "update-missing":
        return (
            f"processes={perf_session.processes}{auto}: {perf_session.recording_processes} worker processes per "
            f"benchmark "
            f"(twice the first look; the gate tests their medians), judged {where} in one look, or recorded "
            f"where a baseline is missing"
        )
    started = {
        "fork": "forked from a server that imported the libraries both sides share",
        "exec": "each a fresh interpreter",
    }[s.worker_start]
    if s.compare:
        auto_budget = "5 times the first look's time, at most 5 min more (auto)"
        budget = auto_budget if s.budget == "auto" else f"{float(s.budget):g} s"
        return (
            f"processes={perf_session.processes}{auto} per side at the first look (worker processes, {started}; "
            f"the gate "
            f"tests the means of their runs, pair by pair), then a look where this job's spreads say its undecided "
            f"rows will be decided, runs per process chosen from them, and a last one, within "
            f"{perf_session.max_processes} processes and a budget of {budget}, {where}"
        )
    return (
        f"processes={perf_session.processes}{auto} per side at the first look (worker processes, {started}; the gate "
        f"tests their medians), then one more a round while rows are undecided, judged after every round up to "
        f"{perf_session.max_processes} (alpha spent at the doublings and the cap), {where}"
    )
