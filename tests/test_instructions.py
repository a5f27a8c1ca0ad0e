"""Instruction counts (--llmperf-instructions): the counted runs with an injected instruction clock, the gate of a
count, how counting workers' runs join their side's result and the baseline, and the clear errors. The real
valgrind path (client requests, dumps, a counting worker per side) is tests/test_instructions_valgrind.py."""

import json
from dataclasses import replace
from pathlib import Path

import os

import pytest

from pytest_llmperf.judge.baselines import BaselineEntry, BaselineStore
from pytest_llmperf.judge.rows import DEFAULT_RTOL, count_row, instruction_rows, spread
from pytest_llmperf.judge.rows import row_message
from pytest_llmperf.judge.verdicts import Verdict
from pytest_llmperf.measure.backend import Backend, GenerationRequest
from pytest_llmperf.measure.backend import FakeClock
from pytest_llmperf.measure.instructions import (COUNTS_TAKEN_WITH, INSTRUCTION_METRICS, InstructionClock,
                                                 count_values, counted_runs, not_counted, platform_problem)
from pytest_llmperf.measure.records import BatchResult, BenchmarkResult, RunSample
from pytest_llmperf.measure.keywords import check_marker_kwargs
from pytest_llmperf.measure.scenario import Scenario, ScenarioError
from pytest_llmperf.orchestrate import counting
from pytest_llmperf.orchestrate.protocol import Hello, Report, Result, Side, WorkerRun

REQUEST = GenerationRequest(batch_size=2, sequence_length=8, decode_length=4, prompt="x")


class Stepped(Backend):
    """An in-process engine that times its phases with self.clock, as the HF backend does."""

    kind = "stepped"
    splits_prefill = True
    clocked_in_process = True

    def generate(self, request):
        clock = self.clock
        start = clock()
        tokenized = clock()
        times = [clock()]
        for _ in range(request.decode_length - 1):
            times.append(clock())
        end = clock()
        rel = [t - start for t in times]
        return RunSample(batch_size=request.batch_size, token_times_ns=[rel] * request.batch_size,
                         end_to_end_ns=end - start, tokenize_ns=tokenized - start, prefill_ns=times[0] - tokenized,
                         decode_steps_ns=[b - a for a, b in zip(times, times[1:])],
                         generated_tokens=request.batch_size * request.decode_length)

    def describe(self):
        return {"backend": self.kind}


class FakeCounter(FakeClock):
    """An InstructionClock's interface over scripted readings: what counted_runs drives."""

    def __init__(self, ticks):
        super().__init__(ticks)
        self.starts = 0
        self.resets = 0
        self.instrumenting = False

    def start(self):  # as InstructionClock.start: once, until stopped
        self.starts += not self.instrumenting
        self.instrumenting = True

    def reset(self):
        self.resets += 1

    def stop(self):
        self.instrumenting = False


def test_counted_runs_turn_clock_readings_into_instructions_and_restore_the_timing_clock():
    backend = Stepped(clock=FakeClock(step=1000))
    timing = backend.clock
    # a settling run (dropped), then two: start 0, tokenized 10, prefill ends 110, decode steps of 7, 7 and 10, end 140
    readings = [0, 10, 999, 1000, 1001, 1002, 1003] + [0, 10, 110, 117, 124, 134, 140] * 2
    counter = FakeCounter(readings)
    samples = counted_runs(backend, REQUEST, runs=2, warmups=1, clock=counter, settling=1)
    assert backend.clock is timing and timing.now == 7000  # the warmup ran on the timing clock
    assert counter.starts == 1 and counter.resets == 3
    assert [s.instructions for s in samples] == [{"prefill_instructions": 100.0, "decode_step_instructions": 8.0,
                                                  "e2e_instructions_per_token": 140 / 8}] * 2
    assert all(s.end_to_end_ns == 0 and s.token_times_ns == [] for s in samples)  # never read as times


def test_only_the_batch_size_where_instrumentation_starts_pays_a_settling_run():
    backend = Stepped(clock=FakeClock(step=1000))
    run = [0, 10, 110, 117, 124, 134, 140]
    counter = FakeCounter([0, 10, 999, 1000, 1001, 1002, 1003] + run + run)
    first = counted_runs(backend, REQUEST, runs=1, warmups=1, clock=counter, settling=1)
    assert counter.resets == 2 and len(first) == 1  # instrumentation started here: a settling run, then the counted one
    later = counted_runs(backend, REQUEST, runs=1, warmups=1, clock=counter, settling=1)
    assert counter.resets == 3 and len(later) == 1  # its warmup ran instrumented: no settling run
    assert later[0].instructions == first[0].instructions


