"""Baseline and report files that are not as the plugin wrote them: too few runs (S3), gated metrics missing
(S4), fields it does not know (S5), a link to nothing (S6), a read-only file (S7), the temporary file of a
killed write (L2), and two sessions ending at once over one report directory (D1). Each is said with the fix;
nothing is lost, nothing is written outside the project, nothing is left behind."""

import json
import os
import subprocess
import sys

import pytest


ENGINE = """
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], warmups=0)
def test_a(llmperf):
    llmperf.measure(SimulatedBackend(decode_slowdown=float(os.environ.get("SLOW", "1")),
                                     prefill_slowdown=float(os.environ.get("SLOW_PREFILL", "1"))))

@pytest.mark.llmperf(batch_sizes=[1], warmups=0)
def test_b(llmperf):
    llmperf.measure(SimulatedBackend())
"""


@pytest.fixture
def project(project, monkeypatch):
    for name in ("SLOW", "SLOW_PREFILL"):
        monkeypatch.delenv(name, raising=False)
    project.makepyfile(test_x=ENGINE)
    return project


@pytest.fixture
def run(run):
    return run.with_flags("--llmperf-machine=m", "-o", "llmperf_memory_rtol=10", "--llmperf-runs=6")


def baseline(pytester):
    return pytester.path / "baselines" / "cpu" / "m" / "test_x.json"


def edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=1))


def assert_clean(result):
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text


def keep_runs(count):
    """Keep the first `count` runs of the one process that measured each batch size (unit "run", schema 3)."""
    def change(data):
        for entry in data["benchmarks"].values():
            assert entry["unit"] == "run"
            for bs, values in entry["values"].items():
                entry["values"][bs] = {m: runs[:count] for m, runs in values.items()}
                entry["batches"][bs]["runs_per_process"] = [count]
    return change


def test_a_baseline_of_one_run_is_refused_and_never_written(project, run, monkeypatch):
    """S3: a baseline of too few runs passed a 4.25x slowdown once; one run cannot give a verdict at all."""
    run("--llmperf-update").assert_outcomes(passed=2)
    edit(baseline(project), keep_runs(1))
    monkeypatch.setenv("SLOW", "4.25")
    monkeypatch.setenv("SLOW_PREFILL", "4.25")
    result = run("-k", "test_a")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*baseline *test_x.json: entry 'test_a', batch size 1: the baseline holds 1 run; the "
                                 "gate needs at least 2 to estimate their spread. Re-record it: pytest "
                                 "test_x.py::test_a *--llmperf-update*"])
    assert_clean(result)
    before = baseline(project).read_text()
    update = run("-k", "test_a", "--llmperf-update", "--llmperf-runs=1")
    update.assert_outcomes(failed=1)
    update.stdout.fnmatch_lines(["*not written to *test_x.json: entry 'test_a', batch size 1: the baseline holds 1 "
                                 "run*Record more runs (runs=, --llmperf-runs)*"])
    assert baseline(project).read_text() == before


def test_a_baseline_of_two_runs_says_it_limits_the_verdict(project, run, monkeypatch):
    run("--llmperf-update").assert_outcomes(passed=2)
    edit(baseline(project), keep_runs(2))
    monkeypatch.setenv("SLOW", "4.25")
    monkeypatch.setenv("SLOW_PREFILL", "4.25")
    result = run("-k", "test_a")
    result.assert_outcomes(failed=1)  # never a pass
    assert "pass " not in "".join(line for line in result.stdout.lines if line.startswith("| test_a"))
    assert ("the baseline's 2 runs limit it: re-record it with more (runs= or --llmperf-runs, --llmperf-update)"
            in result.stdout.str())


