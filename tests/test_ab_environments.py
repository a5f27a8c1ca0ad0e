"""A/B with each side's own dependencies, end to end (issue 37): a pull request that only bumps a library is measured
in each side's environment, built by real uv from that side's own files, offline from local wheels.

The library, `fastlib`, sets the simulated engine's decode speed: 1.0 and 1.1 as fast as each other, 2.0 25% slower.
So what a side measured shows which fastlib it ran. This process never imports it: only the sides' workers do.
"""

import subprocess
import zipfile

import pytest

from pytest_llmperf.environments.plugin_install import write_wheel

OWN_IMPORT = "    import engineproj  # noqa: F401  (the project's own, from its checkout's src/)\n"
SLOWDOWN = {"1.0": 1.0, "1.1": 1.0, "2.0": 1.25}
ENGINE = f"""
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def test_engine(llmperf):
{OWN_IMPORT}    import fastlib  # the side's own: its environment's

    index = int(os.environ.get("LLMPERF_WORKER_PROCESS", "0"))
    llmperf.measure(SimulatedBackend(seed=index, noise=0.005, decode_slowdown=fastlib.SLOWDOWN))
"""
ARGS = ("--llmperf-device=cpu", "--llmperf-machine=runner", "-p", "no:cacheprovider", "--llmperf-alpha=0.05",
        "--llmperf-processes=5", "-o", "llmperf_max_processes=5", "--llmperf-max-load=inf", "--llmperf-compare=HEAD",
        "-W", "ignore::pytest.PytestAssertRewriteWarning")  # fmt: skip


def fastlib_wheel(directory, version, *, slowdown=None, name="fastlib"):
    info = f"{name}-{version}.dist-info"
    files = [
        (f"{name}.py", f"__version__ = {version!r}\nSLOWDOWN = {slowdown or SLOWDOWN[version]}\n".encode()),
        (f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    return write_wheel(directory / f"{name}-{version}-py3-none-any.whl", files, info)


def requirements(version, comment="what the benchmark imports"):
    return f"# {comment}\n--find-links wheels\nfastlib=={version}\n"


def git(path, *args):
    subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory):
    """One cache of built environments for the module: a later job reuses what an earlier one built."""
    return tmp_path_factory.mktemp("envs")


@pytest.fixture
def project(pytester, monkeypatch, env_dir, tmp_path_factory):
    """A repository whose committed requirements.txt pins fastlib 1.0 (its wheels committed beside it)."""
    monkeypatch.setenv("PYTEST_ADDOPTS", f"-o llmperf_env_dir={env_dir}")  # not the suite's --llmperf-processes=1
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("UV_OFFLINE", "1")  # no index is reachable here: the wheels are the project's
    monkeypatch.setenv("UV_CACHE_DIR", str(env_dir.parent / "uv-cache"))
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=ENGINE)
    (pytester.path / "wheels").mkdir()
    for version in SLOWDOWN:
        fastlib_wheel(pytester.path / "wheels", version)
    (pytester.path / "requirements.txt").write_text(requirements("1.0"))
    # A src layout installed editable by setuptools, which writes src/engineproj.egg-info (ignored by git): a worker
    # that imports the project from src/ sees it as a distribution no built environment has.
    (pytester.path / "src" / "engineproj").mkdir(parents=True)
    (pytester.path / "src" / "engineproj" / "__init__.py").write_text("")
    (pytester.path / ".gitignore").write_text("*.egg-info/\n")
    info = pytester.path / "src" / "engineproj.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: engineproj\nVersion: 0.1\n")
    (info / "top_level.txt").write_text("engineproj\n")
    git(pytester.path, "init", "-q")
    git(pytester.path, "add", "-A")
    git(pytester.path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    return pytester


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_a_dependency_bump_fails_naming_the_library_and_a_rerun_reuses_both_environments(project, start):
    (project.path / "requirements.txt").write_text(requirements("2.0"))  # the pull request: the pin alone
    result = project.runpytest(*ARGS, "-o", f"llmperf_worker_start={start}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*environments: per side (fastlib 1.0 -> 2.0; base *, head *)*",
                                 "*  A HEAD (*): *env * from requirements.txt*",
                                 "*packages that differ (1): fastlib 1.0 -> 2.0*",
                                 "*decode_token_ms (decode) at batch size 1 regressed*ratio 1.2*",
                                 "The sides' dependencies differ (each side measured in its own environment): "
                                 "fastlib 1.0 -> 2.0"])  # fmt: skip
    again = project.runpytest(*ARGS, "-o", f"llmperf_worker_start={start}")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*environments: per side (fastlib 1.0 -> 2.0; base cache hit *, head cache hit *)*"])


