"""The CI recipe a user pastes (examples/github-workflow-perf.yml), run as written in a sample user project: its own
package (src layout, editable install), its own Backend, a git repository with a base commit on main and an origin.

The recipe's `run:` steps are read from the YAML and run by bash, with `python` a fresh venv's. Installing needs the
network, which the suite has not: pip runs with --no-index, so the recipe's requirements must already be met by the
test environment (the venv sees its site-packages), and the project's own editable install builds offline. The
recorded baselines are committed as a user commits the artifact; then main's job gates against them, and a pull
request that doubles the decode step is measured against its base: its job is red, naming decode."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML reads the recipe (tox -e test installs it)")

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "github-workflow-perf.yml"

PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "tinyengine"
version = "0.1.0"
dependencies = ["numpy"]

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""
ENGINE = '''
"""A tiny inference engine: its steps take as long as a steady accelerator's would, and compute a little."""
import time

import numpy as np

DECODE_PASSES = 1  # a pull request makes each decode step do this many passes


class Engine:
    def __init__(self, hidden=64):
        self.weights = np.random.default_rng(0).standard_normal((hidden, hidden)) / hidden**0.5

    def prefill(self, batch_size, sequence_length):
        time.sleep(0.003 + 0.00002 * batch_size * sequence_length)
        return np.tanh(np.ones((batch_size, len(self.weights))) @ self.weights)

    def decode_step(self, state):
        for _ in range(DECODE_PASSES):
            time.sleep(0.002 + 0.0002 * len(state))
            out = np.tanh(state @ self.weights)
        return out
'''
PERF_TEST = '''
import time

import pytest
from pytest_llmperf import Backend, RunSample
from tinyengine import Engine


class TinyEngine(Backend):
    kind = "tinyengine"
    splits_prefill = True

    def __init__(self):
        super().__init__()
        self.engine = Engine()

    def generate(self, request):
        start = time.perf_counter_ns()
        state = self.engine.prefill(request.batch_size, request.sequence_length)
        times, steps = [time.perf_counter_ns() - start], []
        tokens = [[int(t)] for t in state.argmax(axis=1)]
        for _ in range(request.decode_length - 1):
            step = time.perf_counter_ns()
            state = self.engine.decode_step(state)
            steps.append(time.perf_counter_ns() - step)
            times.append(time.perf_counter_ns() - start)
            for sequence, token in zip(tokens, state.argmax(axis=1)):
                sequence.append(int(token))
        return RunSample(batch_size=request.batch_size, token_times_ns=[times] * request.batch_size,
                         end_to_end_ns=times[-1], prefill_ns=times[0], decode_steps_ns=steps, output_ids=tokens)

    def describe(self):
        return {"backend": self.kind, "model": "tinyengine", "dtype": "fp32", "device": "cpu"}


@pytest.fixture(scope="session")
def engine():
    with TinyEngine() as backend:
        yield backend


@pytest.mark.llmperf(batch_sizes=[1, 4], sequence_length=64, decode_length=12, rtol=0.25)
def test_engine(llmperf, engine):
    llmperf.measure(engine)
