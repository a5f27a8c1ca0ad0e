"""Live progress (orchestrate/progress.py, its first half): unit tests on a recording terminal, and pytester runs with -q, -v,
capture variants, a terminal (tty) and xdist's refusal."""

import pytest

from pytest_llmperf.measure.backend import GenerationRequest
from pytest_llmperf.backends.simulated import SimulatedBackend
from pytest_llmperf.measure import runner
from pytest_llmperf.measure.backend import FakeClock
from pytest_llmperf.orchestrate.progress import STATUS_INTERVAL_NS, Progress


def render(raw: str) -> str:
    """What a terminal shows for text with backspaces: each line as its characters end up."""
    lines, line, col = [], [], 0
    for ch in raw:
        if ch == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        elif ch == "\b":
            col = max(col - 1, 0)
        else:
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
    lines.append("".join(line).rstrip())
    return "\n".join(lines)


class RecordingWriter:
    """The parts of pytest's TerminalWriter that Progress uses, recording the raw text."""

    fullwidth = 200

    def __init__(self, start: str = "") -> None:
        self.raw = start
        self._current_line = start

    @property
    def width_of_current_line(self) -> int:
        return len(self._current_line)

    def write(self, msg: str, *, flush: bool = False) -> None:
        self.raw += msg
        self._current_line = msg.rsplit("\n", 1)[-1] if "\n" in msg else self._current_line + msg

    def write_raw(self, msg: str, *, flush: bool = False) -> None:
        self.raw += msg


class RecordingReporter:
    def __init__(self, start: str = "") -> None:
        self._tw = RecordingWriter(start)
        self.currentfspath = "somewhere"
        self.prefixes: list[str] = []

    def write_fspath_result(self, nodeid: str, res: str) -> None:
        self.prefixes.append(nodeid)
        self._tw.write("\n" + nodeid.split("::")[0] + " ")

    def flush(self) -> None:
        pass


def sweep(progress: Progress, *, batch_sizes=(1, 2), runs: int = 5, busy_runs: int = 0) -> None:
    """The runner's real loop on the simulated engine, with the progress as its callback."""
    backend = SimulatedBackend()
    progress.started("test_engine", batch_sizes)
    for bs in batch_sizes:
        loads = iter([10.0] * busy_runs + [0.0] * 100)
        request = GenerationRequest(batch_size=bs, sequence_length=8, decode_length=4, prompt="x")
        import pytest_llmperf.measure.runner as runner_module

        class Meter:
            def stop(self):
                return next(loads)

        original = runner_module.LoadMeter
        runner_module.LoadMeter = Meter
        try:
            runner.take_runs(backend, request, runs, 0, max_load=0.25, on_run=progress.run_done)
        finally:
            runner_module.LoadMeter = original
    progress.finished()


