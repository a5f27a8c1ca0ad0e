"""Shared by tests/test_bisect_packages.py and scripts/bisect_packages_check.py: a user's project whose engine imports
12 packages, and a dependency bump of all of them.

The packages are local wheels (made with the plugin's own `write_wheel`, as tests/env_projects.py makes fastlib's),
committed in the project's `wheels/` and named by `--find-links wheels` in requirements.txt, as a repository that
vendors its wheels has them: GOOD pins every package at 1.0 and holds only the 1.0 wheels; BAD, the next commit,
pins 2.0 and adds the 2.0 wheels. Each package's module sets a factor of the simulated engine's decode time
(`SLOWDOWN`): 1.0 but where the case makes a 2.0 slower alone (`slow`), or only beside another package's 2.0
(`together`); a 2.0 may require another package's 2.0 (`requires`), so that uv cannot build it with that one's 1.0.
The engine's noise is seeded by the side's environment and the worker process (tests/bisect_projects.py's reasons).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from pytest_llmperf.environments.plugin_install import write_wheel

from .bisect_projects import git

PACKAGES = tuple(f"pkg{i:02d}" for i in range(1, 13))

TEST = """\
import importlib
import math
import os
import sys
import zlib

import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

PACKAGES = {packages!r}


@pytest.mark.llmperf(batch_sizes=[1], runs=3, warmups=0)
def test_engine(llmperf):
    slowdown = math.prod(importlib.import_module(name).SLOWDOWN for name in PACKAGES)
    process = int(os.environ.get("LLMPERF_WORKER_PROCESS", "0"))
    seed = ({seed}, zlib.crc32(sys.prefix.encode()), process)  # the sides draw apart, a rerun the same
    llmperf.measure(SimulatedBackend(decode_ms=4.0, noise={noise}, seed=seed, decode_slowdown=slowdown))
"""


def package_wheel(directory: Path, name: str, version: str, module: str, requires: tuple[str, ...] = ()) -> Path:
    """The wheel of `name` VERSION whose module is `module` (its source), requiring `requires`."""
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = [
        (f"{name}.py", module.encode()),
        (f"{info}/METADATA", metadata.encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    return write_wheel(directory / f"{name}-{version}-py3-none-any.whl", files, info)


def _module(name: str, version: str, slow: Mapping[str, float], together: tuple[str, str, float] | None) -> str:
    text = f"VERSION = {version!r}\n"
    if version == "2.0" and together and name == together[1]:
        return f"import {together[0]}\n\n{text}SLOWDOWN = {together[2]} if {together[0]}.VERSION == '2.0' else 1.0\n"
    return text + f"SLOWDOWN = {slow.get(name, 1.0) if version == '2.0' else 1.0}\n"


def _requirements(version: str) -> str:
    return "# what the engine imports\n--find-links wheels\n" + "".join(f"{p}=={version}\n" for p in PACKAGES)


def make_bump(
    root: Path,
    *,
    slow: Mapping[str, float] | None = None,
    together: tuple[str, str, float] | None = None,
    requires: Mapping[str, str] | None = None,
    seed: int = 0,
    noise: float = 0.02,
) -> tuple[str, str]:
    """A git repository at `root`: GOOD (every package at 1.0), then BAD (all at 2.0); their shas. `slow`: package ->
    its 2.0's factor; `together`: (a, b, factor), b's 2.0 slower by the factor beside a's 2.0 only; `requires`:
    package -> the package whose 2.0 its 2.0 requires."""
    slow, requires = slow or {}, requires or {}
    (root / "tests").mkdir(parents=True)
    (root / "wheels").mkdir()
    (root / "tests" / "test_engine.py").write_text(TEST.format(packages=PACKAGES, seed=seed, noise=noise))
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / ".gitignore").write_text("reports/\n.llmperf/\n__pycache__/\n")
    git(root, "init", "-q", "-b", "main")
    shas = []
    for version in ("1.0", "2.0"):
        for name in PACKAGES:
            needs = (f"{requires[name]}>={version}",) if name in requires and version == "2.0" else ()
            package_wheel(root / "wheels", name, version, _module(name, version, slow, together), needs)
        (root / "requirements.txt").write_text(_requirements(version))
        git(root, "add", "-A")
        git(root, "commit", "-qm", "GOOD: the packages at 1.0" if version == "1.0" else "BAD: every package to 2.0")
        shas.append(git(root, "rev-parse", "HEAD"))
    return shas[0], shas[1]


def run_check(root: Path, *args: str, env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`pytest-llmperf bisect ARGS` in the project, as a user runs it."""
    import sys

    return subprocess.run([sys.executable, "-m", "pytest_llmperf", "bisect", *args], cwd=root, env=dict(env),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