'''


def steps(job):
    """The named `run:` steps of a job in the recipe, as written."""
    recipe = yaml.safe_load(RECIPE.read_text())
    return {step["name"]: step["run"] for step in recipe["jobs"][job]["steps"] if "run" in step}


def git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=u@example.com", "-c", "user.name=u", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture
def user_project(tmp_path, monkeypatch):
    """A project of the user's own, on main, with an origin; and a venv that sees this environment's packages."""
    for name in [n for n in os.environ if n.startswith("LLMPERF_") and n != "LLMPERF_LEAK_TAG"]:
        monkeypatch.delenv(name)
    project = tmp_path / "tinyengine"
    (project / "src" / "tinyengine").mkdir(parents=True)
    (project / "tests" / "perf").mkdir(parents=True)
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "src" / "tinyengine" / "__init__.py").write_text(ENGINE)
    (project / "tests" / "perf" / "test_engine_perf.py").write_text(PERF_TEST)
    (project / ".gitignore").write_text("reports/\n*.egg-info/\n__pycache__/\n")
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "tinyengine")
    git(tmp_path, "clone", "-q", "--bare", str(project), "origin.git")
    git(project, "remote", "add", "origin", str(tmp_path / "origin.git"))
    git(project, "fetch", "-q", "origin")
    venv = tmp_path / "venv"
    # without pip: the venv's pip and setuptools would shadow newer ones the requirements need (torch: setuptools>=77)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    # this environment's packages (pytest-llmperf, torch, ...), .pth files included, behind the venv's own
    (site / "test_environment.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return project, venv


def run_step(project, venv, command, tmp_path, **substitutions):
    """One step's `run:` as bash runs it on the runner: `python` is the venv's; pip installs offline."""
    for name, value in substitutions.items():
        command = command.replace("${{ " + name + " }}", value)
    assert "${{" not in command, command
    pip = f"{venv}/bin/python -m pip --disable-pip-version-check install --no-index --no-build-isolation"
    command = command.replace("python -m pip install", pip)
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "PYTEST_ADDOPTS": "--llmperf-max-load=inf",
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(["bash", "-e", "-c", command], cwd=project, env=env, capture_output=True, text=True,
                          timeout=1800)


def test_the_recipe_installs_cpu_torch_first_and_names_nothing_of_this_repository():
    text = RECIPE.read_text()
    for job in ("ab", "stored"):
        install = next(run for name, run in steps(job).items() if name.startswith("Install"))
        lines = [line for line in install.splitlines() if line.strip()]
        assert lines[0] == "python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
        assert "pip install -e ." in lines[-1]
    # (requirements files are the user's: the environments' cache is keyed on them)
    for ours in ("benchmarks", "tox", "baselines/cpu", "pytest_llmperf/", "scripts/"):
        assert ours not in text, ours


def test_the_environments_cache_is_keyed_on_every_input_an_environments_key_reads():
    # A job that builds a new environment must save it: a key that missed an input restored the old cache and never
    # saved the new one, so every later job built it again.
    from pytest_llmperf.environments.inputs import BUILT, PATTERNS

    job = yaml.safe_load(RECIPE.read_text())["jobs"]["ab"]
    cached = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/cache"))
    assert "~/.cache/uv" in cached["with"]["path"] and "~/.cache/pytest-llmperf/envs" in cached["with"]["path"]
    for pattern in (*BUILT, *PATTERNS, "*.whl"):
        assert f"'**/{pattern}'" in cached["with"]["key"], pattern


@pytest.mark.serial  # times a real engine and asserts main green: alone, after the parallel tests
def test_the_recipe_runs_in_a_user_project_main_green_and_a_slower_pull_request_red(user_project, tmp_path):
    project, venv = user_project
    stored, ab = steps("stored"), steps("ab")
    installed = run_step(project, venv, stored["Install (the CPU build of torch first; on a GPU runner, plain pip "
                                                "install torch)"], tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    imported = subprocess.run([venv / "bin" / "python", "-c", "import tinyengine; print(tinyengine.__file__)"],
                              capture_output=True, text=True, check=True)
    assert str(project / "src") in imported.stdout  # editable: the checkout's own code

    recorded = run_step(project, venv, stored["Record this runner's baselines"], tmp_path)
    assert recorded.returncode == 0, recorded.stdout[-3000:]
    assert "llmperf: judged 0 of 1 benchmarks (1 created: baseline written)" in recorded.stdout
    git(project, "add", "baselines")  # the user commits the perf-baselines artifact
    git(project, "commit", "-qm", "perf baselines")
    git(project, "push", "-q", "origin", "main")

    gated = run_step(project, venv, stored["Gate against the committed baselines"], tmp_path)
    assert gated.returncode == 0, gated.stdout[-3000:]
    assert "llmperf: judged 1 of 1 benchmarks" in gated.stdout
    assert (project / "reports" / "junit.xml").is_file() and "| test_engine |" in (tmp_path / "summary.md").read_text()

    git(project, "checkout", "-q", "-b", "slower-decode")
    engine = project / "src" / "tinyengine" / "__init__.py"
    engine.write_text(engine.read_text().replace("DECODE_PASSES = 1", "DECODE_PASSES = 2"))
    git(project, "commit", "-qam", "decode twice")
    measured = run_step(project, venv, ab["Measure the change against its base"], tmp_path,
                        **{"github.base_ref": "main"})
    out = measured.stdout
    assert measured.returncode == 1, out[-3000:]
    assert "compared with origin/main" in out or "origin/main" in out
    assert "decode_token_ms (decode) at batch size 1 regressed" in out, out[-3000:]
    assert "prefill_ms (prefill) at batch size 1 regressed" not in out
    assert not list(project.glob(".git/worktrees/*"))  # the base's worktree is gone