def installed(project, tmp_path, monkeypatch, version):
    """fastlib VERSION installed where the job's workers import it (CI installed the pull request's requirements
    into the job's environment; this process never imports it)."""
    site = tmp_path / "site"
    with zipfile.ZipFile(project.path / "wheels" / f"fastlib-{version}-py3-none-any.whl") as wheel:
        wheel.extractall(site)
    monkeypatch.setenv("PYTHONPATH", str(site))


def test_unchanged_dependencies_build_nothing(project, env_dir, tmp_path, monkeypatch):
    installed(project, tmp_path, monkeypatch, "1.0")
    before = sorted(p.name for p in env_dir.iterdir())
    (project.path / "notes.txt").write_text("a change that is not a dependency\n")
    result = project.runpytest(*ARGS)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*environments: shared (dependency files unchanged)*"])
    assert sorted(p.name for p in env_dir.iterdir()) == before


def test_a_change_in_form_only_is_built_and_runs_shared_saying_so(project, tmp_path, monkeypatch):
    installed(project, tmp_path, monkeypatch, "1.0")
    (project.path / "requirements.txt").write_text(requirements("1.0", comment="a comment edited"))
    result = project.runpytest(*ARGS)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*environments: shared (requirements.txt differ; both sides' environments hold the "
                                 "same packages)*"])  # fmt: skip


def test_a_bump_at_the_repositorys_top_is_seen_from_a_rootdir_below_it(project, tmp_path, monkeypatch):
    """A project whose benchmarks have their own pytest.ini in perf/ (the rootdir) and whose requirements.txt is at
    the repository's top: read at the rootdir alone, the bump was 'dependency files unchanged'."""
    (project.path / "perf" / "ci").mkdir(parents=True)
    # an extra input named relative to the rootdir, as the option says, though the inputs are read at the top
    (project.path / "perf" / "pytest.ini").write_text("[pytest]\nllmperf_compare_deps_paths = ci/versions.txt\n")
    (project.path / "perf" / "ci" / "versions.txt").write_text("CUDA 12.4\n")
    (project.path / "test_engine.py").rename(project.path / "perf" / "test_engine.py")
    git(project.path, "add", "-A")
    git(project.path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "benchmarks in perf/")
    installed(project, tmp_path, monkeypatch, "2.0")
    (project.path / "requirements.txt").write_text(requirements("2.0"))
    (project.path / "perf" / "ci" / "versions.txt").write_text("CUDA 12.6\n")
    result = project.runpytest("perf", *ARGS, "--llmperf-compare-deps=code-only")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["rootdir: */perf*", "*environments: DEPENDENCY CHANGES NOT MEASURED: "
                                 "perf/ci/versions.txt, requirements.txt differ*"])  # fmt: skip


def test_no_dependency_files_is_said_in_the_header(project, tmp_path, monkeypatch):
    installed(project, tmp_path, monkeypatch, "1.0")
    git(project.path, "rm", "-q", "requirements.txt")
    git(project.path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "no requirements")
    result = project.runpytest(*ARGS)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*environments: shared (no dependency files found: see the note)*",
                                 "*  note: no dependency files at * (nor above it in the repository)*"])  # fmt: skip


def test_code_only_passes_but_says_the_dependency_change_was_not_measured(project, tmp_path, monkeypatch):
    installed(project, tmp_path, monkeypatch, "2.0")
    (project.path / "requirements.txt").write_text(requirements("2.0"))
    result = project.runpytest(*ARGS, "--llmperf-compare-deps=code-only", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1)  # both sides ran fastlib 2.0: the bump is not measured, and that is said
    result.stdout.fnmatch_lines(["*environments: DEPENDENCY CHANGES NOT MEASURED: requirements.txt differ*"])
    assert "DEPENDENCY CHANGES NOT MEASURED" in (project.path / "junit.xml").read_text()
    assert "DEPENDENCY CHANGES NOT MEASURED" in (project.path / "reports" / "cpu.md").read_text()


