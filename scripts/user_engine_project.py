"""The issue-52 user project: the README's own-backend shape, a `decode_step()` of about 3 ms of numpy.

A git repository with three commits, as a pull request would have them:

- `base`: the package `myengine` (engine.py: `MyEngine.decode_step()`, STEP_LAYERS applications of the README's
  numpy layer, ~3 ms at batch 1), its pytest-llmperf test (tests/perf/test_my_engine.py, the README's marker) and
  an asv benchmark of the same `decode_step()` (benchmarks/benchmarks.py, asv.conf.json);
- `slower`: decode_step() does 10% more work (STEP_LAYERS 40 -> 44; prefill unchanged);
- `comment`: the base with a comment added, nothing else.

Used by scripts/gate_vs_asv.py (the comparison with asv) and scripts/run_split.py (how a job's noise splits
between processes and runs). `truth()` times decode_step() of two commits directly, alternating fresh processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

STEP_LAYERS = 40
SLOWER_LAYERS = 44  # 10% more work in decode_step()

ENGINE = '''"""A user's inference engine: numpy stands in for the model."""
import numpy as np

STEP_LAYERS = {layers}


class MyEngine:
    def __init__(self, hidden: int = 256) -> None:
        self.weights = np.random.default_rng(0).standard_normal((hidden, hidden)).astype(np.float32) / hidden**0.5

    def layer(self, x: np.ndarray) -> np.ndarray:  # the README's layer
        return np.tanh(x[..., :, None] * self.weights).mean(axis=-2)

    def prefill(self, prompts: np.ndarray) -> np.ndarray:
        return self.layer(prompts)[:, -1]

    def decode_step(self, state: np.ndarray) -> np.ndarray:
        for _ in range(STEP_LAYERS):
            state = self.layer(state)
        return state
'''

TEST = '''import time

import numpy as np
import pytest
from pytest_llmperf import Backend, GenerationRequest, RunSample

from myengine.engine import MyEngine


class MyBackend(Backend):
    kind = "my-engine"
    splits_prefill = True

    def __init__(self) -> None:
        super().__init__()
        self.engine = MyEngine()

    def generate(self, request: GenerationRequest) -> RunSample:
        start = time.perf_counter_ns()
        hidden = len(self.engine.weights)
        prompts = np.ones((request.batch_size, request.sequence_length, hidden), np.float32)
        state = self.engine.prefill(prompts)
        times = [time.perf_counter_ns() - start]
        tokens = [[int(i)] for i in state.argmax(axis=1)]
        steps = []
        for _ in range(request.decode_length - 1):
            step = time.perf_counter_ns()
            state = self.engine.decode_step(state)
            for sequence, token in zip(tokens, state.argmax(axis=1)):
                sequence.append(int(token))
            steps.append(time.perf_counter_ns() - step)
            times.append(time.perf_counter_ns() - start)
        return RunSample(batch_size=request.batch_size, token_times_ns=[times] * request.batch_size,
                         end_to_end_ns=times[-1], prefill_ns=times[0], decode_steps_ns=steps, output_ids=tokens)

    def describe(self) -> dict:
        return {"backend": self.kind, "model": "layer-256", "dtype": "fp32", "device": "cpu"}


@pytest.fixture(scope="session")
def engine():
    with MyBackend() as backend:
        yield backend


@pytest.mark.llmperf(batch_sizes=[1, 4], sequence_length=16, decode_length=16)
def test_my_engine(llmperf, engine):
    llmperf.measure(engine)
'''

ASV_BENCHMARKS = '''import numpy as np

from myengine.engine import MyEngine


class DecodeStep:
    def setup(self):
        self.engine = MyEngine()
        self.state = np.ones((1, len(self.engine.weights)), np.float32)

    def time_decode_step(self):
        self.engine.decode_step(self.state)
'''

PYPROJECT = '''[project]
name = "myengine"
version = "0.1"
dependencies = ["numpy"]

