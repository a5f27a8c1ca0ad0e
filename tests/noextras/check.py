"""tox -e noextras: pytest where pytest-llmperf is installed without extras (`pip install .`: no torch, no clients).

In a fresh directory (a user's project: not this repository's conftest or sources), it checks that
`pytest --help` works, a plain test file passes, and a test that uses `llmperf_hf` fails in one line
naming the [hf] extra while the plain test still passes: exit code 1, never 3 (INTERNALERROR) or 4.
Exits non-zero, saying what differed, otherwise.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
HF_LINE = ("llmperf_hf needs torch and transformers: pip install pytest-llmperf[hf] "
           "(No module named 'torch')")


def pytest_in(directory: str, *args: str) -> subprocess.CompletedProcess[str]:
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=directory,
                         capture_output=True, text=True)
    print(f"$ pytest {' '.join(args)}  -> exit {run.returncode}\n{run.stdout[-1500:]}{run.stderr[-1500:]}")
    return run


def main() -> int:
    problems = []
    present = [m for m in ("torch", "transformers", "aiohttp", "httpx", "grpc", "huggingface_hub")
               if importlib.util.find_spec(m) is not None]
    if present:
        problems.append(f"this env has {', '.join(present)}: it must have pytest-llmperf without extras")
    if importlib.util.find_spec("pytest_llmperf") is None:
        problems.append("pytest-llmperf is not installed in this env")
    with tempfile.TemporaryDirectory() as project:
        for name in ("plain.py", "uses_hf.py"):
            shutil.copy(HERE / name, project)
        helped = pytest_in(project, "--help")
        if helped.returncode != 0 or "--llmperf-device" not in helped.stdout:
            problems.append(f"pytest --help: exit {helped.returncode}, want 0 and the llmperf options listed")
        plain = pytest_in(project, "plain.py")
        if plain.returncode != 0 or "1 passed" not in plain.stdout:
            problems.append(f"pytest plain.py: exit {plain.returncode}, want 0 with 1 passed")
        both = pytest_in(project, "plain.py", "uses_hf.py")
        output = both.stdout + both.stderr
        if both.returncode != 1 or "1 failed, 1 passed" not in output:
            problems.append(f"pytest plain.py uses_hf.py: exit {both.returncode}, want 1 with 1 failed, 1 passed")
        if HF_LINE not in output:
            problems.append(f"pytest uses_hf.py: the failure does not say {HF_LINE!r}")
        if "INTERNALERROR" in output or "Traceback" in output:
            problems.append("pytest uses_hf.py: an INTERNALERROR or a traceback in the output")
    for problem in problems:
        print(f"noextras: FAILED: {problem}")
    if not problems:
        print("noextras: OK: without extras pytest runs, --help works, and llmperf_hf fails naming [hf]")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
