"""Bad baseline input: each a clear error naming the file and the fix; nothing overwritten or lost."""

import json

import pytest

from pytest_llmperf.judge.baselines import BaselineEntry, BaselineError, BaselineStore

from .test_plugin import ENGINE_TEST, baseline_file, run


@pytest.fixture
def recorded(pytester, run, monkeypatch):
    for name in ("SIM_SEED", "SIM_PREFILL", "SIM_DECODE", "SIM_FAIL_AT"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=ENGINE_TEST)
    run("--llmperf-update").assert_outcomes(passed=1)
    return pytester


def edit_baseline(pytester, change):
    """Apply `change` to the stored baseline document of test_engine."""
    path = baseline_file(pytester)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("update", [False, True], ids=["gate", "update"])
def test_corrupt_json_is_named_and_left_as_it_was(recorded, run, update):
    path = baseline_file(recorded)
    path.write_text('{"schema_version": 1, "device": "cpu", "benchmarks": {')
    before = path.read_bytes()
    result = run(*(["--llmperf-update"] if update else []))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*baseline file {path} is not valid JSON*git checkout -- {path}*"])
    assert path.read_bytes() == before


def test_unknown_schema_version(recorded, run):
    edit_baseline(recorded, lambda d: d.update(schema_version=99))
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*has schema_version 99; this pytest-llmperf reads 3. Upgrade pytest-llmperf*"])


def test_file_for_another_device(recorded, run):
    edit_baseline(recorded, lambda d: d.update(device="a100"))
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*is for device 'a100', but it lies under the directory of device 'cpu'. Move it*"
                                 "or move it away and record this device's own*never overwrites a file it cannot use*"])
    # Following the hint does not loop: --llmperf-update refuses too, and the file is kept.
    before = baseline_file(recorded).read_bytes()
    result = run("--llmperf-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*is for device 'a100'*"])
    assert baseline_file(recorded).read_bytes() == before


def test_unwritable_baseline_directory(recorded, run):
    blocker = recorded.path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    result = run("--llmperf-update", f"--llmperf-baseline-dir={blocker}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot write baseline file*not-a-dir*point --llmperf-baseline-dir elsewhere*"])
    assert blocker.read_text() == "a file where a directory should be"


def test_baseline_from_another_gpu_is_refused_with_both_names(recorded, run):
    edit_baseline(recorded, lambda d: d["benchmarks"]["test_engine"]["fingerprint"].update(
        gpus=[{"name": "NVIDIA A100-SXM4-80GB", "driver": "550"}]))
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*was measured on GPU 'NVIDIA A100-SXM4-80GB', this machine has 'no GPU'; "
                                 "not compared*"])


def test_baseline_from_another_cpu_warns_and_counts_as_refused(recorded, run):
    edit_baseline(recorded, lambda d: d["benchmarks"]["test_engine"]["fingerprint"].update(
        cpu_model="Some Other CPU", torch="0.0.1"))
    result = run()
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*was measured on CPU 'Some Other CPU [[]*not compared*", "*1 refused*",
                                 "*software drift since the baselines: torch 0.0.1 -> *"])


# Two real hosts behind one "AMD EPYC" name (Zen 3, AVX2 only; Zen 4, AVX-512): whichever this machine is
# not stands for the other host, so the test holds on either of them.
OTHER_HOSTS = (("vendor_id=AuthenticAMD cpu family=25 model=1 stepping=1", ["avx2"]),
               ("vendor_id=AuthenticAMD cpu family=25 model=17 stepping=1", ["avx2", "avx512f", "avx512_bf16"]))


def test_baseline_from_a_cpu_with_the_same_name_but_other_isa_is_refused(recorded, run):
    # A VM reports "AMD EPYC" for hosts of different generations; the signature and ISA tell them apart.
    recorded_on = json.loads(baseline_file(recorded).read_text())["benchmarks"]["test_engine"]["fingerprint"]
    signature, isa = next(host for host in OTHER_HOSTS if host[0] != recorded_on["cpu_signature"])
    edit_baseline(recorded, lambda d: d["benchmarks"]["test_engine"]["fingerprint"].update(
        cpu_signature=signature, cpu_isa=isa))
    result = run()
    result.assert_outcomes(passed=1, warnings=1)
    described = f"{signature}; {' '.join(isa)}"
    result.stdout.fnmatch_lines([f"*was measured on CPU '* [[]{described}[]]', this machine has *not compared*",
                                 "*1 refused*"])


def test_baseline_without_a_cpu_signature_is_not_compared(recorded, run):
    edit_baseline(recorded, lambda d: [d["benchmarks"]["test_engine"]["fingerprint"].pop(k)
                                       for k in ("cpu_signature", "cpu_isa")])
    result = run()
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*no CPU signature recorded*not compared*", "*1 refused*"])


