"""What interrupted worker processes leave (L1): no temporary directory, no process; a failed worker's whole log in
the report directory. A controller killed with SIGKILL runs no cleanup: the next run removes what it left, and
says so."""

import os
import signal
import tempfile

import psutil
import pytest

from pytest_llmperf import files

WORKER_DIES = """
import os, signal
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def test_engine(llmperf):
    if os.environ.get("LLMPERF_WORKER_PROCESS") == "2":
        print("worker 2 receives {name}", flush=True)
        # a suite started from a background shell (`cmd &`) hands its processes SIGINT ignored: Python then installs
        # no handler and the signal would be lost; a Ctrl-C at a terminal reaches a worker with Python's default
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), signal.{name})
    llmperf.measure(SimulatedBackend())
"""


@pytest.fixture
def project(pytester, monkeypatch, tmp_path_factory):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # not the suite's --llmperf-processes=1
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    temp = tmp_path_factory.mktemp("tmpdir")
    monkeypatch.setenv("TMPDIR", str(temp))  # the workers' own temporary files, and ours
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # this process caches it
    pytester.makeini("[pytest]\n")
    pytester.temp = temp
    return pytester


@pytest.fixture
def run(run):
    return run.with_flags("--llmperf-processes=3", "--llmperf-update")


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_an_interrupted_worker_leaves_no_temporary_directory_and_its_log_is_kept(project, run, name):
    project.makepyfile(test_x=WORKER_DIES.format(name=name))
    result = run()
    result.assert_outcomes(failed=1)
    kept = project.path / "reports" / "worker-logs" / "worker2.log"
    result.stdout.fnmatch_lines([f"*worker process 2 on the working tree exited with code *. Its log ({kept}) ends "
                                 "with:*", f"*worker 2 receives {name}*"])
    assert f"worker 2 receives {name}" in kept.read_text()
    assert list(project.temp.iterdir()) == []  # was: llmperf-workers-* after every interrupt, 8 of 8
    me = psutil.Process()
    assert [c for c in me.children(recursive=True) if c.is_running() and c.status() != psutil.STATUS_ZOMBIE] == []


def test_what_a_killed_controller_left_is_removed_by_the_next_run_which_says_so(project, run):
    project.makepyfile(test_x=WORKER_DIES.format(name="SIGKILL").replace('== "2"', '== "no worker"'))
    killed = project.temp / "llmperf-workers-killed1"  # as a controller killed by SIGKILL leaves it
    killed.mkdir()
    (killed / "worker1.log").write_text("half a log")
    (killed / files.OWNER).write_text("999999999 1.0")
    reused = project.temp / "llmperf-workers-reused1"  # its pid runs again, as another process: gone too
    reused.mkdir()
    (reused / files.OWNER).write_text(f"{os.getpid()} 1.0")
    running = project.temp / "llmperf-workers-running"  # a controller that runs now, beside this one
    running.mkdir()
    files.claim(running)
    unknown = project.temp / "llmperf-workers-unknown"  # no owner file: whose it is cannot be told
    unknown.mkdir()
    result = run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*llmperf: removed 2 worker directories that a killed pytest-llmperf run left: "
                                 f"*llmperf-workers-*1 (pid *), *llmperf-workers-*1 (pid *)*"])
    assert sorted(p.name for p in project.temp.iterdir()) == ["llmperf-workers-running", "llmperf-workers-unknown"]
