"""Each side's environment built by real uv, offline, from local wheels (pytest_llmperf/environments/): a uv.lock
project and a requirements project whose only change is fastlib 1.0 -> 2.0 (2.0 does 10% more work).

No index is reachable: uv runs with --offline, each project's wheels are its find-links, and the plugin's own
requirements come from wheels of this environment's distributions. uv's cache is one per module (UV_CACHE_DIR).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pytest_llmperf.environments import cache
from pytest_llmperf.environments.build import build_side
from pytest_llmperf.environments.detection import detect
from pytest_llmperf.environments.errors import BuildFailed, CannotBuild, EnvironmentsError
from pytest_llmperf.environments.installed import check_imported, probe
from pytest_llmperf.environments.plan import prepare
from pytest_llmperf.environments.plugin_install import controller_version
from pytest_llmperf.environments.records import BUILT, CACHE_HIT, CODE_ONLY, SHARED, BuildSettings
from pytest_llmperf.environments.uv_runner import find_uv
from tests.env_projects import LOOPS, requirements_project, run_in, uv_project, uv_workspace

#: Offline, as in CI without an index; bytecode left to import time except where a test says (compiling the plugin's
#: scipy takes ~8 s an environment here).
OFFLINE = BuildSettings(offline=True, compile_bytecode=False)


@pytest.fixture(scope="module", autouse=True)
def uv_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("UV_CACHE_DIR", str(tmp_path_factory.mktemp("uv-cache")))
        yield


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("envs")


@pytest.fixture(scope="module", params=["uv.lock", "requirements"])
def bump(request, tmp_path_factory, env_dir):
    """A pull request that changes only fastlib 1.0 -> 2.0; its environments built once for the module."""
    root = tmp_path_factory.mktemp(request.param.replace(".", "-"))
    make = uv_project if request.param == "uv.lock" else requirements_project
    detection = detect(make(root / "base", "1.0"), make(root / "head", "2.0"))
    return request.param, detection, prepare(detection, env_dir=env_dir, settings=OFFLINE)


def test_a_bump_builds_each_side_from_its_own_files(bump, env_dir):
    kind, _, envs = bump
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
    assert envs.summary_line().startswith("environments: per side (fastlib 1.0 -> 2.0; base built ")
    assert envs.summary_lines()[-1] == "  packages that differ (1): fastlib 1.0 -> 2.0"


def test_a_rerun_reuses_both_environments_from_the_cache(bump, env_dir):
    _, detection, first = bump
    again = prepare(detection, env_dir=env_dir, settings=OFFLINE)
    assert (again.base.how, again.head.how) == (CACHE_HIT, CACHE_HIT)
    assert (again.base.key, again.head.key) == (first.base.key, first.head.key)
    assert again.base.installed == first.base.installed and again.head.installed == first.head.installed
    # The goal: the build step of a rerun under 2 s. Measured here: 0.1-0.3 s a side (one probe each).
    assert again.base.build_seconds + again.head.build_seconds < 2.0


def test_a_worker_of_one_side_is_told_apart_from_the_other(bump):
    _, _, envs = bump
    code = ("import json, fastlib; from pytest_llmperf.environments.installed import imported_distributions; "
            "print(json.dumps(imported_distributions()))")  # fmt: skip
    imported = json.loads(run_in(envs.base.python, code))
    assert imported["fastlib"] == "1.0" and imported["pytest-llmperf"] == controller_version()
    assert check_imported(imported, envs.base) == ()
    assert check_imported(imported, envs.head) == ("fastlib 1.0 was imported; the head environment has 2.0",)


def test_a_base_python_is_checked_against_the_base_sides_declarations(bump, tmp_path):
    kind, detection, envs = bump
    good = prepare(detection, base_python=envs.base.python)
    assert good.base.how == "base-python" and good.base.findings == ()
    assert good.base.version("fastlib") == "1.0" and good.head.version("fastlib") is None
    assert good.head.findings[0] == f"fastlib is not installed; {'pyproject.toml' if kind == 'uv.lock' else 'requirements.txt'} requires 2.0"  # noqa: E501
    wrong = prepare(detection, base_python=envs.head.python)
    expected = "fastlib 2.0 is installed; uv.lock locks 1.0" if kind == "uv.lock" else (
        "fastlib 2.0 is installed; requirements.txt requires 1.0")  # fmt: skip
    assert wrong.base.findings == (expected,)
    assert f"base: {envs.head.python}, CPython" in wrong.summary_lines()[1] and expected in wrong.summary_lines()[1]
    bare = tmp_path / "bare"
    subprocess.run([find_uv().path, "venv", "-q", str(bare)], check=True)
    with pytest.raises(EnvironmentsError, match=r"has pytest-llmperf \(not installed\), this job runs .*pip install"):
        prepare(detection, base_python=str(cache.python_in(bare)))


def test_code_only_measures_nothing_new_and_says_so(bump, tmp_path):
    _, detection, _ = bump
    envs = prepare(detection, mode="code-only", uv=tmp_path / "no-uv", env_dir=tmp_path / "envs")
    assert (envs.base.how, envs.head.how) == (CODE_ONLY, CODE_ONLY) and not envs.per_side
    assert envs.not_measured == ("fastlib 1.0 -> 2.0 (neither side has it installed)",)
    assert envs.summary_line() == ("environments: DEPENDENCY CHANGES NOT MEASURED: fastlib 1.0 -> 2.0 (neither side "
                                   "has it installed) [code-only]")  # fmt: skip
    assert not (tmp_path / "envs").exists()


def test_without_uv_the_job_cannot_pass_and_says_the_ways_out(bump, tmp_path):
    _, detection, _ = bump
    with pytest.raises(CannotBuild) as raised:
        prepare(detection, uv=tmp_path / "no-uv", env_dir=tmp_path / "envs")
    message = str(raised.value)
    assert "packages that differ: fastlib 1.0 -> 2.0" in message
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
    requirements = tmp_path / "head" / "requirements.txt"  # the same pins, reordered and commented
    requirements.write_text("fastlib==1.0  # pinned\n\n--find-links wheels\n")
    envs = prepare(detect(base, tmp_path / "head"), uv=uv, env_dir=tmp_path / "envs")
    assert (envs.base.how, envs.status) == (SHARED, "same-in-form")
    assert envs.summary_line() == "environments: shared (requirements.txt changed in form only) [auto]"
    assert not log.exists() and not (tmp_path / "envs").exists()


def test_build_mode_builds_equal_locks_twice_and_they_match(tmp_path, env_dir, recorded_uv):
    uv, log = recorded_uv
    base = uv_project(tmp_path / "base", "1.0")
    shutil.copytree(base, tmp_path / "head")
    envs = prepare(detect(base, tmp_path / "head"), mode="build", uv=uv, env_dir=env_dir, settings=OFFLINE)
    assert (envs.base.how, envs.head.how) == (BUILT, BUILT) and envs.per_side and envs.measured
    assert envs.base.key != envs.head.key
    assert envs.base.installed == envs.head.installed and envs.base.version("fastlib") == "1.0"
    assert sum(line.startswith("sync --frozen") for line in log.read_text().splitlines()) == 2


def test_a_failed_build_names_the_packages_and_leaves_nothing_half_built(tmp_path, env_dir):
    base = requirements_project(tmp_path / "base", "1.0")
    head = requirements_project(tmp_path / "head", "3.0")  # no fastlib 3.0 wheel, no index
    with pytest.raises(BuildFailed) as raised:
        prepare(detect(base, head), env_dir=env_dir, settings=OFFLINE)
    message = str(raised.value)
    assert "packages that differ: fastlib 1.0 -> 3.0" in message and "fastlib" in message.split("uv said:")[1]
    assert "--llmperf-compare-deps=code-only" in message
    left = [p for p in env_dir.iterdir() if not p.name.startswith(".") and not (p / cache.MARKER).exists()]
    assert left == []


def test_requirements_beside_project_dependencies_install_both(tmp_path, env_dir):
    # A package's own dependencies in pyproject.toml, its tools in requirements-dev.txt: both are what the project
    # runs with. Built from requirements-dev.txt alone, neither side had fastlib, and the bump measured nothing.
    roots = {}
    for side, version in (("base", "1.0"), ("head", "2.0")):
        root = roots[side] = uv_project(tmp_path / side, version, lock=False)
        (root / "requirements-dev.txt").write_text("--find-links wheels\n")
    detection = detect(roots["base"], roots["head"])
    assert [str(change) for change in detection.changes] == ["fastlib 1.0 -> 2.0"]
    envs = prepare(detection, env_dir=env_dir, settings=OFFLINE)
    assert envs.base.recipe == "pyproject.toml requirements-dev.txt"
    assert (envs.base.version("fastlib"), envs.head.version("fastlib")) == ("1.0", "2.0")


def test_a_uv_workspace_member_is_built_from_the_workspaces_lock(tmp_path, env_dir):
    # The member has a pyproject.toml (the same on both sides) and no lock of its own: uv sync in its directory takes
    # the workspace's uv.lock, which alone moved. Read at the member alone, the sides were "unchanged".
    base, head = uv_workspace(tmp_path / "base", "1.0"), uv_workspace(tmp_path / "head", "2.0")
    detection = detect(base, head)
    assert detection.base.paths() == ("../../pyproject.toml", "../../uv.lock", "pyproject.toml")
    assert [(str(c), c.source) for c in detection.changes] == [("fastlib 1.0 -> 2.0", "../../uv.lock")]
    envs = prepare(detection, env_dir=env_dir, settings=OFFLINE)
    assert envs.base.recipe == "uv.lock"
    assert (envs.base.version("fastlib"), envs.head.version("fastlib")) == ("1.0", "2.0")


def test_an_extra_named_by_the_option_is_installed_from_the_lock(tmp_path, env_dir):
    # fastlib only in the project's `bench` extra: uv sync installs no extra unless asked (--llmperf-env-extras).
    roots = {}
    for side, version in (("base", "1.0"), ("head", "2.0")):
        root = roots[side] = uv_project(tmp_path / side, version, lock=False)
        text = (root / "pyproject.toml").read_text()
        text = text.replace(f'dependencies = ["fastlib=={version}"]', "dependencies = []")
        (root / "pyproject.toml").write_text(text + f'\n[project.optional-dependencies]\nbench = ["fastlib=={version}"]\n')
        done = subprocess.run([find_uv().path, "lock", "--offline", "-q"], cwd=root, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    detection = detect(roots["base"], roots["head"])
    assert [str(change) for change in detection.changes] == ["fastlib 1.0 -> 2.0"]  # read from the lock
    chosen = BuildSettings(offline=True, compile_bytecode=False, extras=("bench",))
    envs = prepare(detection, env_dir=env_dir, settings=chosen)
    assert envs.base.recipe == "uv.lock --extra bench"
    assert (envs.base.version("fastlib"), envs.head.version("fastlib")) == ("1.0", "2.0")


def test_a_cache_that_cannot_be_written_names_the_option_that_moves_it(tmp_path):
    base = requirements_project(tmp_path / "base", "1.0")
    head = requirements_project(tmp_path / "head", "2.0")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(CannotBuild) as raised:
        prepare(detect(base, head), env_dir=tmp_path / "a-file" / "envs", settings=OFFLINE)
    message = str(raised.value)
    assert "cannot write the environments' cache" in message and "a-file" in message
    assert "--llmperf-env-dir=PATH" in message and "fastlib 1.0 -> 2.0" in message


def test_a_lock_not_built_here_names_its_export(tmp_path):
    base, head = tmp_path / "base", tmp_path / "head"
    for root, version in ((base, "1.0"), (head, "2.0")):
        root.mkdir()
        (root / "poetry.lock").write_text(f'[[package]]\nname = "fastlib"\nversion = "{version}"\n')
    with pytest.raises(CannotBuild, match=r"poetry.lock is not built by pytest-llmperf(.|\n)*poetry export"):
        prepare(detect(base, head), env_dir=tmp_path / "envs")


def test_a_file_that_cannot_be_read_cannot_be_built(tmp_path):
    base = requirements_project(tmp_path / "base", "1.0")
    head = requirements_project(tmp_path / "head", "1.0")
    (head / "requirements.txt").write_text("fastlib=1.0\n")
    with pytest.raises(CannotBuild, match="cannot read requirements.txt line 1"):
        prepare(detect(base, head), env_dir=tmp_path / "envs")


def test_a_python_version_change_is_built_only_when_this_interpreter_is_both(tmp_path):
    import platform

    base, head = tmp_path / "base", tmp_path / "head"
    base.mkdir()
    head.mkdir()
    minor = ".".join(platform.python_version_tuple()[:2])
    (base / ".python-version").write_text(f"{minor}\n")
    (head / ".python-version").write_text(f"{platform.python_version()}\n")
    envs = prepare(detect(base, head), uv=tmp_path / "no-uv")
    assert envs.base.how == SHARED and "both name the interpreter of this job" in envs.notes[-1]
    (head / ".python-version").write_text("2.7\n")
    with pytest.raises(CannotBuild, match=r"\.python-version .* -> 2\.7, and both sides are built with one"):
        prepare(detect(base, head), uv=tmp_path / "no-uv")


def test_two_jobs_build_one_environment_once_and_a_changed_one_is_rebuilt(tmp_path, env_dir):
    inputs = detect(uv_project(tmp_path / "side", "2.0"), tmp_path / "side").head
    base, uv = probe(sys.executable, installed=False), find_uv()
    results = []

    def job(copy=tmp_path.name):  # a key of its own: not the environment the bump's head side built
        results.append(build_side("head", inputs, base=base, uv=uv, env_dir=env_dir, settings=OFFLINE, copy=copy))

    threads = [threading.Thread(target=job) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.how for r in results) == [BUILT, CACHE_HIT] and results[0].key == results[1].key
    site = next(Path(results[0].directory).glob("lib/python*/site-packages"))
    shutil.rmtree(next(site.glob("fastlib-2.0.dist-info")))  # someone changed it since it was built
    rebuilt = build_side("head", inputs, base=base, uv=uv, env_dir=env_dir, settings=OFFLINE, copy=tmp_path.name)
    assert rebuilt.how == BUILT and rebuilt.version("fastlib") == "2.0"


def test_bytecode_is_compiled_alike_on_both_sides(tmp_path, env_dir):
    base = requirements_project(tmp_path / "base", "1.0")
    head = requirements_project(tmp_path / "head", "2.0")
    envs = prepare(detect(base, head), env_dir=env_dir, settings=BuildSettings(offline=True))
    for side in (envs.base, envs.head):
        site = next(Path(side.directory).glob("lib/python*/site-packages"))
        assert list((site / "__pycache__").glob("fastlib.*.pyc"))
        assert list((site / "pytest_llmperf" / "__pycache__").glob("plugin.*.pyc"))


def test_prune_keeps_the_newest_used_environments(tmp_path):
    for age, name in enumerate(["newest", "middle", "oldest"]):
        (tmp_path / name / "bin").mkdir(parents=True)
        cache.mark_ready(tmp_path / name, name, {"installed": {}})
        os.utime(tmp_path / name / cache.MARKER, (1_000_000 - age, 1_000_000 - age))
    (tmp_path / "half-built").mkdir()  # no marker: a build in progress holds its lock; not prune's to take
    (tmp_path / cache.WHEELS).mkdir()
    assert cache.prune(tmp_path, keep=1, spare=(tmp_path / "oldest",)) == [tmp_path / "middle"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [cache.WHEELS, "half-built", "newest", "oldest"]