def test_tty_status_is_rewritten_rate_limited_and_erased_leaving_pytests_line_as_it_was():
    reporter = RecordingReporter(start="test_engine.py ")
    clock = FakeClock(step=STATUS_INTERVAL_NS // 2)  # two runs per status interval
    progress = Progress(reporter, None, nodeid="test_engine.py::test_engine", verbosity=0, isatty=True, clock=clock)
    sweep(progress, runs=5, busy_runs=2)
    raw = reporter._tw.raw
    assert "[test_engine: batch size 1 (1/2), run 0/5, 1 retaken (busy)]" in raw  # shown before any kept run
    assert "batch size 2 (2/2), run 1/5, 2 retaken (busy), median e2e" in raw
    assert " tokens/s]" in raw
    # rate limited: 2 x (5 kept + 2 retaken) callbacks, the last of each batch erases; at most one status per interval
    assert raw.count("[test_engine:") <= 8
    assert render(raw) == "test_engine.py"  # erased: the dots/PASSED of pytest land where they would
    assert reporter._tw.width_of_current_line == len("test_engine.py ")  # pytest's idea of the line is unchanged
    assert reporter.prefixes == []  # nothing stayed, so nothing to restore


def test_not_a_tty_prints_one_line_per_batch_size_and_gives_pytest_its_prefix_back():
    reporter = RecordingReporter(start="test_engine.py ")
    progress = Progress(reporter, None, nodeid="test_engine.py::test_engine", verbosity=0, isatty=False,
                        clock=FakeClock())
    sweep(progress, runs=3, busy_runs=1)
    lines = render(reporter._tw.raw).splitlines()
    assert lines[0] == "test_engine.py"
    assert lines[1].startswith("llmperf test_engine: batch size 1 (1/2), run 3/3, 1 retaken (busy), "
                               "median e2e ")
    assert lines[2].startswith("llmperf test_engine: batch size 2 (2/2), run 3/3, 1 retaken")
    assert lines[3] == "test_engine.py"  # the prefix again, for pytest's "."
    assert len(lines) == 4 and "\b" not in reporter._tw.raw
    assert reporter.prefixes == ["test_engine.py::test_engine"] and reporter.currentfspath is None


def test_quiet_without_a_tty_prints_nothing():
    reporter = RecordingReporter(start="")
    progress = Progress(reporter, None, nodeid="t.py::t", verbosity=-1, isatty=False, clock=FakeClock())
    sweep(progress)
    assert reporter._tw.raw == "" and reporter.prefixes == []


def test_runner_without_a_callback_is_unchanged():
    backend = SimulatedBackend()
    request = GenerationRequest(batch_size=2, sequence_length=8, decode_length=4, prompt="x")
    seen = []
    taken = runner.take_runs(backend, request, 3, 1, on_run=lambda *args: seen.append(args[:4]))
    assert seen == [(2, 1, 3, 0), (2, 2, 3, 0), (2, 3, 3, 0)] and len(taken.samples) == 3
    assert len(runner.take_runs(SimulatedBackend(), request, 3, 1).samples) == 3


ENGINE_TEST = """
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1, 2, 4], runs=5, warmups=0)
def test_engine(llmperf):
    print("printed by the test")
    llmperf.measure(SimulatedBackend(oom_from_batch=4))
    assert os.environ.get("FAIL_AFTER") != "1", "failing on purpose"
"""

TTY_CONFTEST = """
import pytest

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    reporter.isatty = lambda: True
"""


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.delenv("FAIL_AFTER", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=ENGINE_TEST)
    return pytester


@pytest.fixture
def run(run):
    return run.with_flags("--llmperf-max-load=1000", "--llmperf-update", "-W",
                          "ignore::pytest.PytestAssertRewriteWarning")


BATCH_LINES = ["llmperf test_engine: batch size 1 (1/3), run 5/5, median e2e * ms, * tokens/s",
               "llmperf test_engine: batch size 2 (2/3), run 5/5, median e2e * ms, * tokens/s"]


def test_verbose_prints_a_line_per_batch_size_then_the_result_on_the_tests_line(project, run):
    result = run("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([*BATCH_LINES, "test_engine.py::test_engine PASSED*"], consecutive=True)
    # oom: no runs, no progress line (the report says oom)
    result.stdout.no_fnmatch_line("llmperf test_engine: batch size 4*")


def test_default_without_a_tty_prints_a_line_per_batch_size_and_the_dot_after_the_file(project, run):
    result = run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["test_engine.py ", *BATCH_LINES, "test_engine.py .*"], consecutive=True)


def test_quiet_prints_no_progress(project, run):
    result = run("-q")
    result.assert_outcomes(passed=1)
    assert "llmperf test_engine: batch size" not in result.stdout.str()


@pytest.mark.parametrize("capture", ["fd", "sys", "no", "tee-sys"])
def test_progress_stays_out_of_captured_output(project, run, monkeypatch, capture):
    monkeypatch.setenv("FAIL_AFTER", "1")
    result = run(f"--capture={capture}")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert out.count("llmperf test_engine: batch size 1 (1/3), run 5/5") == 1  # once: not also in a captured section
    if capture != "no":
        section = out.split("Captured stdout call", 1)[1].split("short test summary", 1)[0]
        assert "printed by the test" in section and "llmperf test_engine" not in section
    result.stdout.fnmatch_lines(["*failing on purpose*"])


@pytest.mark.parametrize("verbosity", [[], ["-q"]])
def test_on_a_terminal_the_status_is_erased_and_pytests_lines_read_as_without_it(project, run, verbosity):
    project.makeconftest(TTY_CONFTEST)
    result = run(*verbosity)
    result.assert_outcomes(passed=1)
    raw = result.stdout.str()
    assert "[test_engine: batch size 1 (1/3), run 1/5, median e2e" in raw and "\b" in raw
    shown = render(raw).splitlines()
    assert any(line.split("[100%]")[0].rstrip() == ("." if verbosity else "test_engine.py .") for line in shown)
    assert not any("test_engine: batch size" in line for line in shown)


def test_xdist_refusal_is_unchanged(project, run):
    pytest.importorskip("xdist")
    result = run("-n", "1")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*timed benchmark tests must not run under pytest-xdist*"])
    assert "llmperf test_engine: batch size" not in result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str()
