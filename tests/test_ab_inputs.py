"""What a user's CI passes to an A/B job reaches both sides as pytest understood it (issue 39, round 3): a module the
ref cannot collect, a src layout over an installed copy, pytest's own options in any spelling, a large environment
and warnings turned into errors. Each is a real job in a temporary git repository, its workers real processes."""

import subprocess

import pytest

from pytest_llmperf.orchestrate.sides import passthrough_args
from pytest_llmperf.orchestrate.worker import foreign_modules

ENGINE = """
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend
{imports}

@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def {name}(llmperf):
    index = int(os.environ.get("LLMPERF_WORKER_PROCESS", "0"))
    {check}
    llmperf.measure(SimulatedBackend(seed=index, noise=0.005, decode_slowdown={decode}))
"""
ARGS = ("--llmperf-device=cpu", "--llmperf-machine=runner", "-p", "no:cacheprovider", "--llmperf-alpha=0.05",
        "--llmperf-processes=5", "-o", "llmperf_max_processes=5", "--llmperf-max-load=inf",
        "-W", "ignore::pytest.PytestAssertRewriteWarning")  # fmt: skip


def engine(name="test_engine", decode="1.0", imports="", check="pass"):
    return ENGINE.format(name=name, decode=decode, imports=imports, check=check)


def commit(pytester):
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=pytester.path, check=True, capture_output=True)


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # not the suite's --llmperf-processes=1
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makeini("[pytest]\n")
    return pytester


def test_a_test_the_ref_cannot_collect_is_an_error_not_a_new_test(project):
    project.makepyfile(test_a=engine("test_a"), test_b=engine("test_b", imports="import not_installed_module"))
    commit(project)
    project.makepyfile(test_b=engine("test_b", decode="2.0"))  # the import fixed, and a slowdown beside it
    result = project.runpytest(*ARGS, "--llmperf-compare=HEAD")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*cannot compare: collecting test_b.py on HEAD (*) failed, so what the test measures "
                                 "there is not known:*", "*ModuleNotFoundError*not_installed_module*"])
    result.stdout.no_fnmatch_line("*new test*")
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_ref_whose_conftest_raises_fails_every_test_quoting_its_collection(project):
    project.makepyfile(test_a=engine("test_a"))
    project.makeconftest("raise RuntimeError('a conftest that raises on the ref')")
    commit(project)
    project.makeconftest("")
    result = project.runpytest(*ARGS, "--llmperf-compare=HEAD")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the tests of HEAD (*) could not be collected (pytest exited with code *), so "
                                 "nothing can be compared with them:*", "*a conftest that raises on the ref*"])


def test_a_src_layout_measures_each_sides_own_package_over_an_installed_copy(project, monkeypatch):
    """An installed (non-editable) copy of the project stands first for imports of the working tree's workers,
    unless its src/ goes before it as the ref's does: here the copy lies in a directory on PYTHONPATH."""
    project.path.joinpath("src/mypkg").mkdir(parents=True)
    project.path.joinpath("src/mypkg/__init__.py").write_text("DECODE = 1.0\n")
    project.makepyfile(test_engine=engine(decode="mypkg.DECODE", imports="import mypkg"))
    commit(project)
    project.path.joinpath("site/mypkg").mkdir(parents=True)
    project.path.joinpath("site/mypkg/__init__.py").write_text("DECODE = 1.0\n")  # as released: the ref's speed
    monkeypatch.setenv("PYTHONPATH", str(project.path / "site"))  # the workers' site-packages
    monkeypatch.syspath_prepend(str(project.path / "site"))  # and this process's, which collects the tests
    project.path.joinpath("src/mypkg/__init__.py").write_text("DECODE = 2.0\n")  # the pull request
    result = project.runpytest(*ARGS, "--llmperf-compare=HEAD")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*decode_token_ms (decode) at batch size 1 regressed*"])


def test_a_worker_says_which_of_its_sides_modules_came_from_elsewhere(tmp_path, monkeypatch):
    root, elsewhere = tmp_path / "checkout", tmp_path / "site"
    for directory in (root, elsewhere):
        (directory / "mypkg").mkdir(parents=True)
        (directory / "mypkg" / "__init__.py").write_text("")
    (root / "ownmod.py").write_text("")
    monkeypatch.syspath_prepend(str(elsewhere))
    monkeypatch.delitem(__import__("sys").modules, "mypkg", raising=False)
    import mypkg

    assert foreign_modules([root]) == {"mypkg": mypkg.__file__}  # ownmod was never imported: nothing to say


@pytest.mark.parametrize("spelling", [("--import-mode", "importlib"), ("--import-mode=importlib",)])
def test_pytests_own_options_reach_the_workers_as_pytest_parsed_them(project, spelling):
    project.makepyfile(test_engine=engine())
    commit(project)
    result = project.runpytest(*ARGS, "--llmperf-compare=HEAD", *spelling)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmperf: judged 1 of 1 benchmarks"])


