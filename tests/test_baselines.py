"""Bad baseline input: each a clear error naming the file and the fix; nothing overwritten or lost."""

import json

import pytest

from pytest_llmperf.judge.baselines import BaselineEntry, BaselineError, BaselineStore

from .test_plugin import ENGINE_TEST, baseline_file, run


@pytest.fixture
def recorded(pytester, monkeypatch):
    for name in ("SIM_SEED", "SIM_PREFILL", "SIM_DECODE", "SIM_FAIL_AT", "LLMPERF_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=ENGINE_TEST)
    run(pytester, "--llmperf-update").assert_outcomes(passed=1)
    return pytester


def edit_baseline(pytester, change):
    """Apply `change` to the stored baseline document of test_engine."""
    path = baseline_file(pytester)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("update", [False, True], ids=["gate", "update"])
def test_corrupt_json_is_named_and_left_as_it_was(recorded, update):
    path = baseline_file(recorded)
    path.write_text('{"schema_version": 1, "device": "cpu", "benchmarks": {')
    before = path.read_bytes()
    result = run(recorded, *(["--llmperf-update"] if update else []))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*baseline file {path} is not valid JSON*git checkout -- {path}*"])
    assert path.read_bytes() == before


def test_unknown_schema_version(recorded):
    edit_baseline(recorded, lambda d: d.update(schema_version=99))
    result = run(recorded)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*has schema_version 99; this pytest-llmperf reads 1. Upgrade pytest-llmperf*"])


def test_file_for_another_device(recorded):
    edit_baseline(recorded, lambda d: d.update(device="a100"))
    result = run(recorded)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*is for device 'a100', but it lies under the directory of device 'cpu'. Move it*"])


def test_unwritable_baseline_directory(recorded):
    blocker = recorded.path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    result = run(recorded, "--llmperf-update", f"--llmperf-baseline-dir={blocker}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot write baselines under*not-a-dir*point --llmperf-baseline-dir elsewhere*"])
    assert blocker.read_text() == "a file where a directory should be"


def test_baseline_from_another_gpu_is_refused_with_both_names(recorded):
    edit_baseline(recorded, lambda d: d["benchmarks"]["test_engine"]["fingerprint"].update(
        gpus=[{"name": "NVIDIA A100-SXM4-80GB", "driver": "550"}]))
    result = run(recorded)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*was measured on GPU 'NVIDIA A100-SXM4-80GB', this machine has 'no GPU'; not compared*"])


def test_baseline_from_another_cpu_warns_and_counts_as_refused(recorded):
    edit_baseline(recorded, lambda d: d["benchmarks"]["test_engine"]["fingerprint"].update(
        cpu_model="Some Other CPU", torch="0.0.1"))
    result = run(recorded)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*was measured on CPU 'Some Other CPU [[]*not compared*", "*1 refused*",
                                 "*software drift since the baselines: torch 0.0.1 -> *"])


def test_baseline_from_a_cpu_with_the_same_name_but_other_isa_is_refused(recorded):
    # A VM reports "AMD EPYC" for hosts of different generations; the ISA tells them apart.
    edit_baseline(recorded, lambda d: d["benchmarks"]["test_engine"]["fingerprint"].update(
        cpu_signature="vendor_id=AuthenticAMD cpu family=25 model=1 stepping=1", cpu_isa=["avx2"]))
    result = run(recorded)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*was measured on CPU '* [[]vendor_id=AuthenticAMD cpu family=25 model=1 stepping=1; "
                                 "avx2[]]', this machine has *not compared*", "*1 refused*"])


def test_baseline_without_a_cpu_signature_is_not_compared(recorded):
    edit_baseline(recorded, lambda d: [d["benchmarks"]["test_engine"]["fingerprint"].pop(k)
                                       for k in ("cpu_signature", "cpu_isa")])
    result = run(recorded)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*no CPU signature recorded*not compared*", "*1 refused*"])


def test_write_is_atomic_and_sorted(tmp_path):
    store = BaselineStore(tmp_path, "cpu")
    for key in ("b", "a"):
        store.write("tests/test_x.py", BaselineEntry(key, {1: {"prefill_ms": [1.0, 2.0]}}))
    path = tmp_path / "cpu" / "tests" / "test_x.json"
    text = path.read_text()
    assert list(json.loads(text)["benchmarks"]) == ["a", "b"]
    assert [p.name for p in path.parent.iterdir()] == ["test_x.json"]  # no temporary file left behind
    path.write_text("garbage")
    with pytest.raises(BaselineError):
        BaselineStore(tmp_path, "cpu").write("tests/test_x.py", BaselineEntry("c", {}))
    assert path.read_text() == "garbage"
