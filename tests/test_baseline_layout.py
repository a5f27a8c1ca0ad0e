"""Per-machine baselines (one set per machine on the cpu target), names that stay inside their directories,
and entries of tests that no longer exist."""

import json
import re

import pytest

from pytest_llmperf.judge.baseline_layout import check_name, machine_slug, stale_keys

from .test_plugin import ENGINE_TEST, baseline_file, machine_dir, project, run  # noqa: F401  (fixture)


def test_machine_slug_is_readable_and_tells_hosts_behind_one_name_apart():
    epyc = {"cpu_model": "AMD EPYC 9R14 96-Core Processor",
            "cpu_signature": "vendor_id=AuthenticAMD cpu family=26 model=2 stepping=1",
            "cpu_isa": ["avx2", "avx512f", "avx512_bf16"]}
    assert machine_slug(epyc) == "amd-epyc-9r14-f26-m2-s1-avx512bf16"
    assert machine_slug({**epyc, "cpu_isa": ["avx2"]}) == "amd-epyc-9r14-f26-m2-s1-avx2"
    xeon = {"cpu_model": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
            "cpu_signature": "vendor_id=GenuineIntel cpu family=6 model=106 stepping=6", "cpu_isa": ["avx2"]}
    assert machine_slug(xeon) == "intel-xeon-platinum-8375c-f6-m106-s6-avx2"
    assert machine_slug({"cpu_model": "", "cpu_signature": "aarch64", "cpu_isa": []}) == "machine"
    assert check_name(machine_slug(xeon)) == machine_slug(xeon)


@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "..", ".hidden", "a/b", "", "x" * 65])
@pytest.mark.parametrize("option", ["device", "machine"])
def test_a_device_or_machine_name_that_is_a_path_is_refused(project, name, option):
    result = project.runpytest("-p", "no:cacheprovider", f"--llmperf-{option}={name}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*bad value for --llmperf-{option}: *is not a plain name*"])
    assert not (project.path / "baselines").exists() and not (project.path / "reports").exists()


def test_each_machine_keeps_its_own_set_and_is_compared_only_with_it(project, run):
    laptop = project.path / "baselines" / "cpu" / "laptop" / "test_engine.json"
    run("--llmperf-machine=laptop", "--llmperf-update").assert_outcomes(passed=1)
    before = laptop.read_bytes()
    assert json.loads(before)["machine"] == "laptop"

    # The runner has no set yet: refused, not compared (another machine's set is no baseline for it), saying
    # whose sets exist and how to record its own; --llmperf-fail-on decides whether that fails the job.
    result = run("--llmperf-machine=runner")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*1 refused*"])
    text = " ".join(result.stdout.str().split())
    assert "this machine (runner) has no baselines for it yet; the sets of laptop under" in text
    assert "are compared only on their own machines" in text
    assert re.search(r"pytest '?test_engine.py::test_engine'? --llmperf-device=cpu "
                     r".*--llmperf-machine=runner.* --llmperf-update",
                     text)  # the hint repeats the options given (orchestrate/options.py)
    # Following the hint records the runner's set, leaves the laptop's alone, and then gates.
    run("--llmperf-machine=runner", "--llmperf-update").assert_outcomes(passed=1)
    assert laptop.read_bytes() == before
    run("--llmperf-machine=runner").assert_outcomes(passed=1)
    # Without --llmperf-machine, the cpu target's set is this CPU's own.
    result = run()
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines([f"*no baseline for test_engine in {baseline_file(project)}*laptop, runner*"])
    run("--llmperf-update").assert_outcomes(passed=1)
    assert baseline_file(project).exists() and laptop.read_bytes() == before


def test_the_header_shows_this_machines_set(project, run):
    result = run("--llmperf-machine=ci-1", "--co")
    result.stdout.fnmatch_lines([f"llmperf: baselines={project.path / 'baselines' / 'cpu' / 'ci-1'}, reports=*"])


def test_a_file_of_the_layout_before_per_machine_sets_is_named(project, run):
    run("--llmperf-update").assert_outcomes(passed=1)
    old = project.path / "baselines" / "cpu" / "test_engine.json"
    baseline_file(project).rename(old)
    result = run()
    result.assert_outcomes(failed=1)
    text = " ".join(result.stdout.str().split())
    assert f"{old} is in the layout from before per-machine baselines and is not read" in text
    run("--llmperf-update").assert_outcomes(passed=1)
    run().assert_outcomes(passed=1)


def test_stale_keys_keep_named_measurements_of_existing_tests():
    stored = ["test_a", "test_a::variant", "TestC::test_b[x]", "test_gone", "test_gone::v", "test_a2"]
    assert stale_keys(stored, {"test_a", "TestC::test_b[x]"}) == ["test_a2", "test_gone", "test_gone::v"]


TWO_TESTS = ENGINE_TEST + """
@pytest.mark.llmperf(batch_sizes=[1], runs=10, warmups=0)
def test_second(llmperf, engine):
    llmperf.measure(engine)
"""


def test_entries_of_tests_that_no_longer_exist_are_reported_and_pruned_by_a_whole_module_update(project, run):
    project.makepyfile(test_engine=TWO_TESTS)
    run("--llmperf-update").assert_outcomes(passed=2)
    project.makepyfile(test_engine=ENGINE_TEST + "\ndef test_plain():\n    pass\n")  # test_second was deleted
    path = baseline_file(project)
    result = run()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"stale baseline entries in {path} (their tests no longer exist in test_engine.py): "
                                 "test_second. Remove them with: pytest test_engine.py --llmperf-device=cpu "
                                 "--llmperf-update (the whole module, no -k)"])
    # A partial selection neither reports nor prunes: the other tests were not looked at.
    result = run("test_engine.py::test_engine", "--llmperf-update")
    assert "stale baseline" not in result.stdout.str()
    run("--llmperf-update", "-k", "not plain").assert_outcomes(passed=1)  # test_plain deselected
    assert "test_second" in json.loads(path.read_text())["benchmarks"]
    # The whole module updated: pruned, and said so.
    result = run("--llmperf-update", "test_engine.py")
    result.stdout.fnmatch_lines([f"pruned stale baseline entries from {path} (their tests no longer exist): "
                                 "test_second"])
    assert list(json.loads(path.read_text())["benchmarks"]) == ["test_engine"]
    assert "stale" not in run().stdout.str()