class Recording(Stepped):
    """Says, per generate(), its batch size and whether the counter was instrumenting."""

    def __init__(self, counter, **kwargs):
        super().__init__(**kwargs)
        self.counter = counter
        self.calls = []

    def generate(self, request):
        self.calls.append((request.batch_size, self.counter.instrumenting))
        return super().generate(request)


def test_a_counting_process_warms_up_every_batch_size_uninstrumented_before_it_counts_any():
    from pytest_llmperf.measure.runner import measure

    run = [0, 10, 110, 117, 124, 134, 140]
    counter = FakeCounter(run * 6)
    backend = Recording(counter, clock=FakeClock(step=1000))
    scenario = Scenario(batch_sizes=(1, 2), sequence_length=8, decode_length=4, runs=1, warmups=1)
    for test in ("first", "second"):  # a second test in the same process stops instrumentation and warms up again
        backend.calls.clear()
        result = measure(backend, scenario, key=test, nodeid=f"m.py::{test}", module="m.py", counter=counter)
        # warmups at valgrind's base cost, then a settling run where instrumentation starts, then one run per size
        assert backend.calls == [(1, False), (2, False), (1, True), (1, True), (2, True)]
        assert [len(b.counted) for b in result.batches] == [1, 1] and not any(b.samples for b in result.batches)
    assert counter.starts == 2


class RecordedRequests:
    def __init__(self):
        self.sent = []

    def __getattr__(self, name):
        return lambda *args: self.sent.append(name)


def test_the_clock_stops_instrumenting_once_and_a_counting_worker_stops_it_before_its_last_teardown(tmp_path):
    from pytest_llmperf.orchestrate.worker import WorkerRecorder

    requests = RecordedRequests()
    clock = InstructionClock(requests, tmp_path / "out")
    clock.instrumenting = True
    clock.stop()
    clock.stop()
    assert requests.sent == ["stop_instrumentation"] and not clock.instrumenting
    recorder = WorkerRecorder(tmp_path / "records.jsonl")
    recorder.counter = FakeCounter([])
    recorder.counter.instrumenting = True
    recorder.pytest_runtest_teardown(item=None, nextitem=object())  # more tests to count: instrumentation stays on
    assert recorder.counter.instrumenting
    recorder.pytest_runtest_teardown(item=None, nextitem=None)  # the last test: its teardown is not counted
    assert not recorder.counter.instrumenting
    recorder.close()


def test_count_values_leave_out_what_a_backend_did_not_split():
    server_like = RunSample(batch_size=1, token_times_ns=[[5, 9]], end_to_end_ns=9, generated_tokens=2)
    assert count_values(server_like) == {"e2e_instructions_per_token": 4.5}


def counted(values, process=1, metric="decode_step_instructions"):
    return [RunSample(batch_size=1, token_times_ns=[], end_to_end_ns=0, process=process,
                      instructions={metric: v}) for v in values]


def result_with(counted_runs=(), count_error=None):
    sample = RunSample(batch_size=1, token_times_ns=[[1, 2]], end_to_end_ns=2, prefill_ns=1, decode_steps_ns=[1])
    batch = BatchResult(1, samples=[sample], counted=list(counted_runs), count_error=count_error)
    return BenchmarkResult(key="t", nodeid="m.py::t", module="m.py", scenario={}, backend={}, batches=[batch])


@pytest.mark.parametrize("now, verdict", [(1_002_000, Verdict.PASS), (1_010_000, Verdict.REGRESSED),
                                          (990_000, Verdict.IMPROVED), (1_004_900, Verdict.PASS)])
def test_a_count_is_held_to_its_tolerance(now, verdict):
    row = count_row(result_with(), 1, "decode_step_instructions", [[1_000_000, 1_000_100]], [[now, now]], 0.005)
    assert row.verdict == verdict
    assert row.ratio == pytest.approx(now / 1_000_050)
    assert row.note.startswith("instructions (callgrind): within 0.50%")


