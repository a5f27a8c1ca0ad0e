"""Outputs unchanged: the generated token ids are stored beside the timings and a change of them is named.

Unit tests of judge/outputs.py, the baseline round trip, and the gate through pytester on the simulated
engine (stored baselines and A/B) and on the embedded tiny Llama with a conftest that perturbs its logits.
"""

import json

import pytest

from pytest_llmperf.judge import outputs
from pytest_llmperf.judge.verdicts import Verdict
from pytest_llmperf.judge.baselines import BaselineEntry, BaselineError, BaselineStore
from pytest_llmperf.measure.records import BatchResult, RunSample


def sample(ids, texts=None):
    return RunSample(batch_size=len(ids), token_times_ns=[[1, 2]] * len(ids), end_to_end_ns=2, output_ids=ids,
                     output_texts=texts)


def test_digest_covers_every_id_and_the_order_of_sequences():
    assert outputs.digest([[1, 2], [3, 4]]) == outputs.digest([[1, 2], [3, 4]])
    assert outputs.digest([[1, 2], [3, 4]]) != outputs.digest([[3, 4], [1, 2]])
    assert outputs.digest([[1, 2]]) != outputs.digest([[1, 3]])
    assert outputs.digest([[12]]) != outputs.digest([[1, 2]])


def test_runs_that_agree_give_the_batch_outputs_and_runs_that_differ_are_counted():
    same = outputs.observed([sample([[1, 2], [1, 2]]), sample([[1, 2], [1, 2]])])
    assert same.distinct == 1 and same.outputs.tokens == ((1, 2), (1, 2))
    varied = outputs.observed([sample([[1, 2]]), sample([[1, 3]]), sample([[1, 4]])])
    assert varied.outputs is None and varied.distinct == 3
    assert outputs.observed([RunSample(batch_size=1, token_times_ns=[[1]], end_to_end_ns=1)]) is None


def test_the_difference_names_the_sequence_the_position_both_ids_and_both_texts():
    was = outputs.Outputs(((5, 6, 7), (5, 6, 7)), ("a b c", "a b c"))
    now = outputs.Outputs(((5, 6, 7), (5, 9, 7)), ("a b c", "a x c"))
    assert outputs.difference(was, was) is None
    assert outputs.difference(was, now) == ("sequence 1 differs first at generated token 1 (id 6 -> 9); "
                                            "baseline 'a b c', now 'a x c'")
    shorter = outputs.Outputs(((5, 6), (5, 6, 7)))
    assert "at generated token 2 (id 7 -> none)" in outputs.difference(was, shorter)


def test_check_says_changed_or_varies_and_nothing_when_either_side_has_no_outputs():
    was = outputs.Outputs(((1, 2),), ("x",))
    assert outputs.check(was, outputs.observed([sample([[1, 2]])])) is None
    verdict, note = outputs.check(was, outputs.observed([sample([[1, 3]], ["y"])]), "HEAD (abc)")
    assert verdict == Verdict.CHANGED and note.startswith("outputs changed from HEAD (abc): sequence 0 differs")
    verdict, note = outputs.check(was, outputs.observed([sample([[1, 3]]), sample([[1, 2]])]))
    assert verdict == Verdict.VARIES and "2 distinct" in note and "not compared" in note
    assert outputs.check(None, outputs.observed([sample([[1, 2]])])) is None
    with_ids = [BatchResult(1, samples=[sample([[1, 2]])])]
    assert outputs.unchecked({}, with_ids) and not outputs.unchecked({1: was}, with_ids)
    assert not outputs.unchecked({}, [BatchResult(1, samples=[RunSample(1, [[1]], 1)])])
    assert outputs.check(was, None) is None


def test_a_baseline_keeps_the_digest_of_each_batchs_outputs_and_reads_it_back(tmp_path):
    store = BaselineStore(tmp_path, "cpu")
    batches = [BatchResult(1, samples=[sample([[7, 8]], ["p q"])] * 2),
               BatchResult(2, samples=[sample([[7, 8], [7, 8]]), sample([[7, 8], [7, 9]])])]  # runs disagree
    entry = BaselineEntry("t", {1: {"e2e_ms": [1.0, 1.1]}, 2: {"e2e_ms": [1.0, 1.1]}},
                          outputs={bs: o.digest for bs, o in outputs.outputs_by_batch(batches).items()}, unit="run")
    assert set(entry.outputs) == {1}  # nondeterministic outputs are not stored: nothing to hold a change against
    path = store.write("tests/test_x.py", entry)
    assert json.loads(path.read_text())["benchmarks"]["t"]["batches"]["1"]["outputs"] == outputs.digest([[7, 8]])
    assert BaselineStore(tmp_path, "cpu").get("tests/test_x.py", "t").outputs == {1: outputs.digest([[7, 8]])}


