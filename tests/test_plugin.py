"""The plugin end to end through pytester, on the simulated engine (deterministic slowdowns)."""

import json

import pytest

from pytest_llmperf.judge.baseline_layout import machine_slug
from pytest_llmperf.judge.fingerprint import cpu_identity
from pytest_llmperf.orchestrate.options import OPTIONS

ENGINE_TEST = """
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.fixture
def engine():
    return SimulatedBackend(seed=int(os.environ.get("SIM_SEED", "0")),
                            prefill_slowdown=float(os.environ.get("SIM_PREFILL", "1")),
                            decode_slowdown=float(os.environ.get("SIM_DECODE", "1")),
                            fail_at={int(b): "boom" for b in os.environ.get("SIM_FAIL_AT", "").split(",") if b})

@pytest.mark.llmperf(batch_sizes=[1, 2, 4], runs=10, warmups=0)
def test_engine(llmperf, engine):
    llmperf.measure(engine)
"""


@pytest.fixture
def project(pytester, monkeypatch):
    for name in ("SIM_SEED", "SIM_PREFILL", "SIM_DECODE", "SIM_FAIL_AT", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=ENGINE_TEST)
    return pytester


@pytest.fixture
def run(run):
    return run.with_flags("--llmperf-max-load=1000", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def machine_dir(pytester):
    """This machine's cpu baselines (judge/baseline_layout.py: one set per machine on the cpu target)."""
    return pytester.path / "baselines" / "cpu" / machine_slug(cpu_identity())


def baseline_file(pytester):
    return machine_dir(pytester) / "test_engine.json"


def test_whole_lifecycle_missing_update_unchanged_slower_update(project, run, monkeypatch):
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*no baseline for test_engine in *baselines/cpu/{machine_slug(cpu_identity())}/"
                                 "test_engine.json (device cpu)*",
                                 "*--llmperf-device=cpu --llmperf-max-load=1000 --llmperf-update*"])
    assert not baseline_file(project).exists()

    run("--llmperf-update").assert_outcomes(passed=1)
    stored = json.loads(baseline_file(project).read_text())
    assert stored["schema_version"] == 3 and stored["device"] == "cpu"
    entry = stored["benchmarks"]["test_engine"]
    assert entry["unit"] == "run" and entry["batches"]["4"]["runs_per_process"] == [10]  # one process
    assert len(entry["values"]["4"]["prefill_ms"]) == 10  # its runs

    monkeypatch.setenv("SIM_SEED", "1")
    result = run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= llmperf: cpu =*", "1 passed"])

    monkeypatch.setenv("SIM_SEED", "2")
    monkeypatch.setenv("SIM_DECODE", "1.2")
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*decode_token_ms (decode) at batch size 1 regressed: baseline median*ratio 1.1*"])
    assert "prefill_ms (prefill) at batch" not in result.stdout.str()
    assert result.ret == 1

    monkeypatch.setenv("SIM_DECODE", "1.0")
    monkeypatch.setenv("SIM_PREFILL", "1.2")
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*prefill_ms (prefill) at batch size*regressed*"])

    run("--llmperf-update").assert_outcomes(passed=1)
    run().assert_outcomes(passed=1)


def test_update_missing_writes_only_what_is_missing(project, run):
    project.makepyfile(test_other=ENGINE_TEST.replace("test_engine(", "test_other("))
    run("--llmperf-update", "test_engine.py").assert_outcomes(passed=1)
    before = baseline_file(project).read_bytes()
    run("--llmperf-update-missing").assert_outcomes(passed=2)
    assert baseline_file(project).read_bytes() == before
    assert (machine_dir(project) / "test_other.json").exists()


def test_update_keeps_entries_of_tests_not_selected(project, run):
    project.makepyfile(test_engine=ENGINE_TEST + ENGINE_TEST.split("@pytest.mark.llmperf")[1].join(
        ["\n@pytest.mark.llmperf", ""]).replace("def test_engine(", "def test_second("))
    run("--llmperf-update").assert_outcomes(passed=2)
    run("--llmperf-update", "-k", "test_second").assert_outcomes(passed=1, deselected=1)
    assert set(json.loads(baseline_file(project).read_text())["benchmarks"]) == {"test_engine", "test_second"}


def test_failing_batch_is_recorded_and_the_sweep_goes_on(project, run, monkeypatch):
    monkeypatch.setenv("SIM_FAIL_AT", "2")
    result = run("--llmperf-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*batch size 2 failed: RuntimeError: boom*"])
    report = (project.path / "reports" / "cpu.md").read_text()
    assert "| Prefill        | 1          |" in report and "| 4 " in report and "NaN ms" in report
    data = json.loads((project.path / "reports" / "cpu.json").read_text())
    statuses = [b["status"] for b in data["benchmarks"][0]["batches"]]
    assert statuses == ["ok", "error", "ok"]
    assert not baseline_file(project).exists()  # a broken measurement is never stored as the new normal


def test_reports_hold_seed_tables_per_run_values_and_fingerprint(project, run, monkeypatch, tmp_path):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    run("--llmperf-update").assert_outcomes(passed=1)
    md = (project.path / "reports" / "cpu.md").read_text()
    for line in ("| Parameter ", "| Step           | Batch Size | Average", "| Decode (token) |",
                 "| Decode (total) |", "tokens/secs", "p99 needs at least 100 runs", "## Verdicts"):
        assert line in md
    data = json.loads((project.path / "reports" / "cpu.json").read_text())
    assert data["percentile_method"] == "linear"
    assert {"cpu_model", "ram_gb", "gpus", "torch", "python", "git"} <= set(data["fingerprint"])
    runs = data["benchmarks"][0]["batches"][0]["runs"]
    assert len(runs) == 10 and "prefill_ms" in runs[0]["values"] and runs[0]["tokens"] == 8
    assert "decode_steps_ns" not in runs[0]  # the raw timings stay out of the report (report/stored.py)
    assert "llmperf: cpu" in summary.read_text()


