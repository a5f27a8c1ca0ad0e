"""The main job (`tox -e bench`) judges on any machine: its command, read from tox.ini, run as written on a fresh
git repository that holds no baselines, measures both sides, judges every benchmark and writes the seed tables.

Only the folder of benchmarks differs: a simulated engine stands in for benchmarks/, so that the job's own
flags (A/B against HEAD, its tolerance, the pytest-benchmark export) are what is tested, in seconds."""

import configparser
import json
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARK = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], warmups=0)
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend(noise=0.002))
"""


def bench_command() -> list[str]:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    command = shlex.split(tox["testenv:bench"]["commands"].replace("\\\n", " "))
    assert command[:2] == ["pytest", "benchmarks"], command
    return [arg for arg in command[2:] if arg != "{posargs}"]


@pytest.fixture
def user_repo(project, monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS")  # the job's own defaults: worker processes
    project.mkdir("benchmarks")
    (project.path / "benchmarks" / "test_engine.py").write_text(BENCHMARK)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=project.path, check=True, capture_output=True)
    return project


def test_the_main_job_compares_with_head_and_needs_no_stored_baseline():
    args = bench_command()
    assert "--llmperf-compare=HEAD" in args and "--llmperf-device=cpu" in args


def test_the_main_job_judges_on_a_machine_without_baselines_and_writes_the_tables(user_repo):
    result = user_repo.runpytest("benchmarks", *bench_command(), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*the working tree against HEAD (A/B*",
                                 "llmperf: baselines=none (A/B: both sides measured here), reports=*",
                                 "llmperf: judged 1 of 1 benchmarks"])
    assert not (user_repo.path / "baselines").exists()
    table = (user_repo.path / "reports" / "cpu.md").read_text()
    assert "## benchmarks/test_engine.py::test_engine" in table
    assert "| Step " in table and "| Prefill " in table and "| Decode (token) " in table  # seed 000's tables
    exported = json.loads((user_repo.path / "reports" / "benchmark.json").read_text())
    assert any(b["name"].startswith("test_engine") for b in exported["benchmarks"])