def test_an_ini_file_given_with_c_is_each_sides_own(project):
    project.path.joinpath("ci").mkdir()
    project.path.joinpath("ci/perf.ini").write_text("[pytest]\nllmperf_rtol = 0.3\n")
    project.makepyfile(test_engine=engine())
    commit(project)
    result = project.runpytest(*ARGS, "--llmperf-compare=HEAD", "-c", "ci/perf.ini", "--rootdir", str(project.path))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmperf: judged 1 of 1 benchmarks"])


def test_an_ini_in_a_subfolder_without_a_rootdir_finds_the_tests_at_the_top(project):
    """pytest -c ci/perf.ini from the top, no --rootdir: the rootdir is ci/, the tests lie above it, and pytest names
    them from where it collected (tests/test_perf.py). Workers run from the rootdir failed every test with "file or
    directory not found: tests/test_perf.py::..."."""
    project.path.joinpath("ci").mkdir()
    project.path.joinpath("ci/perf.ini").write_text("[pytest]\n")
    project.mkdir("tests").joinpath("test_perf.py").write_text(engine())
    commit(project)
    for mode, said in (("--llmperf-update", "*1 created*"), ("--llmperf-compare=HEAD", "llmperf: judged 1 of 1 *")):
        result = project.runpytest(*ARGS, mode, "-c", "ci/perf.ini")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["rootdir: */ci", said])


def test_a_rootdir_below_the_repository_keeps_its_node_ids(project):
    project.mkdir("perf").joinpath("test_engine.py").write_text(engine())
    commit(project)
    result = project.runpytest(*ARGS, "--llmperf-compare=HEAD", "--rootdir=perf", "perf")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmperf: judged 1 of 1 benchmarks"])


def test_passthrough_reads_the_parsed_options_and_maps_paths_to_the_side(pytester):
    pytester.path.joinpath("ci").mkdir()
    pytester.path.joinpath("ci/perf.ini").write_text("[pytest]\n")
    config = pytester.parseconfig("-c", "ci/perf.ini", "--import-mode", "importlib", "-o", "xfail_strict=true",
                                  "-W", "error::UserWarning", "--strict-markers", "-p", "no:randomly")  # fmt: skip
    side = pytester.path / "ref"
    args = passthrough_args(config, side, lambda path: side / path.relative_to(pytester.path))
    assert args[0] == f"--rootdir={side}"
    pairs = {(a, b) for a, b in zip(args, args[1:])}
    assert {("-p", "no:randomly"), ("-o", "xfail_strict=true"), ("-c", str(side / "ci" / "perf.ini")),
            ("-W", "error::UserWarning")} <= pairs  # fmt: skip
    assert "--import-mode=importlib" in args and "--strict-markers" in args


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_a_large_environment_reaches_every_worker(project, start, monkeypatch):
    """A fork server's request carries a worker's environment: one past a datagram's size (~200 KB) must start
    (in variables under the kernel's 128 KiB a string: no process could start with a longer one)."""
    for name in ("LARGE_A", "LARGE_B", "LARGE_C"):
        monkeypatch.setenv(name, "x" * 100_000)
    project.makepyfile(test_engine=engine(check='assert len(os.environ["LARGE_C"]) == 100_000'))
    commit(project)
    result = project.runpytest(*ARGS, "--llmperf-compare=HEAD", "-o", f"llmperf_worker_start={start}")
    result.assert_outcomes(passed=1)


def test_workers_run_when_deprecation_warnings_are_errors(project, monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    project.makepyfile(test_engine=engine())
    commit(project)
    result = project.runpytest(*ARGS, "--llmperf-compare=HEAD")
    result.assert_outcomes(passed=1)


CHILD = """
import os, subprocess, sys
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def test_engine(llmperf):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    with open({pids!r}, "a") as handle:
        handle.write(f"{{child.pid}}\\n")
    llmperf.measure(SimulatedBackend(seed=int(os.environ.get("LLMPERF_WORKER_PROCESS", "0")), noise=0.005))
"""


def test_a_child_a_benchmark_starts_in_a_session_of_its_own_does_not_outlive_the_job(project, tmp_path):
    from tests.doubles.leaks import alive, read_pids

    pids = tmp_path / "pids"
    project.makepyfile(test_engine=CHILD.format(pids=str(pids)))
    commit(project)
    result = project.runpytest(*ARGS, "--llmperf-compare=HEAD")
    result.assert_outcomes(passed=1)
    started = read_pids(pids)
    assert len(started) == 10  # one a worker, 5 a side
    assert not [pid for pid in started if alive(pid)]
    result.stdout.fnmatch_lines(["*llmperf: stopped 10 process(es) the benchmarks left running: *"])
