"""Each side's environment built by real uv, offline, from local wheels (pytest_llmperf/environments/): a uv.lock
project and a requirements project whose only change is fastlib 1.0 -> 2.0 (2.0 does 10% more work), and the cases
of the hostile round (issue 47) that got a slowdown through: a wheel rebuilt under its name, uv settings of an earlier
job, a cache entry that lost a file, a controller killed mid-build.

No index is reachable: uv runs with --offline, each project's wheels are its find-links, and the plugin's own
requirements come from wheels of this environment's distributions. uv's cache is one per module (UV_CACHE_DIR).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from pytest_llmperf.environments import cache
from pytest_llmperf.environments.build import build_side, find_uv
from pytest_llmperf.environments.inputs import detect
from pytest_llmperf.environments.installed import check_imported, probe
from pytest_llmperf.environments.plan import _cuda_note, prepare
from pytest_llmperf.environments.plugin_install import controller_version, plugin_wheel
from pytest_llmperf.environments.records import (
    BUILT, CACHE_HIT, CODE_ONLY, SHARED, BuildFailed, BuildSettings, CannotBuild, EnvironmentsError, SideEnvironment,
)  # fmt: skip
from tests.env_projects import (
    LOOPS, fastlib_wheel, requirements_project, run_in, uv_project, uv_workspace, workspace_with_a_library,
)  # fmt: skip

pytestmark = pytest.mark.slow  # real uv builds (all tests here but two, which are quick)

OFFLINE = BuildSettings(offline=True)


@pytest.fixture(scope="module", autouse=True)
def uv_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("UV_CACHE_DIR", str(tmp_path_factory.mktemp("uv-cache")))
        for name in [n for n in os.environ if n.startswith("UV_") and n != "UV_CACHE_DIR"]:
            patch.delenv(name)
        yield


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("envs")


@pytest.fixture(scope="module")
def bump_dirs(tmp_path_factory):
    """The bump's own caches, one per kind: other tests here build the same fastlib projects into env_dir (a key is
    the files' bytes), and under xdist one of them may run first, so that the bump's first build is a cache hit."""
    return {kind: tmp_path_factory.mktemp(f"envs-{kind.replace('.', '-')}") for kind in ("uv.lock", "requirements")}


@pytest.fixture(scope="module", params=["uv.lock", "requirements"])
def bump(request, tmp_path_factory, bump_dirs):
    """A pull request that changes only fastlib 1.0 -> 2.0; its environments built once for the module."""
    root = tmp_path_factory.mktemp(request.param.replace(".", "-"))
    make = uv_project if request.param == "uv.lock" else requirements_project
    detection = detect(make(root / "base", "1.0"), make(root / "head", "2.0"))
    return request.param, detection, prepare(detection, env_dir=bump_dirs[request.param], settings=OFFLINE)


def test_a_bump_builds_each_side_from_its_own_files_and_names_what_they_hold(bump, bump_dirs):
    kind, _, envs = bump
    env_dir = bump_dirs[kind]
    assert envs.per_side and envs.measured and (envs.base.how, envs.head.how) == (BUILT, BUILT)
    assert envs.base.recipe == ("uv.lock" if kind == "uv.lock" else "requirements.txt")
    for side, version in ((envs.base, "1.0"), (envs.head, "2.0")):
        assert side.python.startswith(str(env_dir)) and side.version("fastlib") == version
        assert side.version("pytest-llmperf") == controller_version()
        assert "demo" not in side.installed  # the project is imported from its checkout, never installed
        ran = run_in(side.python, "import fastlib, pytest_llmperf; print(fastlib.__version__, fastlib.LOOPS, "
                                  "pytest_llmperf.__version__)")  # fmt: skip
        assert ran == f"{version} {LOOPS[version]} {controller_version()}"
        assert json.loads((Path(side.directory) / cache.MARKER).read_text())["key"] == side.key
        assert side.pycache == f"{side.directory}/pycache"  # bytecode: written there by the workers' imports
    assert [str(c) for c in envs.changes] == ["fastlib 1.0 -> 2.0"]  # what they hold, not what the files say
    assert envs.summary_line().startswith("environments: per side (fastlib 1.0 -> 2.0; base built ")
    assert envs.summary_lines()[-1] == "  packages that differ (1): fastlib 1.0 -> 2.0"


def test_a_rerun_reuses_both_environments_from_the_cache(bump, bump_dirs):
    kind, detection, first = bump
    env_dir = bump_dirs[kind]
    again = prepare(detection, env_dir=env_dir, settings=OFFLINE)
    assert (again.base.how, again.head.how) == (CACHE_HIT, CACHE_HIT)
    assert (again.base.key, again.head.key) == (first.base.key, first.head.key)
    assert again.base.installed == first.base.installed and again.head.installed == first.head.installed
    assert again.base.findings == again.head.findings == ()


def test_a_worker_of_one_side_is_told_apart_from_the_other(bump):
    _, _, envs = bump
    code = ("import json, fastlib; from pytest_llmperf.environments.installed import imported_distributions; "
            "print(json.dumps(imported_distributions()))")  # fmt: skip
    imported = json.loads(run_in(envs.base.python, code))
    assert imported["fastlib"] == "1.0" and imported["pytest-llmperf"] == controller_version()
    assert check_imported(imported, envs.base) == ()
    assert check_imported(imported, envs.head) == ("fastlib 1.0 was imported; the head environment has 2.0",)


def test_a_base_python_is_checked_by_uv_against_each_sides_files(bump, tmp_path, monkeypatch):
    kind, detection, envs = bump
    # The head side runs this job's environment, which does not hold fastlib 2.0: not measured, so not a pass.
    with pytest.raises(CannotBuild) as raised:
        prepare(detection, base_python=envs.base.python, settings=OFFLINE)
    message = str(raised.value)
    assert f"the head side's interpreter {sys.executable} does not hold what " in message and "fastlib" in message
    assert "the base side's interpreter" not in message
    assert "--llmperf-compare-deps=code-only" in message and "--llmperf-base-python=PATH" not in message
    listed = prepare(detection, base_python=envs.base.python, mode="code-only", settings=OFFLINE)
    assert listed.base.findings == () and listed.base.version("fastlib") == "1.0"
    assert not listed.measured and "head side's interpreter" in listed.not_measured[0]
    # The hostile round's third case: a base interpreter holding the head's versions, in the default mode.
    monkeypatch.setattr(sys, "executable", envs.head.python)
    with pytest.raises(CannotBuild, match=rf"the base side's interpreter {envs.head.python} does not hold what "):
        prepare(detection, base_python=envs.head.python, settings=OFFLINE)
    bare = tmp_path / "bare"
    subprocess.run([find_uv().path, "venv", "-q", str(bare)], check=True)
    with pytest.raises(EnvironmentsError, match=r"has pytest-llmperf \(not installed\), this job runs .*pip install"):
        prepare(detection, base_python=str(cache.python_in(bare)))


def test_a_base_python_that_holds_the_base_sides_versions_passes_the_check(bump, monkeypatch):
    _, detection, envs = bump
    monkeypatch.setattr(sys, "executable", envs.head.python)  # as if the job ran in the head's environment
    checked = prepare(detection, base_python=envs.base.python, settings=OFFLINE)
    assert checked.measured and checked.base.findings == checked.head.findings == ()
    assert [str(c) for c in checked.changes] == ["fastlib 1.0 -> 2.0"]


def test_code_only_measures_nothing_new_and_says_so(bump, tmp_path):
    _, detection, _ = bump
    envs = prepare(detection, mode="code-only", uv=tmp_path / "no-uv", env_dir=tmp_path / "envs")
    assert (envs.base.how, envs.head.how) == (CODE_ONLY, CODE_ONLY) and not envs.per_side
    files = ", ".join(detection.files)
    assert envs.not_measured == (f"{files} differ (both sides ran this environment)",)
    assert envs.summary_line() == f"environments: DEPENDENCY CHANGES NOT MEASURED: {envs.not_measured[0]} [code-only]"
    assert not (tmp_path / "envs").exists()


def test_without_uv_the_job_cannot_pass_and_says_the_ways_out(bump, tmp_path):
    _, detection, _ = bump
    with pytest.raises(CannotBuild) as raised:
        prepare(detection, uv=tmp_path / "no-uv", env_dir=tmp_path / "envs")
    message = str(raised.value)
    assert f"dependency inputs that differ: {', '.join(detection.files)}" in message
    assert "--llmperf-base-python=PATH" in message and "--llmperf-compare-deps=code-only" in message
    assert "pip install uv" in message
    assert not (tmp_path / "envs").exists()


@pytest.fixture
def recorded_uv(tmp_path):
    """A uv that notes each run in a file, then runs the real one."""
    log, script = tmp_path / "uv-runs.log", tmp_path / "uv"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {find_uv().path} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, log


def test_unchanged_dependencies_start_no_uv_and_make_no_directory(tmp_path, recorded_uv):
    uv, log = recorded_uv
    base = requirements_project(uv_project(tmp_path / "base", "1.0"), "1.0")
    shutil.copytree(base, tmp_path / "head")
    envs = prepare(detect(base, tmp_path / "head"), uv=uv, env_dir=tmp_path / "envs")
    assert (envs.base.how, envs.head.how, envs.status) == (SHARED, SHARED, "unchanged")
    assert envs.summary_line() == "environments: shared (dependency files unchanged) [auto]"
    assert not log.exists() and not (tmp_path / "envs").exists()


def test_a_change_in_form_only_is_built_once_and_runs_shared(tmp_path, env_dir, recorded_uv):
    uv, log = recorded_uv
    base = requirements_project(tmp_path / "base", "1.0")
    head = requirements_project(tmp_path / "head", "1.0")
    (head / "requirements.txt").write_text("fastlib==1.0  # pinned\n\n--find-links wheels\n")
    envs = prepare(detect(base, head), uv=uv, env_dir=env_dir, settings=OFFLINE)
    assert (envs.base.how, envs.head.how, envs.status, envs.changes) == (SHARED, SHARED, "changed", ())
    assert envs.summary_line() == ("environments: shared (requirements.txt differ; both sides' environments hold the "
                                   "same packages) [auto]")  # fmt: skip
    assert 1 <= sum(line.startswith("venv") for line in log.read_text().splitlines()) <= 2  # the base: maybe cached


def test_build_mode_builds_equal_locks_twice_and_they_match(tmp_path, env_dir, recorded_uv):
    uv, log = recorded_uv
    base = uv_project(tmp_path / "base", "1.0")
    shutil.copytree(base, tmp_path / "head")
    envs = prepare(detect(base, tmp_path / "head"), mode="build", uv=uv, env_dir=env_dir, settings=OFFLINE)
    assert (envs.base.how, envs.head.how) == (BUILT, BUILT) and envs.per_side and envs.measured
    assert envs.base.key != envs.head.key and envs.changes == ()
    assert envs.base.installed == envs.head.installed and envs.base.version("fastlib") == "1.0"
    assert sum(line.startswith("sync --frozen") for line in log.read_text().splitlines()) == 2


def test_a_failed_build_names_its_side_and_the_command_and_leaves_nothing_half_built(tmp_path, env_dir):
    base = requirements_project(tmp_path / "base", "1.0")
    head = requirements_project(tmp_path / "head", "3.0")  # no fastlib 3.0 wheel, no index
    with pytest.raises(BuildFailed) as raised:
        prepare(detect(base, head), env_dir=env_dir, settings=OFFLINE)
    message = str(raised.value)
    assert "the head side's environment cannot be made" in message and "fastlib" in message.split("uv said:")[1]
    command = next(line.strip() for line in message.splitlines() if line.strip().startswith("cd "))
    assert command.startswith(f"cd {head} && {find_uv().path} pip install --python ")  # runnable as shown
    assert "--offline -r requirements.txt" in command
    assert "--llmperf-compare-deps=code-only" in message and "--llmperf-base-python" not in message
    left = [p for p in env_dir.iterdir() if not p.name.startswith(".") and not (p / cache.MARKER).exists()]
    assert left == []


def test_requirements_beside_project_dependencies_install_both(tmp_path, env_dir):
    # A package's own dependencies in pyproject.toml, its tools in requirements-dev.txt: both are what the project
    # runs with. Built from requirements-dev.txt alone, neither side had fastlib, and the bump measured nothing.
    roots = {}
    for side, version in (("base", "1.0"), ("head", "2.0")):
        root = roots[side] = uv_project(tmp_path / side, version, lock=False)
        (root / "requirements-dev.txt").write_text("--find-links wheels\n")
    envs = prepare(detect(roots["base"], roots["head"]), env_dir=env_dir, settings=OFFLINE)
    assert envs.base.recipe == "pyproject.toml requirements-dev.txt"
    assert [str(c) for c in envs.changes] == ["fastlib 1.0 -> 2.0"]


def test_a_uv_workspace_member_is_built_from_the_workspaces_lock(tmp_path, env_dir):
    # The member has a pyproject.toml (the same on both sides) and no lock of its own: uv sync in its directory takes
    # the workspace's uv.lock, which alone moved. Read at the member alone, the sides were "unchanged".
    base, head = uv_workspace(tmp_path / "base", "1.0"), uv_workspace(tmp_path / "head", "2.0")
    detection = detect(base, head)
    assert detection.base.paths() == ("../../pyproject.toml", "../../uv.lock", "pyproject.toml")
    assert detection.files == ("../../uv.lock",)
    envs = prepare(detection, env_dir=env_dir, settings=OFFLINE)
    assert envs.base.recipe == "uv.lock" and [str(c) for c in envs.changes] == ["fastlib 1.0 -> 2.0"]


def test_a_workspace_library_is_installed_as_its_side_had_it_not_linked_to_a_checkout(tmp_path, env_dir):
    # uv sync installs a workspace's other members editable: links into the checkout it ran in. The base side's
    # checkout is removed at the job's end while its environment stays cached; and a later job whose base side (the
    # merged pull request) reused the head's environment imported the library from the working tree: the next pull
    # request's code, on both sides. A change of the library alone was not even seen.
    base = workspace_with_a_library(tmp_path / "base", loops=100)
    head = workspace_with_a_library(tmp_path / "head", loops=200)
    detection = detect(base, head)
    assert detection.files == ("../lib",)  # the library's files, by content
    envs = prepare(detection, env_dir=env_dir, settings=OFFLINE)
    assert envs.per_side and [str(c) for c in envs.changes] == ["lib 0.1.0 -> 0.1.0 (other files)"]
    assert "bench" not in envs.head.installed  # the project itself: imported from its checkout
    shutil.rmtree(tmp_path / "base")  # the base side's worktree, removed at the job's end
    (head.parent / "lib" / "src" / "lib" / "__init__.py").write_text("LOOPS = 300\n")  # the working tree moves on
    loops = "import lib; print(lib.LOOPS)"
    assert (run_in(envs.base.python, loops), run_in(envs.head.python, loops)) == ("100", "200")
    merged = workspace_with_a_library(tmp_path / "merged", loops=200)  # a later job: the first one's head, merged
    later = prepare(detect(merged, head), env_dir=env_dir, settings=OFFLINE)
    assert (later.base.how, later.base.key, later.head.how) == (CACHE_HIT, envs.head.key, BUILT)
    assert (run_in(later.base.python, loops), run_in(later.head.python, loops)) == ("200", "300")  # uv's cache, too


def test_an_extra_named_by_the_option_is_installed_from_the_lock_or_the_pyproject(tmp_path, env_dir):
    # fastlib only in the project's `bench` extra: uv installs no extra unless asked (llmperf_env_extras). Without a
    # lock, an extras-only project was refused even with the option.
    for lock in (True, False):
        roots = {}
        for side, version in (("base", "1.0"), ("head", "2.0")):
            root = roots[side] = uv_project(tmp_path / str(lock) / side, version, lock=False)
            text = (root / "pyproject.toml").read_text()
            text = text.replace(f'dependencies = ["fastlib=={version}"]', "dependencies = []")
            (root / "pyproject.toml").write_text(text + f'\n[project.optional-dependencies]\nbench = ["fastlib=={version}"]\n')
            if lock:
                done = subprocess.run([find_uv().path, "lock", "--offline", "-q"], cwd=root, capture_output=True, text=True)
                assert done.returncode == 0, done.stderr
        chosen = BuildSettings(offline=True, extras=("bench",))
        envs = prepare(detect(roots["base"], roots["head"]), env_dir=env_dir, settings=chosen)
        assert envs.base.recipe == f"{'uv.lock' if lock else 'pyproject.toml'} --extra bench"
        assert [str(c) for c in envs.changes] == ["fastlib 1.0 -> 2.0"]


def test_a_requirements_file_with_a_byte_order_mark_is_built(tmp_path, env_dir):
    roots = [requirements_project(tmp_path / side, version) for side, version in (("base", "1.0"), ("head", "2.0"))]
    for root in roots:
        (root / "requirements.txt").write_bytes(b"\xef\xbb\xbf" + (root / "requirements.txt").read_bytes())
    envs = prepare(detect(*roots), env_dir=env_dir, settings=OFFLINE)
    assert [str(c) for c in envs.changes] == ["fastlib 1.0 -> 2.0"]


def test_a_cache_that_cannot_be_written_names_the_option_that_moves_it(tmp_path):
    base = requirements_project(tmp_path / "base", "1.0")
    head = requirements_project(tmp_path / "head", "2.0")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(CannotBuild) as raised:
        prepare(detect(base, head), env_dir=tmp_path / "a-file" / "envs", settings=OFFLINE)
    message = str(raised.value)
    assert "cannot be written" in message and "a-file" in message and "-o llmperf_env_dir=PATH" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_cache_is_used_for_reading(bump, bump_dirs):
    kind, detection, first = bump
    env_dir = bump_dirs[kind]
    env_dir.chmod(0o555)
    try:
        again = prepare(detection, env_dir=env_dir, settings=OFFLINE)
    finally:
        env_dir.chmod(0o755)
    assert (again.base.how, again.head.how) == (CACHE_HIT, CACHE_HIT)


def test_a_read_only_cache_is_used_for_reading_without_a_lock(bump, bump_dirs, monkeypatch):
    # As root nothing is read-only: what the job is told decides (os.access).
    kind, detection, first = bump
    env_dir = bump_dirs[kind]
    monkeypatch.setattr(cache, "writable", lambda root: False)
    monkeypatch.setattr(cache, "entry_lock", None)  # a read-only cache: no lock can be taken there
    again = prepare(detection, env_dir=env_dir, settings=OFFLINE)
    assert (again.base.how, again.head.how) == (CACHE_HIT, CACHE_HIT)
    other = requirements_project(env_dir.parent / "not-built", "1.0", wheels=("1.0",))
    with pytest.raises(CannotBuild, match="cannot be written, and it holds no usable environment for this side"):
        prepare(detect(detection.base.root, other), env_dir=env_dir, settings=OFFLINE)


def test_refused_files_fail_the_build_naming_their_export(tmp_path):
    base, head = tmp_path / "base", tmp_path / "head"
    for root, version in ((base, "1.0"), (head, "2.0")):
        root.mkdir()
        (root / "poetry.lock").write_text(f'[[package]]\nname = "fastlib"\nversion = "{version}"\n')
    with pytest.raises(CannotBuild, match=r"poetry.lock at .* cannot be built by uv(.|\n)*poetry export"):
        prepare(detect(base, head), env_dir=tmp_path / "envs")


def test_a_lock_of_another_tool_that_moved_beside_unchanged_requirements_is_a_note(tmp_path, env_dir):
    roots = [requirements_project(tmp_path / side, "1.0") for side in ("base", "head")]
    for root, version in zip(roots, ("1.0", "2.0")):
        (root / "poetry.lock").write_text(f'[[package]]\nname = "fastlib"\nversion = "{version}"\n')
    envs = prepare(detect(*roots), env_dir=env_dir, settings=OFFLINE)
    assert envs.base.how == SHARED and envs.notes == ("poetry.lock differ: not what the environments are built from",)


def test_a_requirement_uv_cannot_read_fails_with_uvs_words(tmp_path):
    base = requirements_project(tmp_path / "base", "1.0")
    head = requirements_project(tmp_path / "head", "1.0")
    (head / "requirements.txt").write_text("fastlib=1.0\n")
    with pytest.raises(BuildFailed, match=r"(?s)head side.*uv said:.*requirements\.txt"):
        prepare(detect(base, head), env_dir=tmp_path / "envs", settings=OFFLINE)


def test_a_python_version_edit_is_built_where_both_name_this_interpreter(tmp_path, env_dir):
    import platform

    roots = [requirements_project(tmp_path / side, "1.0") for side in ("base", "head")]
    (roots[0] / ".python-version").write_text(".".join(platform.python_version_tuple()[:2]) + "\n")
    (roots[1] / ".python-version").write_text(f"{platform.python_version()}\n")
    envs = prepare(detect(*roots), env_dir=env_dir, settings=OFFLINE)
    assert envs.base.how == SHARED and envs.files == (".python-version",)
    (roots[1] / ".python-version").write_text("2.7\n")
    with pytest.raises(CannotBuild, match=r"head side.*\.python-version names 2\.7; this job's Python is "):
        prepare(detect(*roots), env_dir=env_dir, settings=OFFLINE)


def test_a_base_side_that_asks_for_another_python_is_not_built_on_this_one(tmp_path, env_dir):
    base = uv_project(tmp_path / "base", "1.0", lock=False)
    head = uv_project(tmp_path / "head", "1.0", lock=False)
    text = (base / "pyproject.toml").read_text()
    (base / "pyproject.toml").write_text(text.replace('requires-python = ">=3.10"', 'requires-python = ">=3.99"'))
    with pytest.raises(CannotBuild) as raised:
        prepare(detect(base, head), env_dir=env_dir, settings=OFFLINE)
    assert "the base side's environment cannot be made: its pyproject.toml has requires-python >=3.99" in str(raised.value)
    assert "--llmperf-base-python=PATH" in str(raised.value)


def one_side(tmp_path, version="2.0", **more):
    inputs = detect(uv_project(tmp_path / "side", version), tmp_path / "side").head
    uv = find_uv()
    return lambda env_dir, copy=tmp_path.name: build_side(
        "head", inputs, base=probe(sys.executable, installed=False), uv=uv, env_dir=env_dir, settings=OFFLINE,
        plugin=plugin_wheel(env_dir / cache.WHEELS), copy=copy, **more)  # fmt: skip


def test_two_jobs_build_one_environment_once_and_one_that_lost_a_file_is_rebuilt_saying_why(tmp_path, env_dir):
    build, results = one_side(tmp_path), []
    threads = [threading.Thread(target=lambda: results.append(build(env_dir))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.how for r in results) == [BUILT, CACHE_HIT] and results[0].key == results[1].key
    site = next(Path(results[0].directory).glob("lib/python*/site-packages"))
    (site / "fastlib.py").unlink()  # a cached environment that lost a module: reused, it failed every job
    rebuilt = build(env_dir)
    assert rebuilt.how == BUILT and rebuilt.findings == (
        "rebuilt: its files changed since it was built (fastlib.py of fastlib 2.0)",)  # fmt: skip
    assert run_in(rebuilt.python, "import fastlib; print(fastlib.LOOPS)") == str(LOOPS["2.0"])
    shutil.rmtree(next(site.glob("fastlib-2.0.dist-info")))  # someone removed it since it was built
    assert build(env_dir).findings == ("rebuilt: what it holds changed since it was built (-fastlib 2.0)",)


def test_a_wheel_rebuilt_under_its_name_is_caught_by_what_the_environments_hold(tmp_path, env_dir):
    # The hostile round's first case: the same requirements text, a slower vendor/fastlib-1.0 wheel. Cached by that
    # text, the old build of both sides was reused, and the job passed.
    roots = []
    for side, loops in (("base", 200_000), ("head", 250_000)):
        root = tmp_path / side
        fastlib_wheel(root / "vendor", "1.0", loops=loops)
        (root / "requirements.txt").write_text("./vendor/fastlib-1.0-py3-none-any.whl\n")
        roots.append(root)
    envs = prepare(detect(*roots), env_dir=env_dir, settings=OFFLINE)
    assert envs.per_side and [str(c) for c in envs.changes] == ["fastlib 1.0 -> 1.0 (other files)"]
    assert run_in(envs.head.python, "import fastlib; print(fastlib.LOOPS)") == "250000"
    # Named with llmperf_compare_deps_paths too, as the round tried (and was refused): the same
    named = prepare(detect(*roots, ["vendor/*.whl"]), env_dir=env_dir, settings=OFFLINE)
    assert [str(c) for c in named.changes] == ["fastlib 1.0 -> 1.0 (other files)"]
    (roots[1] / "vendor" / "unused.whl").write_bytes(b"not a wheel any file names")  # named by nothing but the option
    with pytest.raises(CannotBuild, match=r"vendor/unused.whl differ and no build reads them"):
        prepare(detect(*roots, ["vendor/*.whl"]), env_dir=env_dir, settings=OFFLINE)


def test_uv_settings_of_an_earlier_job_do_not_decide_a_later_ones_environment(tmp_path, monkeypatch):
    # The hostile round's second case: a job run with UV_OVERRIDE=fastlib==1.0 built the "fastlib==2.0" environment
    # holding 1.0, and every later job reused it.
    roots = [requirements_project(tmp_path / side, version) for side, version in (("base", "1.0"), ("head", "2.0"))]
    (tmp_path / "override.txt").write_text("fastlib==1.0\n")
    with monkeypatch.context() as patch:
        patch.setenv("UV_OVERRIDE", str(tmp_path / "override.txt"))
        overridden = prepare(detect(*roots), env_dir=tmp_path / "envs", settings=OFFLINE)
    assert overridden.base.how == SHARED  # both hold 1.0, as that job asked
    later = prepare(detect(*roots), env_dir=tmp_path / "envs", settings=OFFLINE)
    assert [str(c) for c in later.changes] == ["fastlib 1.0 -> 2.0"]
    assert later.head.how == BUILT  # another key: not the environment the override built


def test_an_entry_that_no_longer_holds_what_the_side_asks_for_is_rebuilt(tmp_path, env_dir):
    build = one_side(tmp_path)
    first = build(env_dir)
    marker = Path(first.directory) / cache.MARKER
    subprocess.run([find_uv().path, "pip", "install", "-q", "--offline", "--python", first.python,
                    "--find-links", str(tmp_path / "side" / "wheels"), "fastlib==1.0"], check=True)  # fmt: skip
    recorded = json.loads(marker.read_text())
    recorded["installed"]["fastlib"] = "1.0"  # as if it had been built so: the record agrees, the side does not
    held = probe(first.python)
    recorded["contents"] = dict(held.contents)
    marker.write_text(json.dumps(recorded))
    again = build(env_dir)
    assert again.how == BUILT and again.findings[0].startswith("rebuilt: it does not hold what the side asks for (uv: ")
    assert "fastlib==2.0" in again.findings[0] and again.version("fastlib") == "2.0"


SLOW_BACKEND = '''
import os, time, zipfile
def build_wheel(directory, config_settings=None, metadata_directory=None):
    open(os.environ["SLOW_STARTED"], "w").close()
    time.sleep(60)
get_requires_for_build_wheel = lambda config_settings=None: []
'''


def test_a_controller_killed_mid_build_leaves_nothing_running_nor_half_built(tmp_path, env_dir):
    # The hostile round's last case: SIGKILL of the controller left uv and its children writing into the cache, and
    # the next job's build raced them. Here uv builds a local package whose build backend sleeps.
    package = tmp_path / "slowpkg"
    package.mkdir()
    (package / "backend.py").write_text(SLOW_BACKEND)
    (package / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                            'backend-path = ["."]\n[project]\nname = "slowpkg"\nversion = "1.0"\n')  # fmt: skip
    side = tmp_path / "side"
    side.mkdir()
    (side / "requirements.txt").write_text(f"slowpkg @ file://{package}\n")
    started, tag = tmp_path / "started", f"llmperf-test-{os.getpid()}-{time.time_ns()}"
    code = textwrap.dedent(f"""
        from pathlib import Path
        from pytest_llmperf.environments.inputs import detect
        from pytest_llmperf.environments.plan import prepare
        from pytest_llmperf.environments.records import BuildSettings
        prepare(detect({str(side)!r}, {str(side)!r}), mode="build", env_dir={str(env_dir)!r},
                settings=BuildSettings(offline=True))
    """)
    env = {**os.environ, "SLOW_STARTED": str(started), "LLMPERF_TEST_TAG": tag}
    controller = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline and controller.poll() is None:
        time.sleep(0.1)
    assert started.exists(), "the build backend never ran"
    controller.send_signal(signal.SIGKILL)
    controller.wait()

    def left() -> list[str]:
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("LLMPERF_TEST_TAG") == tag:
                    found.append(" ".join(proc.cmdline())[:120])
            except (psutil.Error, OSError):
                continue
        return found

    deadline = time.monotonic() + 15
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() == []
    half = [p for p in env_dir.iterdir() if not p.name.startswith(".") and not (p / cache.MARKER).exists()]
    for directory in half:  # its lock is free (no process of the killed build holds it): the next build takes it
        fd = os.open(directory.parent / f".{directory.name}.lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_bytecode_is_left_to_the_workers_unless_asked_and_then_compiled_alike_on_both_sides(tmp_path):
    base = requirements_project(tmp_path / "base", "1.0")
    head = requirements_project(tmp_path / "head", "2.0")
    for settings, compiled in ((OFFLINE, False), (BuildSettings(offline=True, compile_bytecode=True), True)):
        # a cache of its own: an import in another test's environment (without PYTHONDONTWRITEBYTECODE) writes .pyc
        envs = prepare(detect(base, head), env_dir=tmp_path / "envs", settings=settings)
        for side in (envs.base, envs.head):
            site = next(Path(side.directory).glob("lib/python*/site-packages"))
            assert bool(list((site / "__pycache__").glob("fastlib.*.pyc"))) == compiled
            assert bool(list((site / "pytest_llmperf" / "__pycache__").glob("plugin.*.pyc"))) == compiled


def test_a_cuda_torch_on_the_cpu_target_is_worth_a_warning_with_the_line_to_add():
    cuda = SideEnvironment("head", BUILT, "/e/bin/python", installed={"torch": "2.13.0", "nvidia-cublas-cu12": "12.8"})
    note = _cuda_note(cuda)
    assert note.startswith("the head side's torch 2.13.0 is a CUDA build (1 nvidia-* packages) on the cpu target")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in note
    assert _cuda_note(SideEnvironment("base", BUILT, "/e/bin/python", installed={"torch": "2.13.0+cpu"})) is None


def test_what_no_job_used_for_two_weeks_is_pruned_but_never_an_entry_in_use(tmp_path):
    # A cache that only grew filled a runner's disk (nothing called prune). An entry's marker is touched at each reuse.
    now, day = time.time(), 86400
    for name, days in (("recent", 1), ("old", 15), ("in-use", 15)):
        (tmp_path / name / "bin").mkdir(parents=True)
        cache.mark_ready(tmp_path / name, name, {"installed": {}})
        os.utime(tmp_path / name / cache.MARKER, (now - days * day, now - days * day))
    for name, days in (("half-built", 15), (f"{cache.WHEELS}/plugin-old", 15), (f"{cache.WHEELS}/plugin-new", 0)):
        (tmp_path / name).mkdir(parents=True)  # half-built: what a killed build left, its lock free
        os.utime(tmp_path / name, (now - days * day, now - days * day))
    with cache.entry_lock(tmp_path / "in-use"):  # a job building or reusing it
        removed = cache.prune(tmp_path, now=now)
    assert sorted(p.name for p in removed) == ["half-built", "old", "plugin-old"]
    kept = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert kept == [cache.WHEELS, "in-use", "recent"]
    assert [p.name for p in (tmp_path / cache.WHEELS).iterdir()] == ["plugin-new"]


def test_a_job_that_builds_prunes_what_no_job_used_for_two_weeks_and_says_so(tmp_path):
    old = tmp_path / "envs" / "0123456789abcdef01234567"
    (old / "bin").mkdir(parents=True)
    cache.mark_ready(old, old.name, {"installed": {}})
    os.utime(old / cache.MARKER, (time.time() - 15 * 86400,) * 2)
    roots = [requirements_project(tmp_path / side, version) for side, version in (("base", "1.0"), ("head", "2.0"))]
    envs = prepare(detect(*roots), env_dir=tmp_path / "envs", settings=OFFLINE)
    assert envs.notes == (f"removed 1 environments or wheels that no job used for 14 days from {tmp_path / 'envs'}",)
    assert not old.exists() and Path(envs.base.directory).exists() and Path(envs.head.directory).exists()
    again = prepare(detect(*roots), env_dir=tmp_path / "envs", settings=OFFLINE)  # nothing built: nothing pruned
    assert (again.base.how, again.head.how, again.notes) == (CACHE_HIT, CACHE_HIT, ())