def test_a_stored_digest_is_compared_and_a_change_names_both_digests_and_the_new_text():
    was = outputs.digest([[7, 8]])
    assert outputs.check(was, outputs.observed([sample([[7, 8]], ["p q"])])) is None
    verdict, note = outputs.check(was, outputs.observed([sample([[7, 9]], ["p r"])]))
    assert verdict == Verdict.CHANGED
    assert note == (f"outputs changed from the baseline (its digest {was}, now {outputs.digest([[7, 9]])}); "
                    "sequence 0 now reads 'p r'")


@pytest.mark.parametrize("stored", [{"digest": "sha256:x", "tokens": ["7 8"]}, "md5:abc", 12])
def test_stored_outputs_that_are_not_a_digest_are_an_error_naming_the_file_and_entry(tmp_path, stored):
    store = BaselineStore(tmp_path, "cpu")
    path = store.write("tests/test_x.py", BaselineEntry("t", {1: {"e2e_ms": [1.0]}}, outputs={1: "sha256:ab"},
                                                        unit="run"))
    data = json.loads(path.read_text())
    data["benchmarks"]["t"]["batches"]["1"]["outputs"] = stored
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError, match=r"test_x.json: entry .t., batch size 1: outputs .* is not a digest"):
        BaselineStore(tmp_path, "cpu").get("tests/test_x.py", "t")


# -- through the plugin, on the simulated engine -------------------------------------------------------------

ENGINE = """
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1, 2], decode_length=6, runs=5, warmups=0, max_runs=5{marker})
def test_engine(llmperf):
    changed = os.environ.get("CHANGED_FROM")
    llmperf.measure(SimulatedBackend(seed=1, noise=0.005, changed_from=int(changed) if changed else None))
"""


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.delenv("CHANGED_FROM", raising=False)
    pytester.makeini("[pytest]\n")
    return pytester


def gate(pytester, *args):
    # Memory is not what these tests judge: the peak RSS of pytester's in-process runs grows by ~16 MiB once the
    # first run's reports have imported matplotlib, which -o llmperf_memory_rtol=1 tolerates. The rewrite warning
    # (the plugin imported before pytester's run) is counted as a warning when this file runs alone.
    return pytester.runpytest("--llmperf-device=cpu", "--llmperf-machine=m", "-p", "no:cacheprovider",
                              "--llmperf-alpha=0.05", "--llmperf-max-load=inf", "-o", "llmperf_memory_rtol=1",
                              "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


def test_changed_outputs_fail_naming_the_first_differing_position_and_unchanged_ones_pass(project, monkeypatch):
    project.makepyfile(test_engine=ENGINE.format(marker=""))
    gate(project, "--llmperf-update").assert_outcomes(passed=1)
    gate(project).assert_outcomes(passed=1)
    monkeypatch.setenv("CHANGED_FROM", "3")
    result = gate(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*test_engine: batch size 1: outputs changed from the baseline (its digest sha256:*, now sha256:*); "
        "sequence 0 now reads 't100 t101 t102 t104 t105 t106'*",
        "*If the new outputs are intended, update the baseline: pytest *--llmperf-update*--llmperf-outputs=warn*",
        "*| outputs *| 1 *| changed: outputs changed from the baseline*", "1 outputs changed"])


@pytest.mark.parametrize(("how", "expect"), [(("--llmperf-outputs=warn",), "warn"), ((), "marker-warn"),
                                             (("--llmperf-outputs=off",), "off")])
def test_outputs_warn_or_off_do_not_fail(project, monkeypatch, how, expect):
    project.makepyfile(test_engine=ENGINE.format(marker=', outputs="warn"' if expect == "marker-warn" else ""))
    gate(project, "--llmperf-update").assert_outcomes(passed=1)
    monkeypatch.setenv("CHANGED_FROM", "0")
    result = gate(project, *how)
    if expect == "off":
        result.assert_outcomes(passed=1)
        assert "outputs changed" not in result.stdout.str()
    else:
        result.assert_outcomes(passed=1, warnings=1)
        result.stdout.fnmatch_lines(["*outputs changed from the baseline (its digest *); sequence 0 now reads "
                                     "'*(not failing: outputs=warn)*"])


def test_a_bad_outputs_setting_names_the_option_or_the_marker(project):
    project.makepyfile(test_engine=ENGINE.format(marker=', outputs="strict"'))
    result = gate(project, "--llmperf-update")
    result.assert_outcomes(errors=1)  # at setup, as every invalid marker keyword
    result.stdout.fnmatch_lines(["*outputs='strict' is not valid: expected one of 'fail', 'warn', 'off'*"])
    result = gate(project, "--llmperf-outputs=sometimes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value for --llmperf-outputs: expected one of fail, warn, off*"])
