"""The suite's own sorting (tests/conftest.py): a test is slow by what its code, its fixtures and the helpers they
call refer to, and a test left fast that starts a process anyway fails, naming the fix."""

import multiprocessing
import os
import subprocess
import sys

import pytest

from tests import conftest


def _starts_git():
    subprocess.run(["git", "--version"], check=True)  # never called: read, not run


def _calls_a_helper_that_starts_git():
    return _starts_git()


class _Server:
    def start(self):
        return subprocess.Popen([sys.executable, "-c", "pass"])

    def describe(self):
        return "a server"


def _starts_a_server():
    return _Server().start()


def _describes_a_server():
    return _Server().describe()


def _adds(a, b):
    return a + b


def test_a_test_is_slow_by_what_the_helpers_it_calls_refer_to():
    assert conftest._mentions([_calls_a_helper_that_starts_git]) & conftest.SPAWNS == {"subprocess"}
    assert not conftest._mentions([_adds]) & conftest.SPAWNS


def test_of_a_class_only_the_methods_a_test_names_count():
    assert conftest._mentions([_starts_a_server]) & conftest.SPAWNS == {"subprocess", "Popen"}
    assert not conftest._mentions([_describes_a_server]) & conftest.SPAWNS


@pytest.mark.parametrize("start", [
    lambda: subprocess.run([sys.executable, "-c", "pass"]),
    lambda: os.system("true"),
    lambda: os.fork(),
    lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    lambda: multiprocessing.get_context("forkserver").Process(target=print).start(),
], ids=["subprocess", "os.system", "os.fork", "multiprocessing spawn", "multiprocessing forkserver"])
def test_a_fast_test_that_starts_a_process_fails_naming_the_fix(start):
    before = subprocess.Popen._execute_child, os.fork
    with conftest._no_processes("t.py::test_x"):
        with pytest.raises(conftest.StartedAProcess, match=r"t\.py::test_x is not marked slow but starts a process"):
            start()
    assert (subprocess.Popen._execute_child, os.fork) == before  # put back as it was