def test_write_is_atomic_and_sorted(tmp_path):
    store = BaselineStore(tmp_path, "cpu")
    for key in ("b", "a"):
        store.write("tests/test_x.py", BaselineEntry(key, {1: {"prefill_ms": [1.0, 2.0]}}, unit="run"))
    path = tmp_path / "cpu" / "tests" / "test_x.json"
    text = path.read_text()
    assert list(json.loads(text)["benchmarks"]) == ["a", "b"]
    assert [p.name for p in path.parent.iterdir()] == ["test_x.json"]  # no temporary file left behind
    path.write_text("garbage")
    with pytest.raises(BaselineError):
        BaselineStore(tmp_path, "cpu").write("tests/test_x.py", BaselineEntry("c", {}))
    assert path.read_text() == "garbage"


# Schema 3 (what the gate tests), and schema-1 files (schema 2: tests/test_baseline_schema.py).

def test_schema_3_entry_round_trip_and_layout(tmp_path):
    entry = BaselineEntry("k", {2: {"prefill_ms": [2.0, 4.5], "hit_rate": [0.0, 0.5]}}, counts={2: [3, 2]},
                          errors={8: "oom: out of memory"}, foreign_load={2: 0.0312345}, outputs={2: "sha256:ab"})
    assert entry.process_values(2) == {"prefill_ms": [2.0, 4.5], "hit_rate": [0.0, 0.5]}
    store = BaselineStore(tmp_path, "cpu", "m1")
    path = store.write("t.py", entry)
    assert path == tmp_path / "cpu" / "m1" / "t.json"
    data = json.loads(path.read_text())
    assert data["schema_version"] == 3 and data["device"] == "cpu" and data["machine"] == "m1"
    stored = data["benchmarks"]["k"]
    assert stored["batches"] == {"2": {"runs_per_process": [3, 2], "foreign_load": 0.031, "outputs": "sha256:ab"}}
    assert stored["values"] == {"2": {"hit_rate": [0.0, 0.5], "prefill_ms": [2.0, 4.5]}}
    assert stored["unit"] == "process" and stored["errors"] == {"8": "oom: out of memory"}
    back = BaselineStore(tmp_path, "cpu", "m1").get("t.py", "k")
    assert (back.values, back.counts, back.errors, back.foreign_load, back.outputs) == (
        entry.values, entry.counts, entry.errors, {2: 0.031}, entry.outputs)


def test_a_baseline_measured_in_one_process_keeps_its_runs(tmp_path):
    entry = BaselineEntry("k", {1: {"prefill_ms": [3.0, 1.0, 2.0]}}, counts={1: [3]}, unit="run")
    assert entry.process_values(1) == {"prefill_ms": [2.0]}  # the history's one point per process
    BaselineStore(tmp_path, "cpu").write("t.py", entry)
    assert BaselineStore(tmp_path, "cpu").get("t.py", "k").values == {1: {"prefill_ms": [3.0, 1.0, 2.0]}}


def test_values_are_stored_with_6_significant_digits(tmp_path):
    store = BaselineStore(tmp_path, "cpu")
    store.write("t.py", BaselineEntry("k", {1: {"prefill_ms": [1 / 3]}}, unit="run"))
    assert BaselineStore(tmp_path, "cpu").get("t.py", "k").values[1]["prefill_ms"] == [0.333333]


SCHEMA_1 = {"schema_version": 1, "device": "cpu", "module": "test_engine.py", "benchmarks": {
    key: {"batches": {"1": {"prefill_ms": [1.0, 2.0]}}, "errors": {}, "foreign_load": {}, "fingerprint": {}}
    for key in ("test_engine", "test_gone", "test_other")}}


def test_a_schema_1_file_is_named_with_the_update_command_and_left_alone(recorded, run):
    path = baseline_file(recorded)
    path.write_text(json.dumps(SCHEMA_1))
    before = path.read_bytes()
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*baseline file {path} holds per-run values of one process (schema 1)*"
                                 "Re-record it on this machine: pytest test_engine.py --llmperf-device=cpu "
                                 "--llmperf-update*"])
    assert path.read_bytes() == before


def test_update_rewrites_a_schema_1_file_and_names_the_entries_it_dropped(recorded, run):
    path = baseline_file(recorded)
    path.write_text(json.dumps(SCHEMA_1))
    result = run("--llmperf-update")
    result.assert_outcomes(passed=1)
    data = json.loads(path.read_text())
    assert data["schema_version"] == 3 and list(data["benchmarks"]) == ["test_engine"]
    result.stdout.fnmatch_lines([f"*baseline file {path} was rewritten as schema 3*cannot be converted and were "
                                 "dropped: test_gone, test_other. Re-record them with: pytest test_engine.py*"])
    assert "test_engine," not in result.stdout.str()  # re-recorded: not dropped
    run().assert_outcomes(passed=1)


# Bad values: read (the file named, with entry, batch size and metric; nothing overwritten) ...

def _set_prefill(value):
    def change(data):
        data["benchmarks"]["test_engine"]["values"]["1"]["prefill_ms"] = value
    return change


def _rename_batch(data):
    for part in ("batches", "values"):
        found = data["benchmarks"]["test_engine"][part]
        found["-1"] = found.pop("1")


