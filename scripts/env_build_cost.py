"""What each side's environment costs here (docs/environments.md quotes it, issue 47's goals).

Small projects (the fastlib projects of tests/env_projects.py: a uv.lock one and a requirements one, offline):
detecting unchanged dependencies, a first build of both sides (nothing cached), a pull request's head against a base
already built, a rerun (both reused), and a form-only edit of pyproject.toml (uv's cache warm).

With --torch: a torch + transformers project (requirements.txt: a find-links line to torch's CPU wheel, torch, and
transformers at the base's and the head's version), uv's cache warmed once by a throwaway build of both sides, then a
new environment for both sides, a rerun, and the first and second import of torch + transformers in each (the
workers write the bytecode into the environment once).

    .tox/test/bin/python scripts/env_build_cost.py [--repeat N]
    .tox/test/bin/python scripts/env_build_cost.py --torch [--find-links /opt/wheels] [--versions 5.18.0 5.24.0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(call):
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def said(label, wall, envs):
    sides = ", ".join(f"{s.side} {s.how} {s.build_seconds or 0:.2f} s" for s in (envs.base, envs.head))
    print(f"{label}: {wall:.2f} s ({sides}; {envs.summary_line()})", flush=True)


def small(root: Path, repeat: int) -> None:
    from pytest_llmperf.environments.inputs import detect
    from pytest_llmperf.environments.plan import prepare
    from pytest_llmperf.environments.records import BuildSettings
    from tests.env_projects import requirements_project, uv_project

    settings = BuildSettings(offline=True)
    os.environ["UV_CACHE_DIR"] = str(root / "uv-cache")  # cold: nothing unpacked yet
    for kind, make in (("uv.lock", uv_project), ("requirements", requirements_project)):
        base = make(root / kind / "base", "1.0", wheels=("1.0", "2.0", "3.0"))
        same = root / kind / "same"
        shutil.copytree(base, same)
        seconds = [timed(lambda: detect(base, same))[0] for _ in range(repeat)]
        print(f"{kind}: unchanged detection, median of {repeat}: {statistics.median(seconds) * 1000:.2f} ms")
        env_dir = root / kind / "envs"
        for label, head_version in (("first build, nothing cached", "2.0"), ("a new head against a built base", "3.0"),
                                    ("rerun, both reused", "3.0")):  # fmt: skip
            head = root / kind / f"head-{head_version}"
            if not head.exists():
                make(head, head_version, wheels=("1.0", "2.0", "3.0"))
            said(f"{kind}: {label}", *timed(lambda: prepare(detect(base, head), env_dir=env_dir, settings=settings)))
        pyproject = same / "pyproject.toml"
        if pyproject.exists():  # a form-only edit: the job builds the head once, then runs shared
            pyproject.write_text(pyproject.read_text() + '\n[tool.ruff]\nline-length = 100\n')
            said(f"{kind}: a form-only edit of pyproject.toml, uv's cache warm",
                 *timed(lambda: prepare(detect(base, same), env_dir=env_dir, settings=settings)))  # fmt: skip


def torch_project(root: Path, find_links: str, versions: list[str]) -> None:
    from pytest_llmperf.environments.inputs import detect
    from pytest_llmperf.environments.plan import prepare

    sides = []
    for side, version in zip(("base", "head"), versions):
        (root / side).mkdir(parents=True)
        (root / side / "requirements.txt").write_text(f"--find-links {find_links}\ntorch==2.13.0\n"
                                                      f"transformers=={version}\n")  # fmt: skip
        sides.append(root / side)
    said("torch: warming uv's cache (a throwaway build of both sides)",
         *timed(lambda: prepare(detect(*sides), env_dir=root / "warm-envs", cpu_target=True)))  # fmt: skip
    said("torch: a new environment for both sides, uv's cache warm",
         *timed(lambda: prepare(detect(*sides), env_dir=root / "envs", cpu_target=True)))  # fmt: skip
    wall, envs = timed(lambda: prepare(detect(*sides), env_dir=root / "envs", cpu_target=True))
    said("torch: rerun, both reused", wall, envs)
    code = "import time; t = time.perf_counter(); import torch, transformers; print(f'{time.perf_counter() - t:.2f}')"
    for side in (envs.base, envs.head):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = side.pycache
        first, second = (subprocess.run([side.python, "-c", code], env=env, capture_output=True, text=True,
                                        check=True).stdout.strip() for _ in range(2))  # fmt: skip
        print(f"torch: {side.side} side, import torch + transformers: first {first} s (writes bytecode), then {second} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="detections of unchanged inputs timed")
    parser.add_argument("--torch", action="store_true", help="a torch + transformers project instead")
    parser.add_argument("--find-links", default="/opt/wheels", help="where torch's CPU wheel lies (--torch)")
    parser.add_argument("--versions", nargs=2, default=["5.18.0", "5.24.0"], help="transformers: base, head")
    parser.add_argument("--uv-cache", help="uv's cache for --torch (default: a temporary one, cold)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmperf-env-cost-") as scratch:
        if args.torch:
            os.environ["UV_CACHE_DIR"] = args.uv_cache or str(Path(scratch) / "uv-cache")
            torch_project(Path(scratch), args.find_links, args.versions)
        else:
            small(Path(scratch), args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