def test_a_count_that_varies_more_than_the_tolerance_is_refused_with_its_spread():
    row = count_row(result_with(), 1, "decode_step_instructions", [[1_000_000], [1_006_000]], [[1_000_000]], 0.005)
    assert row.verdict == Verdict.REFUSED
    assert "counts vary by 0.60% between runs and processes, more than the tolerance (0.50%)" in row.note
    assert "n=2/1 processes" in row.note
    assert spread([1.0, 1.003]) == pytest.approx(0.003 / 1.0015)
    within = count_row(result_with(), 1, "decode_step_instructions", [[1_000_000], [1_004_000]], [[1_000_000]], 0.005)
    assert within.verdict == Verdict.PASS  # the measured spread of unchanged code (0.39%) stays comparable


def test_the_failure_names_the_count_its_phase_and_the_signal():
    row = count_row(result_with(), 1, "decode_step_instructions", [[26_000_000]], [[26_260_000]], 0.005)
    text = row_message(row)
    assert text.startswith("decode_step_instructions (decode, instructions counted under callgrind) at batch size 1 "
                           "regressed: reference 26,000,000, now 26,260,000 instructions (+1.00%")


def counts_entry(values):
    """A reference holding counts taken as counting workers take them now."""
    return BaselineEntry(key="t", values=values, fingerprint={"counts": COUNTS_TAKEN_WITH})


def test_rows_say_why_a_batch_was_not_counted_and_when_the_reference_holds_no_counts():
    entry = counts_entry({1: {"decode_step_instructions": [100.0]}})
    rows = instruction_rows(result_with(count_error="instructions not counted: the tgi backend works in a server"),
                            entry, Scenario(), "the baseline")
    assert [(r.metric, r.verdict, r.note) for r in rows] == [
        ("instructions", Verdict.UNGATED, "instructions not counted: the tgi backend works in a server")]
    rows = instruction_rows(result_with(counted([100.0, 100.0])), counts_entry({1: {}}), Scenario(), "HEAD (abc)")
    assert rows[0].verdict == Verdict.UNGATED and "HEAD (abc) holds no counts" in rows[0].note
    assert instruction_rows(result_with(), entry, Scenario(), "the baseline") == []  # not asked to count


def test_a_marker_tolerance_for_a_count_wins_over_the_default():
    entry = counts_entry({1: {"decode_step_instructions": [100.0]}})
    current = result_with(counted([101.0, 101.0]))
    assert instruction_rows(current, entry, Scenario(), "b")[0].verdict == Verdict.REGRESSED
    loose = Scenario(rtol_per_metric={"decode_step_instructions": 0.02})
    assert instruction_rows(current, entry, loose, "b")[0].verdict == Verdict.PASS
    assert DEFAULT_RTOL == 0.005


def test_counts_taken_another_way_are_not_compared():
    # recorded before counting workers ran under PYTHONMALLOC=malloc: a tiny-llama decode step counts 1.6% less
    old = BaselineEntry(key="t", values={1: {"decode_step_instructions": [100.0]}}, fingerprint={"python": "3.11.7"})
    row, = instruction_rows(result_with(counted([101.6, 101.6])), old, Scenario(), "the baseline")
    assert row.verdict == Verdict.REFUSED
    assert (f"the baseline's counts were taken with Python's own allocator (pymalloc), these with {COUNTS_TAKEN_WITH}: "
            "not comparable; record them again with --llmperf-update --llmperf-instructions") in row.note
    assert BaselineEntry.of_result(result_with(counted([1.0, 1.0]))).fingerprint["counts"] == COUNTS_TAKEN_WITH
    assert "counts" not in BaselineEntry.of_result(result_with()).fingerprint  # nothing counted, nothing said