def _values(batch_size):
    return lambda d: d["benchmarks"]["test_engine"]["values"][batch_size]


BAD_VALUES = {
    "nan": (_set_prefill([float("nan")] * 10), "batch size 1, metric prefill_ms: value nan is not a finite number"),
    "infinity": (_set_prefill([float("inf")] * 10), "metric prefill_ms: value inf is not a finite number"),
    "zero": (_set_prefill([0.0] * 10), "metric prefill_ms: value 0.0 is not > 0 (a time must be positive)"),
    "negative": (_set_prefill([-5.0] * 10), "metric prefill_ms: value -5.0 is not > 0"),
    "boolean": (_set_prefill([True] * 10), "metric prefill_ms: value True is not a number"),
    "string": (_set_prefill(["5"] * 10), "metric prefill_ms: value '5' is not a number"),
    "empty": (_set_prefill([]), "metric prefill_ms: expected a non-empty list of values"),
    "nested list (schema 2 shape)": (_set_prefill([[1.0, 2.0]]), "metric prefill_ms: value [1.0, 2.0] is not a number"),
    "fewer values than runs": (_set_prefill([1.0, 2.0]), "metric prefill_ms: 2 values for runs_per_process [10] (unit "
                                                         "run): expected 10"),
    "no values": (lambda d: d["benchmarks"]["test_engine"]["values"].pop("1"), "batch size 1: no values"),
    "outputs not a digest": (lambda d: d["benchmarks"]["test_engine"]["batches"]["1"].update(outputs=[1, 2]),
                             "batch size 1: outputs [1, 2] is not a digest (sha256:...)"),
    "batch -1": (_rename_batch, "entry 'test_engine': batch size '-1' is not an integer >= 1"),
    "negative throughput": (lambda d: _values("2")(d).update(throughput_tokens_per_s=[-1.0] * 10),
                            "batch size 2, metric throughput_tokens_per_s: value -1.0 is not > 0 "
                            "(a throughput must be positive)"),
    "negative counter": (lambda d: _values("2")(d).update(hit_rate=[-0.5] * 10),
                         "metric hit_rate: value -0.5 is negative (a counter is >= 0)"),
    "bad foreign_load": (lambda d: d["benchmarks"]["test_engine"]["batches"]["1"].update(foreign_load=float("nan")),
                         "batch size 1: foreign_load nan is not a finite number"),
    "unit": (lambda d: d["benchmarks"]["test_engine"].update(unit="thread"), "unit 'thread' is not one of"),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
@pytest.mark.parametrize("update", [False, True], ids=["gate", "update"])
def test_a_bad_baseline_value_is_named_and_nothing_is_overwritten(recorded, run, case, update):
    change, message = BAD_VALUES[case]
    edit_baseline(recorded, change)
    path = baseline_file(recorded)
    before = path.read_bytes()
    result = run(*(["--llmperf-update"] if update else []))
    result.assert_outcomes(failed=1)
    text = " ".join(result.stdout.str().split())
    assert f"baseline file {path}: entry 'test_engine'" in text and message in text, text
    assert "Traceback" not in text and "INTERNALERROR" not in text
    assert path.read_bytes() == before


def test_a_zero_counter_is_a_valid_value(tmp_path):
    store = BaselineStore(tmp_path, "cpu")
    store.write("t.py", BaselineEntry("k", {1: {"hit_rate": [0.0, 0.0], "prefill_ms": [1.0, 1.5]}}, unit="run"))
    assert BaselineStore(tmp_path, "cpu").get("t.py", "k").values[1]["hit_rate"] == [0.0, 0.0]


# ... and before a write: an impossible measurement is never stored.

@pytest.mark.parametrize("values, message", [
    ({1: {"prefill_ms": [-2.0, 1.0]}}, "batch size 1, metric prefill_ms: value -2.0 is not > 0"),
    ({1: {"decode_token_ms": [float("nan")]}}, "metric decode_token_ms: value nan is not a finite number"),
    ({1: {"throughput_tokens_per_s": [float("inf")]}}, "value inf is not a finite number"),
    ({1: {"e2e_ms": [0.0]}}, "metric e2e_ms: value 0.0 is not > 0"),
    ({1: {"e2e_ms": []}}, "metric e2e_ms: expected a non-empty list"),
    ({0: {"e2e_ms": [1.0]}}, "batch size 0 is not an integer >= 1"),
], ids=["negative", "nan", "inf", "zero", "empty", "batch 0"])
def test_an_impossible_measurement_is_not_written(tmp_path, values, message):
    store = BaselineStore(tmp_path, "cpu")
    path = store.write("t.py", BaselineEntry("good", {1: {"e2e_ms": [1.0]}}))
    before = path.read_bytes()
    with pytest.raises(BaselineError, match="not written to .*t.json: entry 'bad'") as info:
        store.write("t.py", BaselineEntry("bad", values))
    assert message in str(info.value) and "The file is unchanged" in str(info.value)
    assert path.read_bytes() == before