def test_a_baseline_without_a_gated_metric_is_missing_it_not_passed(project, run, monkeypatch):
    """S4: a 2x decode slowdown passed, the baseline holding no decode values: 'ungated' rows only."""
    run("--llmperf-update").assert_outcomes(passed=2)

    def drop(data):
        values = data["benchmarks"]["test_a"]["values"]["1"]
        values.pop("decode_token_ms")
        values.pop("throughput_tokens_per_s")
    edit(baseline(project), drop)
    monkeypatch.setenv("SLOW", "2")
    result = run("-k", "test_a")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*decode_token_ms at batch size 1: missing: the baseline holds no values of it (recorded before it was gated, "
        "or edited): not compared*",
        "*Record the baseline again, with every batch size and metric the test gates: pytest test_x.py::test_a "
        "*--llmperf-update*",
        "*judged 0 of 1 benchmarks (1 missing: the baseline lacks gated metrics)*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # not failing when missing is left out of --llmperf-fail-on, but said
    lenient = run("-k", "test_a", "--llmperf-fail-on=regressed")
    lenient.assert_outcomes(passed=1)
    assert "missing, not failing (missing is not in --llmperf-fail-on)" in lenient.stdout.str()


def test_an_update_keeps_the_fields_it_does_not_know(project, run):
    """S5: an update dropped a top-level 'notes' and an entry's 'comment' without a word."""
    run("--llmperf-update").assert_outcomes(passed=2)

    def annotate(data):
        data["notes"] = "recorded on the quiet runner"
        data["benchmarks"]["test_a"]["comment"] = "decode is slow on purpose"
        data["benchmarks"]["test_a"]["batches"]["1"]["reviewed"] = "yes"
        data["benchmarks"]["test_b"]["comment"] = "untouched"
    edit(baseline(project), annotate)
    run("-k", "test_a", "--llmperf-update").assert_outcomes(passed=1)  # test_a re-recorded, test_b kept
    data = json.loads(baseline(project).read_text())
    assert data["notes"] == "recorded on the quiet runner"
    assert data["benchmarks"]["test_a"]["comment"] == "decode is slow on purpose"
    assert data["benchmarks"]["test_a"]["batches"]["1"]["reviewed"] == "yes"
    assert data["benchmarks"]["test_b"]["comment"] == "untouched"
    run().assert_outcomes(passed=2)  # and the gate reads it


def merged_with_both_copies(path, change):
    """The file as a merge that kept both sides' entry of test_a leaves it: the original, then `change`d."""
    text = path.read_text()
    data = json.loads(text)
    other = json.loads(json.dumps(data["benchmarks"]["test_a"]))
    change(other)
    head = '  "test_a": {'
    assert text.count(head) == 1
    path.write_text(text.replace(head, f'  "test_a": {json.dumps(other)},\n{head}'))


def test_a_baseline_that_gives_an_entry_twice_is_refused_naming_the_file_and_the_key(project, run, monkeypatch):
    """Issue 39, case 10: a bad merge left test_a's entry twice; the last copy won in silence, here one recorded
    twice as slow, so a 2x slowdown passed."""
    run("--llmperf-update").assert_outcomes(passed=2)

    def slower(entry):
        for metrics in entry["values"].values():
            metrics["decode_token_ms"] = [2 * v for v in metrics["decode_token_ms"]]
            metrics["throughput_tokens_per_s"] = [v / 2 for v in metrics["throughput_tokens_per_s"]]
    merged_with_both_copies(baseline(project), slower)
    merged = baseline(project).read_text()
    assert list(json.loads(merged)["benchmarks"]) == ["test_a", "test_b"]  # what json.loads makes of it
    monkeypatch.setenv("SLOW", "2")
    result = run()
    result.assert_outcomes(failed=2)  # every entry of the file: it cannot be used
    result.stdout.fnmatch_lines([f"*baseline file {baseline(project)}: the key 'test_a' under 'benchmarks' is given "
                                 "twice (a merge that kept both sides?); a JSON reader keeps the last copy in silence. "
                                 "Remove all but one copy by hand, or move the file away and re-record it with "
                                 "--llmperf-update; the file was left as it is*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    run("--llmperf-update").assert_outcomes(failed=2)  # never overwritten: a person chooses the copy
    assert baseline(project).read_text() == merged
    assert_clean(result)


def test_a_baseline_file_without_its_benchmarks_is_refused_not_read_as_holding_none(project, run):
    """A file that exists but lost its 'benchmarks' (a merge or a hand edit that renamed it) read as holding no
    baselines: 'no baseline for test_a ... Create it with --llmperf-update', and that update kept the renamed
    object beside the new one."""
    run("--llmperf-update").assert_outcomes(passed=2)
    edit(baseline(project), lambda data: data.update(benchmark=data.pop("benchmarks")))
    broken = baseline(project).read_text()
    result = run("--llmperf-fail-on=regressed")
    result.assert_outcomes(failed=2)  # an unusable file fails whatever --llmperf-fail-on says
    result.stdout.fnmatch_lines([f"*baseline file {baseline(project)} is malformed (it has no 'benchmarks'). Fix it "
                                 "from version control*"])
    assert "no baseline for test_a" not in result.stdout.str()
    run("--llmperf-update").assert_outcomes(failed=2)
    assert baseline(project).read_text() == broken
    assert_clean(result)


def test_a_key_given_twice_deep_in_a_baseline_is_found_with_its_path():
    from pytest_llmperf.judge.baseline_layout import DuplicateKey, parse

    text = '{"benchmarks": {"t": {"values": {"1": {"prefill_ms": [1.0], "prefill_ms": [2.0]}}}}, "x": [{}, {"a": 1, "a": 2}]}'
    with pytest.raises(DuplicateKey) as found:
        parse(text)
    assert found.value.path == ("benchmarks", "t", "values", "1", "prefill_ms")
    assert "the key 'prefill_ms' under 'benchmarks' > 't' > 'values' > '1' is given twice" in str(found.value)
    with pytest.raises(DuplicateKey) as found:
        parse('{"x": [{}, {"a": 1, "a": 2}]}')
    assert found.value.path == ("x", "[1]", "a")
    with pytest.raises(DuplicateKey, match="the key 'a' at the top is given twice"):
        parse('{"a": 1, "a": 1}')
    assert parse('{"a": {"b": [1, {"c": 2}]}, "b": {"b": 1}}') == {"a": {"b": [1, {"c": 2}]}, "b": {"b": 1}}


def test_a_baseline_that_links_to_nothing_is_refused_and_nothing_is_created_there(project, run, tmp_path):
    """S6: an update created the link's target, outside the repository, and its directory."""
    run("--llmperf-update").assert_outcomes(passed=2)
    path = baseline(project)
    path.unlink()
    elsewhere = tmp_path / "outside" / "dir" / "x.json"
    path.symlink_to(elsewhere)
    for args in ((), ("--llmperf-update",)):
        result = run(*args)
        result.assert_outcomes(failed=2)
        result.stdout.fnmatch_lines([f"*baseline file {path} is a symbolic link to {elsewhere}, which does not exist. "
                                     "Fix the link, or remove it and record the baselines with --llmperf-update*"])
        assert_clean(result)
    assert not (tmp_path / "outside").exists()


def test_a_read_only_baseline_is_not_replaced(project, run):
    """S7: a 0444 baseline was replaced on update (its mode kept) without a word."""
    run("--llmperf-update").assert_outcomes(passed=2)
    path = baseline(project)
    path.chmod(0o444)
    before = path.read_text()
    result = run("--llmperf-update", "-k", "test_a")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*baseline file not written: {path} is read-only (mode 0444), so it was not "
                                 f"replaced. Make it writable (chmod u+w {path})*"])
    assert path.read_text() == before
    run("-k", "test_a").assert_outcomes(passed=1)  # gating reads it as ever


def test_temporary_files_a_killed_write_left_are_removed_and_said(project, run):
    """L2: SIGKILL mid-write left .NAME.json.<random>.tmp for good (the stale .lock was already removed)."""
    run("--llmperf-update").assert_outcomes(passed=2)
    left_baseline = baseline(project).parent / ".test_x.json.k1ll3d_x.tmp"
    left_report = project.path / "reports" / ".cpu.json.k1ll3d_y.tmp"
    stale_lock = baseline(project).parent / ".test_x.json.lock"
    unrelated = baseline(project).parent / ".other.json.tmp"
    for path in (left_baseline, left_report, stale_lock, unrelated):
        path.write_text("half")
    result = run("--llmperf-update", "-k", "test_a")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*removed 1 temporary file(s) that an interrupted session left in *reports: "
                                 ".cpu.json.k1ll3d_y.tmp*",
                                 f"*removed {left_baseline}: a temporary file that an interrupted "
                                 "baseline write left*"])
    assert not left_baseline.exists() and not left_report.exists() and not stale_lock.exists()
    assert unrelated.exists()  # not a name of ours