def test_marker_devices_skip_with_a_reason_naming_both(project, run):
    project.makepyfile(test_gpu="""
        import pytest
        @pytest.mark.llmperf(devices=["a100"])
        def test_on_a100(llmperf):
            raise AssertionError("must not run on cpu")
    """)
    result = run("-rs", "test_gpu.py")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*llmperf: runs on a100; the current device is cpu*"])


def test_unknown_marker_keyword_is_rejected(project, run):
    project.makepyfile(test_typo="""
        import pytest
        @pytest.mark.llmperf(batchsize=[1])
        def test_typo(llmperf):
            pass
    """)
    result = run("test_typo.py")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unknown keyword(s) batchsize; known: batch_sizes*"])


def test_help_lists_every_option_and_ini_key(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines([f"*{option.cli}*" for option in OPTIONS if not option.expert])
    result.stdout.fnmatch_lines([f"  {option.ini} (*" for option in OPTIONS])
    assert not any(f"{option.cli}=" in line for line in result.stdout.lines for option in OPTIONS if option.expert)
    assert len([option for option in OPTIONS if not option.expert]) <= 30  # issue 48: what a user changes per run


def test_an_expert_knob_typed_as_a_flag_is_refused_naming_its_ini_key(project, run):
    result = run("--llmperf-warmups=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-warmups is an ini key now: `-o llmperf_warmups=0` for one run, or "
                                 "llmperf_warmups in the ini file*"])


@pytest.mark.parametrize("style", ["pytest.ini", "tox.ini", "pyproject.toml"])
def test_ini_twins_from_each_config_format(pytester, style):
    lines = "llmperf_runs = 5\nllmperf_alpha = 0.05\nllmperf_device = h100\n"
    if style == "pyproject.toml":
        pytester.makepyprojecttoml("[tool.pytest.ini_options]\n" + lines.replace("= 5", '= "5"')
                                   .replace("= 0.05", '= "0.05"').replace("= h100", '= "h100"'))
    elif style == "tox.ini":
        pytester.makefile(".ini", tox="[pytest]\n" + lines)
    else:
        pytester.makeini("[pytest]\n" + lines)
    result = pytester.runpytest("--co")
    result.stdout.fnmatch_lines(["llmperf: device=h100 (given), mode=gate, runs=5, warmups=1, max_runs=30, "
                                 "alpha=0.05*"])


def test_precedence_marker_over_cli_over_ini(project, run, addopts):
    project.makeini("[pytest]\nllmperf_runs = 3\nllmperf_warmups = 2\n")
    addopts("--llmperf-runs=4", "-o", "llmperf_warmups=0")  # PYTEST_ADDOPTS: before the command line's own
    result = run("--llmperf-runs=5", "--co")
    result.stdout.fnmatch_lines(["*runs=5, warmups=0,*"])  # the command line beats PYTEST_ADDOPTS; -o beats the ini
    run("--llmperf-runs=5", "--llmperf-update").assert_outcomes(passed=1)
    stored = json.loads(baseline_file(project).read_text())["benchmarks"]["test_engine"]
    assert stored["scenario"]["runs"] == 10  # the marker's runs=10 beats the CLI


def test_bad_option_value_is_a_usage_error_naming_the_option(project, run, monkeypatch):
    result = run("--llmperf-alpha=2")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*llmperf: bad value for --llmperf-alpha: expected a number in (0, 1)*"])
    project.makeini("[pytest]\nllmperf_runs = zero\n")
    result = run()
    result.stderr.fnmatch_lines(["*bad value for ini option llmperf_runs in *tox.ini: expected an integer >= 1*"])


def test_xdist_refuses_timed_tests_with_a_clear_message(project, run):
    pytest.importorskip("xdist")
    result = run("-n", "1")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*timed benchmark tests must not run under pytest-xdist*-p no:xdist*"])


def test_xdist_says_nothing_without_llmperf_tests(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = pytester.runpytest("-n", "1", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    header = ("llmperf: device", "llmperf: baselines", "llmperf: processes")
    assert not [line for line in result.stdout.lines if "llmperf: " in line and not line.startswith(header)]


def test_results_join_pytest_benchmark_json(project, run):
    pytest.importorskip("pytest_benchmark")
    out = project.path / "benchmark.json"
    run("--llmperf-update", f"--benchmark-json={out}").assert_outcomes(passed=1)
    names = [b["name"] for b in json.loads(out.read_text())["benchmarks"]]
    assert "test_engine[bs=1]:prefill_ms" in names and "test_engine[bs=4]:decode_token_ms" in names


def test_reports_and_baselines_go_beside_the_config_when_run_from_a_subdirectory(project, run, monkeypatch):
    (project.path / "sub").mkdir()
    monkeypatch.chdir(project.path / "sub")
    run("--llmperf-update", str(project.path / "test_engine.py")).assert_outcomes(passed=1)
    assert (project.path / "reports" / "cpu.md").exists() and (project.path / "baselines").is_dir()
    assert not (project.path / "sub" / "reports").exists()