def test_a_baseline_keeps_the_counts_of_each_process_and_gates_against_them(tmp_path):
    runs = counted([500.0, 500.0], 1) + counted([501.0, 501.0], 2) + counted([500.5, 500.5], 3)
    store = BaselineStore(tmp_path, "cpu", updating=True)
    store.write("m.py", BaselineEntry.of_result(result_with(runs), created="now"))
    data = json.loads(store.path_for("m.py").read_text())
    # each counting process's median, beside the timed values (schema 3)
    assert data["benchmarks"]["t"]["values"]["1"]["decode_step_instructions"] == [500.0, 501.0, 500.5]
    entry = BaselineStore(tmp_path, "cpu").get("m.py", "t")
    assert entry.values[1]["decode_step_instructions"] == [500.0, 501.0, 500.5]
    assert "decode_token_ms" in entry.values[1]
    row, = instruction_rows(result_with(counted([510.0, 510.0])), entry, Scenario(), "the baseline")
    assert row.verdict == Verdict.REGRESSED and "n=3/1 processes, 3/2 runs" in row.note
    spread_out = result_with(counted([500.0, 500.0], 1) + counted([520.0, 520.0], 2))
    store.write("m.py", BaselineEntry.of_result(spread_out, created="now"))
    row, = instruction_rows(result_with(counted([500.0, 500.0])), BaselineStore(tmp_path, "cpu").get("m.py", "t"),
                            Scenario(), "the baseline")
    assert row.verdict == Verdict.REFUSED  # the stored processes spread 4%: their spread is kept and checked


def measured(result, nodeid="m.py::t"):
    return Result(nodeid, result)


def hello(counts):
    return Hello(protocol=5, pid=1, process=1, counts=counts)


def test_counting_workers_runs_join_the_timed_result_of_their_side():
    side = Side("B", Path("."), "the working tree")
    count_part = BenchmarkResult(key="t", nodeid="m.py::t", module="m.py", scenario={}, backend={},
                                 batches=[BatchResult(1, counted=counted([7.0, 7.0]))])
    run = WorkerRun(side, 1, hello(True), measured=[measured(count_part)])
    joined = counting.attach(result_with(), [run], side.label)
    assert [s.instructions for s in joined.batches[0].counted] == [{"decode_step_instructions": 7.0}] * 2
    assert joined.batches[0].samples == result_with().batches[0].samples  # the timed runs stay as they were
    old = WorkerRun(side, 1, hello(False), measured=[measured(count_part)])
    assert counting.attach(result_with(), [old], "HEAD (abc)").batches[0].count_error == (
        "instructions not counted on HEAD (abc): its pytest-llmperf does not count them")
    failed = WorkerRun(side, 1, hello(True), reports=[Report("m.py::t", "call", "failed", "Traceback\nRuntimeError: boom")])
    assert counting.attach(result_with(), [failed], "the working tree").batches[0].count_error == (
        "instructions not counted: the counting process on the working tree measured nothing (RuntimeError: boom)")
    assert counting.attach(result_with(), [], "x") == result_with()  # nothing asked to count


def test_a_server_backend_is_said_not_counted():
    class Server(Backend):
        kind = "tgi"

        def generate(self, request):
            raise AssertionError

        def describe(self):
            return {}

    assert not_counted(Server()) == ("instructions not counted: the tgi backend works in a server process, which "
                                     "callgrind does not see (only the pytest process is counted)")


def test_setup_problems_name_the_fix():
    assert "apt-get install valgrind" in counting.setup_problem(which=lambda name: None)
    unsupported = counting.setup_problem(which=lambda name: "/usr/bin/valgrind", torch_supported=lambda: False)
    assert "torch._C._valgrind_supported_platform() is False" in unsupported
    assert counting.setup_problem(which=lambda name: "/usr/bin/valgrind", torch_supported=lambda: True) is None
    assert platform_problem("aarch64", "Linux") == ("instruction counts are taken on x86-64 Linux (callgrind's client "
                                                    "requests are issued from x86-64 code); this machine is Linux "
                                                    "aarch64")


def test_the_marker_keyword_is_checked():
    assert check_marker_kwargs((), {"instructions": True}) == {"instructions": True}
    with pytest.raises(ScenarioError, match="instructions='yes' is not valid: expected True or False"):
        check_marker_kwargs((), {"instructions": "yes"})


