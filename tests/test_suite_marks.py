"""The suite's own sorting (tests/conftest.py): a test is slow by the names its own code uses (pytest's rule), one that
starts its process through a helper says so with `@pytest.mark.slow`, and a test left fast that starts a process
anyway fails, naming the fix."""

import multiprocessing
import os
import subprocess
import sys

import pytest

from tests import conftest


def _starts_git():
    subprocess.run(["git", "--version"], check=True)  # never called: read, not run


def _starts_git_in_a_nested_function():
    def inner():
        return subprocess.Popen(["git", "--version"])

    return inner


def _calls_a_helper_that_starts_git():
    return _starts_git()


def _spawns(function):
    return conftest.SPAWNS.intersection(conftest._names(function.__code__))


def test_a_test_is_slow_by_the_names_its_own_code_uses_nested_functions_included():
    assert _spawns(_starts_git) == {"subprocess"}
    assert _spawns(_starts_git_in_a_nested_function) == {"subprocess", "Popen"}


def test_a_helper_that_starts_a_process_is_not_followed_its_test_is_marked():
    assert not _spawns(_calls_a_helper_that_starts_git)


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
        with pytest.raises(conftest.StartedAProcess, match=r"t\.py::test_x starts a process .*: mark it @pytest\.mark\.slow"):
            start()
    assert (subprocess.Popen._execute_child, os.fork) == before  # put back as it was

