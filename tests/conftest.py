"""The suite's shared fixtures, and which of its tests are slow (tox -e fast runs the others: docs/development.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import subprocess
import types
from collections.abc import Iterator
from typing import NoReturn

import pytest

try:  # report/html.py imports matplotlib lazily; imported first inside a pytester in-process run, it is
    # dropped from sys.modules after that run and a second import mixes two copies of its classes
    import pytest_llmperf.report.plots  # noqa: F401
except ImportError:  # without the report extra the HTML page is skipped; its tests say so
    pass
# The statistics as well (scipy.stats, numpy.fft): the plugin imports them only when a campaign runs, and numpy's C
# modules refuse a second import in one process ("cannot load module more than once per process").
import pytest_llmperf.judge.procedure  # noqa: F401,E402
try:  # the same for torch, which --llmperf-instructions asks whether valgrind is supported: imported a second time
    # after a pytester run dropped it, its C extension fails ("SystemError: ... bad call flags", then a segfault)
    import torch  # noqa: F401
except ImportError:  # tox -e noextras
    pass
# And for what the backends import when used, which tests of the servers reach first inside a pytester run or
# outside it depending on the order a worker of xdist gets them in: httpx builds its map of httpcore's exceptions
# once, and after a run dropped httpcore a refused connection came out as a raw httpcore.ConnectError
# (test_server_requests then test_server_tgi::test_fixture_bad_url_option, in one process).
for _name in ("httpx", "httpcore", "aiohttp", "grpc", "transformers"):
    with contextlib.suppress(ImportError):
        importlib.import_module(_name)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    """Embedded models built once per test session, outside the user's cache."""
    import os

    cached = os.environ.get("LLMPERF_TEST_MODEL_CACHE")
    return cached if cached else str(tmp_path_factory.mktemp("models"))


@pytest.fixture(autouse=True)
def _measure_in_process(request, monkeypatch):
    """The suite's pytester runs measure in-process unless a test asks for worker processes
    (tests/test_workers.py): the default on the cpu target spawns workers, which these tests do not test. The
    history store of the environment that runs the suite (its one variable) is not theirs."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS when it starts: set it after
    monkeypatch.setenv("PYTEST_ADDOPTS", "--llmperf-processes=1")
    monkeypatch.delenv("LLMPERF_HISTORY", raising=False)


@pytest.fixture
def addopts(monkeypatch):
    """`addopts("--llmperf-cache-dir=DIR")`: options for every pytest this test starts, after the suite's."""

    def add(*args: str) -> None:
        monkeypatch.setenv("PYTEST_ADDOPTS", " ".join([os.environ.get("PYTEST_ADDOPTS", ""), *args]).strip())

    return add


@pytest.fixture
def project(pytester, monkeypatch):
    """A pytester project as a new user's is: no GitHub step summary inherited from the environment that runs the
    suite, an empty pytest.ini, measured in-process. A test file
    adds its own files by overriding it: `def project(project): project.makepyfile(...); return project`."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makeini("[pytest]\n")
    return pytester


# The flags nearly every pytester run of the plugin passes: the cpu target, no cache files in the project, and no
# refusal on a busy machine (the simulated engine's timings do not depend on the machine).
PLUGIN_FLAGS = ("--llmperf-device=cpu", "-p", "no:cacheprovider", "--llmperf-max-load=inf")


@dataclasses.dataclass(frozen=True)
class PluginRun:
    """pytest with the plugin on the test's pytester project: `run("--llmperf-update")`. A test file that needs other
    flags overrides the fixture: `def run(run): return run.with_flags("--llmperf-runs=6")`."""

    pytester: pytest.Pytester
    flags: tuple[str, ...] = PLUGIN_FLAGS

    def __call__(self, *args: str) -> pytest.RunResult:
        """In this process (pytester's in-process run)."""
        return self.pytester.runpytest(*self.flags, *args)

    def in_subprocess(self, *args: str, timeout: float | None = None) -> pytest.RunResult:
        """In a pytest process of its own."""
        return self.pytester.runpytest_subprocess(*self.flags, *args, timeout=timeout)

    def with_flags(self, *flags: str) -> PluginRun:
        """These flags too; a `--name=value` replaces the value of `--name` where the flags already give one."""
        kept = list(self.flags)
        for flag in flags:
            name = flag.partition("=")[0] + "="
            at = [i for i, old in enumerate(kept) if flag.startswith("--") and old.startswith(name)]
            if at:
                kept[at[0]] = flag
            else:
                kept.append(flag)
        return dataclasses.replace(self, flags=tuple(kept))

    def without(self, *names: str) -> PluginRun:
        """Without the flags for these options (`--llmperf-max-load`: the run reads the machine's load)."""
        for name in names:
            assert name.startswith("--") and any(f.partition("=")[0] == name for f in self.flags), name
        return dataclasses.replace(self, flags=tuple(f for f in self.flags if f.partition("=")[0] not in names))


@pytest.fixture
def run(pytester: pytest.Pytester) -> PluginRun:
    """Runs the plugin under pytester with the suite's usual flags (PLUGIN_FLAGS)."""
    return PluginRun(pytester)


# -- which tests are slow, and the fast ones first (pytest's own rule, its testing/conftest.py) ---------------------
#
# A test is `slow` when it runs a pytest session (it uses pytester) or starts a process, read from the names its own
# code uses (`co_names`). A test slow for another reason, or one that starts its process through a helper or a
# fixture, says so itself: `@pytest.mark.slow`. `tox -e fast` runs the others, and `_no_processes` below makes sure
# they start none: a test left fast that starts a process fails, naming the fix.
SLOW_FIXTURES = frozenset({"pytester", "testdir"})
SPAWNS = frozenset({
    "subprocess", "Popen", "check_output", "check_call", "fork", "posix_spawn", "multiprocessing",
    "ProcessPoolExecutor", "create_subprocess_exec", "runpytest_subprocess", "spawn",
})


def _names(code: types.CodeType) -> Iterator[str]:
    """The names a function's code uses, its nested functions' included."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    """Mark the slow tests and run the fast ones first (a wrapper, so that `-m` sees the marks)."""
    fast, slow = [], []
    for item in items:
        function = getattr(item, "function", None)
        if (
            SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            or item.get_closest_marker("slow")
            or (function is not None and SPAWNS.intersection(_names(function.__code__)))
        ):
            item.add_marker(pytest.mark.slow)
            slow.append(item)
        else:
            fast.append(item)
    items[:] = fast + slow
    return (yield)


class StartedAProcess(Exception):
    """A test not marked slow started a process or a pytest session."""


@contextlib.contextmanager
def _no_processes(nodeid: str) -> Iterator[None]:
    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise StartedAProcess(f"{nodeid} starts a process or a pytest session: mark it @pytest.mark.slow")

    import _posixsubprocess

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", refuse)  # subprocess.*, os.popen, asyncio
        patch.setattr(_posixsubprocess, "fork_exec", refuse)  # multiprocessing's spawn and forkserver
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            patch.setattr(os, name, refuse)
        patch.setattr(pytest.Pytester, "inline_run", refuse)
        patch.setattr(pytest, "main", refuse)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """A fast test starts no process (its fixtures included): the marking above is checked in every run."""
    if item.get_closest_marker("slow") is not None:
        return (yield)
    with _no_processes(item.nodeid):
        return (yield)
