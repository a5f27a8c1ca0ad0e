"""Short messages: verdict-table cells of at most 120 characters (the whole note goes to the failure text or
warning, and under the markdown table), hints right for the situation (no advice already followed, one
--llmperf-max-load for a re-run), and warnings located at the user's files, never at a line of this package."""

import json
import warnings

import pytest

from pytest_llmperf.backends.simulated import SimulatedBackend
from pytest_llmperf.judge.baselines import BaselineEntry
from pytest_llmperf.judge.procedure import Schedule
from pytest_llmperf.judge.quality import admitting, busy_note
from pytest_llmperf.judge.rows import Reference, judge_rows
from pytest_llmperf.judge.verdicts import Outcome, Status, Verdict, kind_of, reason_of
from pytest_llmperf.measure import runner
from pytest_llmperf.measure.records import BenchmarkResult
from pytest_llmperf.measure.scenario import Scenario
from pytest_llmperf.offload.costs import CostWarning
from pytest_llmperf.offload.fixture import _relocated
from pytest_llmperf.report.verdict_table import CELL_LIMIT, cells, note_details

LONG_OUTPUT = "t" + " t".join(str(i) for i in range(100, 160))
NOTES = {  # as judge/rows.py and judge/outputs.py word them, at their longest
    "busy now": busy_note(12.345, None, 0.25),
    "busy baseline": busy_note(None, 12.345, 0.25),
    "not comparable": ("not comparable: the baseline holds one value per worker process, this run runs of one "
                       "process (--llmperf-processes=1). Measure as the baseline was (--llmperf-processes) or "
                       "re-record it with --llmperf-update"),
    "inconclusive": "undecided at the cap of 64 processes per side, more than 1000 would decide it; n=64/64 processes",
    "outputs A/B": (f"outputs changed from origin/main (abc1234): sequence 0 differs first at generated token 3 "
                    f"(id 103 -> 104); baseline '{LONG_OUTPUT}', now '{LONG_OUTPUT}'"),
    "oom now": "ran in the baseline, now oom: CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total)",
    "error": "RuntimeError: " + "x" * 300,
}


def row(note, verdict="refused", metric="*"):
    return {"key": "test_engine[a|b]", "nodeid": "t.py::test_engine[a|b]", "metric": metric, "batch_size": 4,
            "baseline": None, "now": None, "ratio": None, "ci_low": None, "ci_high": None, "p_value": None,
            "p_adjusted": None, "verdict": verdict, "note": note}


@pytest.mark.parametrize("case", list(NOTES))
def test_a_verdict_cell_is_at_most_120_characters_and_says_what_happened(case):
    verdict = cells(row(NOTES[case]))[-1]
    assert len(verdict) <= CELL_LIMIT, verdict
    head = {"busy now": "refused: machine busy: other processes used 12.35 cores during the runs",
            "busy baseline": "refused: baseline measured on a busy machine",
            "not comparable": "refused: not comparable: the baseline holds one value per worker process, this run "
                              "runs of one process",
            "inconclusive": "refused: undecided at the cap of 64 processes per side, more than 1000 would decide it",
            "outputs A/B": "refused: outputs changed from origin/main",
            "oom now": "refused: ran in the baseline, now oom: CUDA out of memory",
            "error": "refused: RuntimeError: " + "x" * (CELL_LIMIT - 24) + "…"}[case]
    assert verdict == head


def test_the_markdown_report_keeps_each_shortened_note_in_full():
    document = {"verdicts": [row(n) for n in NOTES.values()] + [row("n=8/8 processes", "pass", "prefill_ms")],
                "outcomes": [], "benchmarks": []}
    details = note_details(document)
    assert len(details) == len(NOTES)  # the pass row's n= note is the numbers' own: nothing was shortened
    assert all(d.startswith("test_engine[a|b], batch size 4: refused: ") for d in details)
    assert {d.split(": refused: ", 1)[1] for d in details} == set(NOTES.values())


def _measured(seed, processes):
    parts = []
    for index in range(1, processes + 1):
        result = runner.measure(SimulatedBackend(seed=seed + index), Scenario(batch_sizes=(1,), runs=5, warmups=0),
                                key="k", nodeid="t.py::k", module="t.py")
        for sample in result.batches[0].samples:
            sample.process = index if processes > 1 else 0
        parts.append(result)
    return BenchmarkResult.merge(parts) if processes > 1 else parts[0]


def test_gating_in_one_process_against_a_worker_baseline_is_not_comparable_in_the_row_and_the_summary():
    baseline = BaselineEntry.of_result(_measured(0, 5))
    now = _measured(10, 1)
    rows = judge_rows(now, Reference(baseline, "the baseline"), Scenario(batch_sizes=(1,), runs=5),
                      splits_prefill=True, schedule=Schedule((5,), 0.01), final=True, max_load=float("inf"))
    outcome = Outcome(now, Status.COMPARED, rows=rows)
    assert [r.verdict for r in rows] == [Verdict.REFUSED] and rows[0].note.startswith("not comparable: ")
    assert str(kind_of(outcome)) == "refused" and reason_of(outcome) == "not comparable"


def test_a_max_load_hint_admits_the_load_it_names():
    for load in (0.0, 0.93, 1.2, 6.53, 10.24, 99.9):
        digits = f"{admitting(load):g}".replace(".", "").strip("0")
        assert admitting(load) >= load + 0.25 and len(digits) <= 2  # rounded up, to 2 significant digits


# -- through the plugin: a busy machine now, on an injected load meter ----------------------------------------

ENGINE = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1, 2], runs=5, warmups=0)
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend(seed=1))