@pytest.fixture
def project(project, monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS")  # the default processes: counting needs workers
    project.makepyfile(test_it="import pytest\n\n@pytest.mark.llmperf\ndef test_it(llmperf):\n    pass\n")
    return project


@pytest.mark.parametrize("args, said", [
    (("--llmperf-device=a100",), "instructions are counted on the cpu target only"),
    (("--llmperf-device=cpu", "--llmperf-processes=1"), "--llmperf-processes=1 measures in this process"),
])
def test_settings_that_cannot_count_are_refused_up_front(project, args, said):
    result = project.runpytest("--llmperf-instructions", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*llmperf: --llmperf-instructions: *{said}*"])


def test_valgrind_missing_is_refused_with_how_to_install_it(project, monkeypatch, addopts):
    monkeypatch.setenv("PATH", str(project.path))  # no valgrind on it
    addopts("--llmperf-instructions")  # from PYTEST_ADDOPTS, as a CI job may give it
    result = project.runpytest_inprocess("--llmperf-device=cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*not installed here; install it: apt-get install valgrind (Debian, Ubuntu)*"])


def test_instruction_metrics_are_defined_with_their_unit():
    from pytest_llmperf.measure.metrics import METRICS

    assert all(METRICS[m].unit == "instructions" and METRICS[m].better == "lower" for m in INSTRUCTION_METRICS)


def test_the_json_report_keeps_each_counted_run_beside_the_timed_ones():
    from pytest_llmperf.report.stored import StoredResult

    kept = StoredResult.of(result_with(counted([7.0], 1) + counted([8.0], 2))).to_json()
    assert kept["batches"][0]["counts"] == {"decode_step_instructions": [7.0, 8.0]}
    assert StoredResult.from_json(kept).batches[0].counts == {"decode_step_instructions": [7.0, 8.0]}
    assert "counts" not in StoredResult.of(result_with()).to_json()["batches"][0]  # nothing counted, nothing said


def test_a_failed_counting_worker_stops_the_others_it_ran_beside(tmp_path, monkeypatch):
    import subprocess
    import time

    from pytest_llmperf.orchestrate.pool import WorkerPool
    from pytest_llmperf.orchestrate.protocol import WorkerError, WorkerSpec
    from pytest_llmperf.orchestrate.pool import RunningWorker

    started = []

    class Sleepers(WorkerPool):
        """Each worker sleeps a minute; side A's fails after half a second."""

        def run(self, spec):
            proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
            started.append(proc)
            with self._lock:
                self.running.add(RunningWorker(spec, proc, tmp_path / "o", tmp_path / "l", open(os.devnull, "wb"),
                                               tmp_path, 0.0))
            if spec.side.name == "A":
                time.sleep(0.5)  # the other side's worker is running by now
                raise WorkerError("worker process 1 on HEAD exited with code 2")
            proc.wait()
            raise WorkerError("stopped")

    pool = Sleepers(tmp_path, "{}", 60.0, tmp_path)
    specs = [WorkerSpec(Side(name, tmp_path, label), 1, ("m.py::t",)) for name, label in (("A", "HEAD"),
                                                                                          ("B", "the working tree"))]
    begun = time.monotonic()
    with pytest.raises(WorkerError, match="on HEAD exited with code 2"):
        counting.count(pool, specs)
    assert time.monotonic() - begun < 30  # not the 60 s the other worker would have run
    assert len(started) == 2 and all(proc.poll() is not None for proc in started)


class DumpingRequests:
    """ClientRequests' interface writing dumps as callgrind does: one per thread under --separate-threads=yes."""

    def __init__(self, out, per_thread):
        self.out, self.per_thread, self.dumps = out, per_thread, 0

    def dump(self, label):
        self.dumps += 1
        for thread, total in enumerate(self.per_thread, start=1):
            name = f"{self.out}.{self.dumps}-{thread:02d}" if len(self.per_thread) > 1 else f"{self.out}.{self.dumps}"
            Path(name).write_text(f"events: Ir\nfn=(1) f\n0 {total}\ntotals: {total}\n")

    def toggle_collect(self):
        pass


@pytest.mark.parametrize("keep", [False, True])
def test_instruction_clock_sums_every_threads_dump_and_keeps_them_only_when_asked(tmp_path, keep):
    out = tmp_path / "cg.out"
    clock = InstructionClock(DumpingRequests(out, [100, 20]), out, keep=keep)
    assert [clock(), clock()] == [120, 240]
    assert len(list(tmp_path.glob("cg.out.*"))) == (4 if keep else 0)
    single = InstructionClock(DumpingRequests(tmp_path / "one", [7]), tmp_path / "one")
    assert single() == 7 and not list(tmp_path.glob("one.*"))


@pytest.mark.parametrize("update", ["--llmperf-update", "--llmperf-update-missing"])
def test_counts_only_cannot_record_a_baseline(project, addopts, update):
    addopts("--llmperf-instructions-only")  # from PYTEST_ADDOPTS, as a CI job may give it
    result = project.runpytest_inprocess("--llmperf-device=cpu", update)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*llmperf: --llmperf-instructions-only measures no wall time, so it cannot record a "
                                 "baseline*record with --llmperf-update --llmperf-instructions, then gate with "
                                 "--llmperf-instructions-only*"])