def test_dependencies_that_cannot_be_built_fail_the_job_naming_the_side_and_the_ways_out(project):
    (project.path / "requirements.txt").write_text(requirements("3.0"))  # no such wheel, and no index
    result = project.runpytest(*ARGS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stderr.str()
    assert "the head side's environment cannot be made" in text and "fastlib==3.0" in text and "code-only" in text
    assert "pip install --python" in text and "/uv pip install" in text  # the command as it ran, uv included
    assert "--llmperf-base-python" not in text  # a way out for the base side, not for the head


def test_a_dependency_input_that_cannot_be_read_fails_the_job_naming_it(project):
    (project.path / "requirements.txt").write_text(requirements("1.0") + "-r loop.txt\n")
    (project.path / "loop.txt").symlink_to(project.path / "loop.txt")
    result = project.runpytest(*ARGS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(["*llmperf: cannot read */loop.txt, a dependency input: *"])


def test_an_aa_job_of_equal_dependencies_built_apart_passes(project):
    """--llmperf-compare-deps=build builds each side its own environment from equal files: the machinery adds no
    offset of its own."""
    result = project.runpytest(*ARGS, "--llmperf-compare-deps=build")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*environments: per side (built on request; base *, head *)*"])


def test_a_stored_baseline_names_the_dependency_that_changed_since_it_was_recorded(pytester, monkeypatch, tmp_path):
    """The baseline's fingerprint keeps the versions of the distributions its benchmark imported: a regression
    against it names fastlib 1.0 -> 2.0."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # not the suite's --llmperf-processes=1
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=ENGINE.replace(OWN_IMPORT, ""))  # no project of its own here
    args = ("--llmperf-device=cpu", "--llmperf-machine=runner", "--llmperf-processes=1", "--llmperf-max-load=inf",
            "-p", "no:cacheprovider")  # fmt: skip
    for version, flags, outcome in (("1.0", ("--llmperf-update",), "passed"), ("2.0", (), "failed")):
        site = tmp_path / version
        site.mkdir()
        with zipfile.ZipFile(fastlib_wheel(tmp_path, version)) as wheel:
            wheel.extractall(site)
        with monkeypatch.context() as patch:
            patch.syspath_prepend(str(site))
            result = pytester.runpytest(*args, *flags)
        result.assert_outcomes(**{outcome: 1})
    result.stdout.fnmatch_lines(["*decode_token_ms (decode) at batch size 1 regressed*",
                                 "Software changed since the baseline was recorded: fastlib 1.0 -> 2.0*"])  # fmt: skip


def test_a_wheel_rebuilt_under_its_name_fails_the_job_naming_it(project):
    """The hostile round's first case, end to end: the pull request rebuilds its vendored fastlib 1.0 25% slower; the
    requirements text is the same. The cache, keyed by that text, passed it."""
    (project.path / "requirements.txt").write_text("./wheels/fastlib-1.0-py3-none-any.whl\n")
    git(project.path, "add", "-A")
    git(project.path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "a vendored wheel")
    fastlib_wheel(project.path / "wheels", "1.0", slowdown=1.25)
    result = project.runpytest(*ARGS)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*environments: per side (fastlib 1.0 -> 1.0 (other files); base *, head *)*",
                                 "*decode_token_ms (decode) at batch size 1 regressed*"])  # fmt: skip


def test_a_test_the_base_side_skips_or_deselects_cannot_be_compared_but_one_it_lacks_is_new(project, tmp_path,
                                                                                           monkeypatch):
    """The hostile round's fourth case: a test the base side skipped made the pull request's slowdown `new`, exit 0,
    where a base side that raised failed the job."""
    installed(project, tmp_path, monkeypatch, "1.0")
    skipped = ENGINE.replace("def test_engine(llmperf):", "def test_engine(llmperf):\n    pytest.skip('not on main')")
    marked = ENGINE.replace("@pytest.mark.llmperf", "@pytest.mark.slow\n@pytest.mark.llmperf")
    for base, ini, why in ((skipped, "[pytest]\n", "the test is skipped on HEAD (*: *not on main)"),
                           (marked, "[pytest]\naddopts = -m 'not slow'\nmarkers = slow\n", "deselected on HEAD (*) by "
                            "its own options*")):  # fmt: skip
        project.makepyfile(test_engine=base)
        (project.path / "pytest.ini").write_text(ini)
        git(project.path, "add", "-A")
        git(project.path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
        project.makepyfile(test_engine=ENGINE.replace("decode_slowdown=fastlib.SLOWDOWN", "decode_slowdown=1.25"))
        (project.path / "pytest.ini").write_text("[pytest]\n")
        result = project.runpytest(*ARGS)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([f"*cannot compare: {why}*"])
    project.makepyfile(test_engine=ENGINE)
    git(project.path, "add", "-A")
    git(project.path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    project.makepyfile(test_added=ENGINE.replace("def test_engine", "def test_added"))  # not on the base side: new
    result = project.runpytest(*ARGS)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*judged 1 of 2 benchmarks (1 new: new test)*"])


def test_a_bump_that_no_benchmark_imports_is_said(project):
    """tabulate 0.9.0 -> 0.10.0 that no worker imports: built and gated in full, and now said."""
    for version in ("1.0", "2.0"):
        fastlib_wheel(project.path / "wheels", version, name="unusedlib")
    (project.path / "requirements.txt").write_text(requirements("1.0") + "unusedlib==1.0\n")
    git(project.path, "add", "-A")
    git(project.path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "unusedlib")
    (project.path / "requirements.txt").write_text(requirements("1.0") + "unusedlib==2.0\n")
    result = project.runpytest(*ARGS)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*unusedlib 1.0 -> 2.0: imported by no benchmark*"])