@pytest.mark.llmperf(batch_sizes=[1], runs=5, warmups=0)
def test_other(llmperf):
    llmperf.measure(SimulatedBackend(seed=2))
"""
# Other processes' load as the runner's meter reads it, injected: each run quiet (none retaken), and the mean load
# of each measured batch from LOADS, in order.
CONFTEST = """
import os
from pytest_llmperf.measure import runner

loads = [float(x) for x in os.environ.get("LOADS", "").split(",") if x]

class Meter:
    def stop(self):
        return 0.0

_take = runner.take_runs

def take_runs(*args, **kwargs):
    taken = _take(*args, **kwargs)
    if loads:
        taken.foreign_load = loads.pop(0)
    return taken

runner.LoadMeter = Meter
runner.take_runs = take_runs
"""


@pytest.fixture
def project(project):
    project.makepyfile(test_engine=ENGINE)
    project.makeconftest(CONFTEST)
    return project


def gate(pytester, *args):
    return pytester.runpytest("--llmperf-device=cpu", "--llmperf-machine=m", "-p", "no:cacheprovider",
                              "-o", "llmperf_memory_rtol=1", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


def test_a_busy_machine_gets_short_cells_one_max_load_and_no_advice_already_followed(project, monkeypatch):
    gate(project, "--llmperf-update").assert_outcomes(passed=2)
    monkeypatch.setenv("LOADS", "0.7,1.3,2.95")  # test_engine's two batch sizes, then test_other's
    result = gate(project)
    result.assert_outcomes(passed=2, warnings=2)
    text = result.stdout.str()
    table = [line for line in result.stdout.lines if line.startswith("| test_")]
    assert table and all(len(cell.strip()) <= CELL_LIMIT for line in table for cell in line.split("|"))
    result.stdout.fnmatch_lines(["*| refused: machine busy: other processes used 1.30 cores during the runs *|"])
    # each test's warning: its own one value, located at the test, the whole note
    result.stdout.fnmatch_lines(["*test_engine.py:*: PytestLLMPerfWarning: test_engine: batch size 1: machine busy: "
                                 "other processes used 0.70 cores during the runs (limit 0.25, --llmperf-max-load); "
                                 "not compared; batch size 2: *allow it with --llmperf-max-load=1.6 *"])
    assert "llmperf_threads" not in text  # threads is already 1 on the cpu target
    # the summary: one value for every refused batch size of the session
    result.stdout.fnmatch_lines(["machine busy: 3 batch size(s) refused, other processes used up to 2.95 cores. "
                                 "Re-run when the other work has stopped, or accept the load for all of them (noisier "
                                 "verdicts): pytest --llmperf-device=cpu --llmperf-machine=m -o llmperf_memory_rtol=1 "
                                 "--llmperf-max-load=3.2"])
    assert "pytest_llmperf/" not in text.split("warnings summary", 1)[1].split("llmperf: cpu", 1)[0]


def test_a_report_warning_is_located_at_the_report(project):
    gate(project, "--llmperf-update").assert_outcomes(passed=2)
    report = project.path / "reports" / "cpu.json"
    report.write_text("{ not json")
    result = gate(project)
    result.stdout.fnmatch_lines([f"*{report}:0: PytestLLMPerfWarning: llmperf report: *"])
    summary = result.stdout.str().split("warnings summary", 1)[1]
    assert "session_report.py" not in summary and "warnings.warn(" not in summary
    assert json.loads(report.read_text())["device"] == "cpu"  # written anew, the old one kept beside it


def test_the_offload_engines_start_up_warning_is_located_at_the_test(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "benchmarks/test_offload.py::test_x (call)")
    raised = [warnings.WarningMessage(CostWarning("the machine was busy: 1.2 cores"), CostWarning,
                                      "/site-packages/pytest_llmperf/offload/engine.py", 120),
              warnings.WarningMessage(UserWarning("a library's own"), UserWarning, "/lib/x.py", 7)]
    from pytest_llmperf.warning import current_test_file

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        _relocated(raised, current_test_file(tmp_path))
    assert [(w.filename, w.lineno, str(w.message)) for w in shown] == [
        (str(tmp_path / "benchmarks" / "test_offload.py"), 0, "llmperf_offload: the machine was busy: 1.2 cores"),
        ("/lib/x.py", 7, "a library's own")]


def test_an_ab_row_left_undecided_says_the_regression_it_ruled_out():
    """A/B (judge/stats.py's `nested` on every run): the interval shown is the one that decided, and a row undecided
    at its last look states its bound in the cell."""
    ref, now = _measured(0, 8), _measured(100, 8)
    reference = Reference(BaselineEntry.of_result(ref), "main", ref)
    rows = judge_rows(now, reference, Scenario(batch_sizes=(1,), runs=5, rtol=0.0), splits_prefill=True,
                      schedule=Schedule.planned(8, 8, 0.01, family=3), final=True, max_load=float("inf"))
    undecided = [r for r in rows if r.verdict == Verdict.INCONCLUSIVE]
    assert undecided  # at rtol 0 an A/A row can only be decided as improved or regressed
    for r in undecided:
        bound = r.ci_high - 1 if r.metric != "throughput_tokens_per_s" else 1 - r.ci_low
        assert r.bound == pytest.approx(bound) and r.within_sd is not None and r.between_sd is not None
        cell = cells({**r.__dict__, "verdict": str(r.verdict)})[-1]
        assert cell == f"inconclusive: no regression above {bound:.1%} at 95%, undecided at 8 processes per side"
        assert r.note.endswith("n=8/8 pairs, 40/40 runs")