def counted_only(counted_runs):
    """A counting worker's result: counted runs, no timed ones (what --llmperf-instructions-only judges)."""
    batch = BatchResult(1, counted=list(counted_runs))
    return BenchmarkResult(key="t", nodeid="m.py::t", module="m.py", scenario=Scenario().to_json(),
                           backend={"backend": "stepped"}, batches=[batch])


def both_counts(decode, prefill):
    return [RunSample(batch_size=1, token_times_ns=[], end_to_end_ns=0, process=1,
                      instructions={"decode_step_instructions": decode, "prefill_instructions": prefill})]


def test_a_result_counted_only_is_judged_on_its_counts_and_stored_as_a_reference():
    result = counted_only(both_counts(1_000_000.0, 5_000_000.0))
    batch = result.batches[0]
    assert batch.counted_only and not batch.ok  # not timed, and not failed
    merged = BenchmarkResult.merge([result])
    assert merged.batches[0].counted_only  # the controller merges a side's runs per key
    entry = BaselineEntry.of_result(counted_only(both_counts(990_000.0, 5_000_000.0)))
    assert entry.errors == {} and entry.values[1] == {"decode_step_instructions": [990_000.0],
                                                      "prefill_instructions": [5_000_000.0]}
    rows = {r.metric: r.verdict for r in instruction_rows(merged, entry, Scenario(), "HEAD")}
    assert rows == {"decode_step_instructions": Verdict.REGRESSED, "prefill_instructions": Verdict.PASS}


def test_the_markdown_report_shows_counts_and_says_a_benchmark_counted_only_was_not_timed():
    from pytest_llmperf.report.markdown import benchmark_section

    text = benchmark_section(counted_only(counted([26_500_000.0]) + counted([26_400_000.0], process=2)))
    assert "Not timed: instructions counted under callgrind only (--llmperf-instructions-only)." in text
    assert "| Decode step | 1          | 26,450,000 | 2            |" in text
    assert "NaN" not in text and "Time to first token" not in text and "ok: None" not in text
    timed = benchmark_section(replace(result_with(counted([26_500_000.0])), scenario=Scenario().to_json()))
    assert "| Average" in timed and "Instructions (callgrind)" in timed and "Not timed" not in timed


def test_the_html_page_draws_a_count_as_its_point_at_its_own_tolerance():
    from pytest_llmperf.report import html

    plots = pytest.importorskip("pytest_llmperf.report.plots")
    row = {"key": "t", "nodeid": "m.py::t", "metric": "decode_step_instructions", "batch_size": 1,
           "baseline": 1e6, "now": 1.02e6, "ratio": 1.02, "ci_low": None, "ci_high": None, "verdict": "regressed"}
    doc = {"device": "cpu", "settings": {"rtol": 0.05}, "benchmarks": [{"key": "t", "scenario": {"rtol": 0.05}}],
           "verdicts": [row], "definitions": {}}
    page = html.ratio_section(plots, [doc])
    assert "nothing compared" not in page and "1.0200 (a count, held to its tolerance)" in page
    assert html._rtol(doc["benchmarks"][0], doc, "decode_step_instructions") == DEFAULT_RTOL
    assert html._rtol(doc["benchmarks"][0], doc, "decode_token_ms") == 0.05


def test_a_module_markers_instructions_holds_under_a_function_marker_of_other_keywords(pytester):
    """Every keyword merges markers nearest first (orchestrate/options.py): a module's instructions=True is not
    hidden by the test's own marker that sets only runs."""
    items = pytester.getitems("""
import pytest

pytestmark = pytest.mark.llmperf(instructions=True)

@pytest.mark.llmperf(runs=3)
def test_counted(llmperf):
    pass

@pytest.mark.llmperf(instructions=False)
def test_not_counted(llmperf):
    pass
""")
    assert [counting.wants_instructions(item, False) for item in items] == [True, False]