SLOW_REPORTS = """
import time
import pytest_llmperf.report.stored as stored

_update = stored.update_report

def slow_update(path, document):  # widen the window between reading the report and writing it back
    found = _update(path, document)
    time.sleep(1.5)
    return found

stored.update_report = slow_update
"""


def test_two_sessions_ending_at_once_keep_both_in_the_report(project):
    """D1: two sessions over one report directory, each kept only its own tests in 3 of 10 tries; both exit 0."""
    project.makeconftest(SLOW_REPORTS)
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--llmperf-device=cpu", "--llmperf-machine=m",
            "--llmperf-max-load=inf", "--llmperf-update", "-q"]
    env = {**os.environ, "PYTEST_ADDOPTS": "--llmperf-processes=1"}
    sessions = [subprocess.Popen([*args, "-k", name], cwd=project.path, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT) for name in ("test_a", "test_b")]
    for session in sessions:
        out, _ = session.communicate(timeout=300)
        assert session.returncode == 0, out.decode()
    report = json.loads((project.path / "reports" / "cpu.json").read_text())
    assert sorted(b["key"] for b in report["benchmarks"]) == ["test_a", "test_b"]
    markdown = (project.path / "reports" / "cpu.md").read_text()
    assert "test_a" in markdown and "test_b" in markdown
    assert sorted(json.loads(baseline(project).read_text())["benchmarks"]) == ["test_a", "test_b"]
    assert not [p.name for p in (project.path / "reports").iterdir() if p.name.startswith(".")]