[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[tool.setuptools]
packages = ["myengine"]
'''


def asv_config(python: str, wheels: Path) -> dict:
    """asv.conf.json: a virtualenv per commit, built and installed offline (wheels: numpy's wheel, found here)."""
    return {
        "version": 1,
        "project": "myengine",
        "repo": ".",
        "branches": ["HEAD"],
        "environment_type": "virtualenv",
        "pythons": [python],
        "matrix": {"req": {}},
        "build_command": ["python -m pip wheel --no-deps --no-index --no-build-isolation -w {build_cache_dir} {build_dir}"],
        "install_command": [f"in-dir={{env_dir}} python -m pip install --no-index --find-links {wheels} "
                            "{wheel_file} numpy"],
        "uninstall_command": ["return-code=any python -m pip uninstall -y {project}"],
        "benchmark_dir": "benchmarks",
        "env_dir": ".asv/env",
        "results_dir": ".asv/results",
        "html_dir": ".asv/html",
    }


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.email=u@example.com", "-c", "user.name=u", *args], cwd=root,
                          check=True, capture_output=True, text=True)
    return done.stdout.strip()


def make(root: Path, *, python: str = sys.executable, wheels: Path | None = None) -> dict[str, str]:
    """Write the project into `root` (a new git repository) and commit its three states; {name: commit}."""
    (root / "myengine").mkdir(parents=True)
    (root / "myengine" / "__init__.py").write_text("")
    (root / "myengine" / "engine.py").write_text(ENGINE.format(layers=STEP_LAYERS))
    (root / "tests" / "perf").mkdir(parents=True)
    (root / "tests" / "perf" / "test_my_engine.py").write_text(TEST)
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "__init__.py").write_text("")
    (root / "benchmarks" / "benchmarks.py").write_text(ASV_BENCHMARKS)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "asv.conf.json").write_text(json.dumps(asv_config(python, wheels or root), indent=2))
    (root / ".gitignore").write_text(".asv/\nreports/\nbaselines/\n*.egg-info/\nbuild/\n__pycache__/\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "engine and its perf tests")
    commits = {"base": _git(root, "rev-parse", "HEAD")}
    engine = root / "myengine" / "engine.py"
    _git(root, "checkout", "-qb", "slower")
    engine.write_text(ENGINE.format(layers=SLOWER_LAYERS))
    _git(root, "commit", "-qam", "decode_step: 10% more work")
    commits["slower"] = _git(root, "rev-parse", "HEAD")
    _git(root, "checkout", "-q", "main")
    _git(root, "checkout", "-qb", "comment")
    engine.write_text(ENGINE.format(layers=STEP_LAYERS).replace("    def layer(", "    # the model's one layer\n"
                                                                   "    def layer(", 1))
    _git(root, "commit", "-qam", "a comment")
    commits["comment"] = _git(root, "rev-parse", "HEAD")
    _git(root, "checkout", "-q", "main")
    return commits


TIMER = '''import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from myengine.engine import MyEngine
e = MyEngine()
state = np.ones((int(sys.argv[2]), len(e.weights)), np.float32)
for _ in range(20):
    e.decode_step(state)
times = []
for _ in range(200):
    t = time.perf_counter_ns(); e.decode_step(state); times.append(time.perf_counter_ns() - t)
print(float(np.quantile(times, 0.25)) / 1e6)  # the lower quartile: a call preempted by a neighbour is not the code
'''


def truth(
    root: Path, commits: tuple[str, str], processes: int = 10, python: str = sys.executable, batch_size: int = 1
) -> float:
    """decode_step() of commits[1] over commits[0] at `batch_size`, timed directly: the lower quartile of each fresh
    process's 200 calls, the two alternating (ABBA), the ratio of their medians over `processes` processes each."""
    import statistics
    import tempfile

    times: dict[str, list[float]] = {c: [] for c in commits}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for c in commits:
            trees[c] = Path(tmp) / c
            subprocess.run(["git", "worktree", "add", "-q", "--detach", str(trees[c]), c], cwd=root, check=True)
        try:
            for i in range(processes):
                for c in commits if i % 2 == 0 else commits[::-1]:
                    done = subprocess.run([python, "-c", TIMER, str(trees[c]), str(batch_size)], check=True,
                                          capture_output=True, text=True)
                    times[c].append(float(done.stdout))
        finally:
            for c in commits:
                subprocess.run(["git", "worktree", "remove", "--force", str(trees[c])], cwd=root)
    return statistics.median(times[commits[1]]) / statistics.median(times[commits[0]])
