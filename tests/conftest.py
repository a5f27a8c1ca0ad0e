"""The suite's shared fixtures, and which of its tests are slow (tox -e fast runs the others: docs/development.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import functools
import importlib
import importlib.util
import inspect
import os
import subprocess
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

import pytest_llmperf

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


# -- which tests are slow, and the fast ones first (as pytest's own testing/conftest.py) --------------------------
#
# A test is `slow` when it starts an inner pytest session (it uses pytester) or a process. Which processes it starts
# is read from its code: the names that the test, its fixtures and the functions and classes of this suite and of
# the package they name refer to. `tox -e fast` runs the others, and `_no_processes` below makes sure they start
# none: a test marked fast that starts a process fails, naming what to do.

# Fixtures whose use makes a test slow: a pytest session run inside the test. A test slow for another reason (seconds
# of work in this process) says so itself: `pytest.mark.slow`.
SLOW_FIXTURES = frozenset({"pytester", "testdir"})
# Names whose mention means a process: subprocess.run/Popen, os.fork/posix_spawn/popen, multiprocessing, pytester's
# subprocess runs, asyncio's subprocesses. (Not `system`: platform.system() is no process; os.system is caught below.)
SPAWNS = frozenset({
    "subprocess", "Popen", "check_output", "check_call", "fork", "forkpty", "posix_spawn", "posix_spawnp", "popen",
    "multiprocessing", "ProcessPoolExecutor", "create_subprocess_exec", "create_subprocess_shell",
    "runpytest_subprocess", "spawn", "spawn_pytest",
})
_HERE = Path(__file__).resolve().parent
_FOLLOWED = (str(_HERE), str(Path(pytest_llmperf.__file__).resolve().parent))


def _followed(obj: object) -> bool:
    code = getattr(obj, "__code__", None)
    return code is not None and code.co_filename.startswith(_FOLLOWED)


_ALWAYS = ("__init__", "__post_init__", "__new__", "__call__", "__enter__", "__exit__", "__iter__", "__next__")


def _methods(cls: type, named: Iterable[str]) -> Iterator[object]:
    """The methods of a class of ours that a call may reach: construction, calls, and those named in the code."""
    for klass in cls.__mro__:
        for name, member in vars(klass).items():
            if name in _ALWAYS or name in named:
                member = getattr(member, "__func__", member)  # staticmethod, classmethod
                yield from (part for part in (member, getattr(member, "fget", None)) if _followed(part))


def _imported_inside(code: types.CodeType, package: str) -> dict[str, object]:
    """What the imports inside a function bind (the package imports its heavy parts where they are used:
    `from .uv_runner import find_uv`), for those of our modules that import here."""
    bound: dict[str, object] = {}
    instructions = list(dis.get_instructions(code))
    module: types.ModuleType | None = None
    for at, instruction in enumerate(instructions):
        if instruction.opname == "IMPORT_NAME":
            level = instructions[at - 2].argval if at >= 2 else 0
            name = "." * (level if isinstance(level, int) else 0) + str(instruction.argval)
            try:
                module = importlib.import_module(importlib.util.resolve_name(name, package) if level else name)
            except Exception:  # an optional library not installed here, or one whose import fails
                module = None
            if module is not None and str(getattr(module, "__file__", "")).startswith(_FOLLOWED):
                bound.update(vars(module))
        elif instruction.opname == "IMPORT_FROM" and module is not None:
            bound[str(instruction.argval)] = getattr(module, str(instruction.argval), None)
    return bound


@functools.cache
def _refers_to(func: Any) -> tuple[frozenset[str], tuple[object, ...], tuple[type, ...]]:
    """The names a function's code refers to, and the functions and classes of ours among them."""
    scope = dict(func.__globals__)
    for value in list(scope.values()):  # `server_helpers.run_inner`: a name in a module of ours
        if isinstance(value, types.ModuleType) and str(getattr(value, "__file__", "")).startswith(_FOLLOWED):
            scope.update(vars(value))
    names: set[str] = set()
    codes = [func.__code__]
    while codes:
        code = codes.pop()
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        names.update(code.co_names)
        scope.update(_imported_inside(code, func.__globals__.get("__package__") or ""))
    # A decorated function (contextlib.contextmanager, functools.wraps): the function it wraps.
    values = [inspect.unwrap(scope[n]) if callable(scope.get(n)) else scope.get(n) for n in names]
    functions = [value for value in values if _followed(value)]
    for cell in func.__closure__ or ():  # a decorated function: the function it wraps
        with contextlib.suppress(ValueError):
            if _followed(cell.cell_contents):
                functions.append(cell.cell_contents)
    classes = tuple(scope[n] for n in names if isinstance(scope.get(n), type))
    return frozenset(names), tuple(functions), classes


def _mentions(start: Iterable[object]) -> set[str]:
    """Every name the given functions refer to, and the functions and classes of this suite and of the package
    they name, transitively (a class: the methods its users name)."""
    names: set[str] = set()
    todo = [f for f in start if _followed(f)]
    seen: set[object] = set()
    classes: set[type] = set()
    while todo:
        while todo:
            func = todo.pop()
            if func in seen:
                continue
            seen.add(func)
            named, functions, their_classes = _refers_to(func)
            names |= named
            todo.extend(functions)
            classes.update(their_classes)
        todo = [m for cls in classes for m in _methods(cls, names) if m not in seen]
    return names


def _fixture_functions(item: pytest.Item) -> list[object]:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return [fixturedef.func for fixturedefs in defs for fixturedef in fixturedefs]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    """Mark `slow` the tests that run pytest sessions or start processes; run the others
    first, then the slow ones in this process, then those that start processes. (A wrapper, so that `-m` sees the
    marks.)"""
    fast, slow, processes = [], [], []
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and _mentions([function, *_fixture_functions(item)]) & SPAWNS:
            processes.append(item)
        elif SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.get_closest_marker("slow"):
            slow.append(item)
        else:
            fast.append(item)
            continue
        item.add_marker(pytest.mark.slow)
    items[:] = fast + slow + processes
    return (yield)


class StartedAProcess(Exception):
    """A test not marked slow started a process or a pytest session."""


@contextlib.contextmanager
def _no_processes(nodeid: str) -> Iterator[None]:
    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise StartedAProcess(
            f"{nodeid} is not marked slow but starts a process or a pytest session: tests/conftest.py marks a test "
            "slow by the names its code refers to; add the name it calls to SPAWNS, or mark it pytest.mark.slow"
        )

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
