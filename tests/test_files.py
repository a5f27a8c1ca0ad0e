"""pytest_llmperf/files.py and the baseline store under it: nothing lost, whatever interrupts or races."""

import json
import multiprocessing
import os
import stat

import pytest

from pytest_llmperf import files
from pytest_llmperf.judge.baselines import BaselineEntry, BaselineStore


def test_a_symlinked_file_stays_a_link_and_its_target_gets_the_text(tmp_path):
    target = tmp_path / "real" / "x.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "x.json"
    link.symlink_to(target)
    files.write_text_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o664])
def test_the_mode_of_an_existing_file_is_kept(tmp_path, mode):
    path = tmp_path / "x.json"
    path.write_text("old")
    path.chmod(mode)
    files.write_text_atomic(path, "new")
    assert stat.S_IMODE(path.stat().st_mode) == mode and path.read_text() == "new"


def test_a_new_file_gets_the_umask_default_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        files.write_text_atomic(tmp_path / "new.json", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, OSError, SystemExit])
def test_an_interrupted_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch, interrupt):
    path = tmp_path / "x.json"
    path.write_text("old")

    def replace(src, dst):
        raise interrupt()

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(interrupt):
        files.write_text_atomic(path, "new")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_strict_json_values():
    assert files.finite_or_null({"a": [1.0, float("nan")], "b": (float("inf"), -float("inf")), "c": "NaN"}) == {
        "a": [1.0, None], "b": [None, None], "c": "NaN"}


def test_the_lock_leaves_no_file_behind(tmp_path):
    path = tmp_path / "x.json"
    with files.locked(path):
        assert (tmp_path / ".x.json.lock").exists()
    assert list(tmp_path.iterdir()) == []


def _record(root, prefix, count, start):
    start.wait()
    store = BaselineStore(root, "cpu", "m")
    for i in range(count):
        store.write("benchmarks/test_x.py", BaselineEntry(f"{prefix}{i}", {1: {"prefill_ms": [1.0 + i]}}, unit="run"))


def test_two_updates_of_one_module_at_once_both_land(tmp_path):
    """Two processes (two `--llmperf-update` runs of different tests of one module) write 25 entries each
    into one file at the same time: every entry of both lands (without the lock, some are lost)."""
    context = multiprocessing.get_context("fork")
    start = context.Barrier(2)
    workers = [context.Process(target=_record, args=(tmp_path, prefix, 25, start)) for prefix in ("a", "b")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    data = json.loads((tmp_path / "cpu" / "m" / "benchmarks" / "test_x.json").read_text())
    assert sorted(data["benchmarks"]) == sorted(f"{p}{i}" for p in "ab" for i in range(25))
    assert sorted(p.name for p in (tmp_path / "cpu" / "m" / "benchmarks").iterdir()) == ["test_x.json"]


def test_a_baseline_that_is_a_symlink_is_written_through(tmp_path):
    store = BaselineStore(tmp_path / "baselines", "cpu", "m")
    shared = tmp_path / "shared.json"
    store.write("t.py", BaselineEntry("a", {1: {"e2e_ms": [1.0]}}, unit="run"))
    store.path_for("t.py").rename(shared)
    store.path_for("t.py").symlink_to(shared)
    shared.chmod(0o664)
    BaselineStore(tmp_path / "baselines", "cpu", "m").write("t.py",
                                                            BaselineEntry("b", {1: {"e2e_ms": [2.0]}}, unit="run"))
    assert store.path_for("t.py").is_symlink()
    assert sorted(json.loads(shared.read_text())["benchmarks"]) == ["a", "b"]
    assert stat.S_IMODE(shared.stat().st_mode) == 0o664


def test_a_script_opens_a_machines_set_by_its_directory(tmp_path):
    BaselineStore(tmp_path, "cpu", "m1").write("b/t.py", BaselineEntry("k", {1: {"e2e_ms": [1.0]}}, unit="run"))
    BaselineStore(tmp_path, "a100").write("b/t.py", BaselineEntry("k", {1: {"e2e_ms": [2.0]}}, unit="run"))
    assert BaselineStore.at(tmp_path / "cpu" / "m1").get("b/t.py", "k").values == {1: {"e2e_ms": [1.0]}}
    assert BaselineStore.at(tmp_path / "a100").get("b/t.py", "k").values == {1: {"e2e_ms": [2.0]}}
