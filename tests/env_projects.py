"""Shared by tests/test_environments_*.py: small projects whose environments differ, made offline.

`fastlib` is a library as local wheels: its 2.0 does 10% more work than its 1.0. A uv project pins it in
pyproject.toml and a uv.lock that real uv writes (offline, from the project's own find-links); a requirements project
pins it in requirements.txt with `--find-links wheels`. Both keep their wheels inside the project, as a repository
would commit them, so each side's checkout finds its own.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pytest_llmperf.environments.build import find_uv
from pytest_llmperf.environments.plugin_install import write_wheel

#: Loop iterations of fastlib.work() per version: 2.0 does 10% more work than 1.0.
LOOPS = {"1.0": 200_000, "2.0": 220_000, "3.0": 240_000}

FASTLIB = """\
__version__ = "{version}"
LOOPS = {loops}


def work():
    total = 0
    for i in range(LOOPS):
        total += i * i
    return total
"""


def fastlib_wheel(directory: Path, version: str, *, loops: int | None = None) -> Path:
    """fastlib VERSION as a wheel in `directory` (a plain zip: what uv installs from); `loops`: its work (default
    LOOPS[version]), for a wheel rebuilt under the same version."""
    info = f"fastlib-{version}.dist-info"
    files = [
        ("fastlib.py", FASTLIB.format(version=version, loops=loops or LOOPS[version]).encode()),
        (f"{info}/METADATA", f"Metadata-Version: 2.1\nName: fastlib\nVersion: {version}\n".encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    return write_wheel(directory / f"fastlib-{version}-py3-none-any.whl", files, info)


def _wheels(root: Path, versions: tuple[str, ...]) -> None:
    for version in versions:
        fastlib_wheel(root / "wheels", version)


def uv_project(root: Path, version: str, *, wheels: tuple[str, ...] = ("1.0", "2.0"), lock: bool = True) -> Path:
    """A uv project pinning fastlib==VERSION, locked by real uv offline."""
    root.mkdir(parents=True, exist_ok=True)
    _wheels(root, wheels)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0.1.0"\nrequires-python = ">=3.10"\n'
        f'dependencies = ["fastlib=={version}"]\n\n'
        '[tool.uv]\npackage = false\nfind-links = ["wheels"]\n'
    )
    if lock:
        uv = find_uv()
        done = subprocess.run([uv.path, "lock", "--offline", "--no-cache", "-q"], cwd=root, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    return root


def uv_workspace(root: Path, version: str) -> Path:
    """A uv workspace whose member packages/engine requires fastlib>=1.0, locked by real uv offline at the workspace's
    root when VERSION was the newest wheel there (so the lock alone says which: the pyproject.toml files are the same
    on both sides); returns the member's directory (where its benchmarks' rootdir would be)."""
    member = root / "packages" / "engine"
    member.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "root"\nversion = "0.1.0"\nrequires-python = ">=3.10"\ndependencies = []\n\n'
        '[tool.uv]\npackage = false\nfind-links = ["wheels"]\n\n[tool.uv.workspace]\nmembers = ["packages/*"]\n'
    )
    (member / "pyproject.toml").write_text(
        '[project]\nname = "engine"\nversion = "0.1.0"\nrequires-python = ">=3.10"\ndependencies = ["fastlib>=1.0"]\n'
    )
    _wheels(root, tuple(v for v in ("1.0", "2.0") if v <= version))
    done = subprocess.run([find_uv().path, "lock", "--offline", "--no-cache", "-q"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    _wheels(root, ("1.0", "2.0"))  # both committed by now: the lock decides
    return member


def workspace_with_a_library(root: Path, loops: int) -> Path:
    """A uv workspace whose member packages/bench (returned: where its benchmarks' rootdir would be) depends on the
    workspace's library packages/lib, whose `LOOPS` is `loops`; lib is built by uv's own backend (no download), the
    workspace locked by real uv offline."""
    lib, bench = root / "packages" / "lib", root / "packages" / "bench"
    (lib / "src" / "lib").mkdir(parents=True, exist_ok=True)
    bench.mkdir(parents=True, exist_ok=True)
    head = '[project]\nname = "{}"\nversion = "0.1.0"\nrequires-python = ">=3.10"\n'
    (root / "pyproject.toml").write_text(head.format("root") + '[tool.uv]\npackage = false\n[tool.uv.workspace]\n'
                                         'members = ["packages/*"]\n')  # fmt: skip
    uv = find_uv()
    backend = f'[build-system]\nrequires = ["uv_build=={uv.version}"]\nbuild-backend = "uv_build"\n'
    (lib / "pyproject.toml").write_text(head.format("lib") + backend)
    (lib / "src" / "lib" / "__init__.py").write_text(f"LOOPS = {loops}\n")
    (bench / "pyproject.toml").write_text(head.format("bench") + 'dependencies = ["lib"]\n[tool.uv.sources]\n'
                                          'lib = { workspace = true }\n')  # fmt: skip
    done = subprocess.run([uv.path, "lock", "--offline", "--no-cache", "-q"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return bench


def requirements_project(root: Path, version: str, *, wheels: tuple[str, ...] = ("1.0", "2.0")) -> Path:
    """A project whose requirements.txt pins fastlib==VERSION, with its wheels as find-links."""
    root.mkdir(parents=True, exist_ok=True)
    _wheels(root, wheels)
    (root / "requirements.txt").write_text(f"# what the benchmarks import\n--find-links wheels\nfastlib=={version}\n")
    return root


def run_in(python: str, code: str) -> str:
    """What `python -c CODE` prints (it must succeed)."""
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
