"""What each side's environment costs here (docs/environments.md quotes it): detecting unchanged dependencies, a
first build of both sides (nothing cached), a pull request's first build against a main already built (uv's cache
and the base's environment warm), and a rerun (both environments reused). Offline, with the fastlib projects of
tests/env_projects.py (a uv.lock project and a requirements project), in a temporary directory.

    .tox/test/bin/python scripts/env_build_cost.py [--no-compile] [--repeat N]
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


def main() -> int:
    from pytest_llmperf.environments.detection import detect
    from pytest_llmperf.environments.plan import prepare
    from pytest_llmperf.environments.records import BuildSettings
    from tests.env_projects import requirements_project, uv_project

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-compile", action="store_true", help="leave bytecode to import time")
    parser.add_argument("--repeat", type=int, default=20, help="detections of unchanged inputs timed")
    args = parser.parse_args()
    settings = BuildSettings(offline=True, compile_bytecode=not args.no_compile)
    with tempfile.TemporaryDirectory(prefix="llmperf-env-cost-") as scratch:
        root = Path(scratch)
        os.environ["UV_CACHE_DIR"] = str(root / "uv-cache")  # cold: nothing unpacked yet
        for kind, make in (("uv.lock", uv_project), ("requirements", requirements_project)):
            base = make(root / kind / "base", "1.0", wheels=("1.0", "2.0", "3.0"))
            same = root / kind / "same"
            shutil.copytree(base, same)
            seconds = [timed(lambda: detect(base, same))[0] for _ in range(args.repeat)]
            fresh = subprocess.run(
                [sys.executable, "-c", "import time; t = time.perf_counter(); "
                 "from pytest_llmperf.environments.detection import detect; "
                 f"d = detect({str(base)!r}, {str(same)!r}); print(d.status, time.perf_counter() - t)"],
                capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1],
            ).stdout.split()  # fmt: skip
            print(f"{kind}: unchanged detection, median of {args.repeat}: {statistics.median(seconds) * 1000:.2f} ms "
                  f"in process; {float(fresh[1]) * 1000:.1f} ms with its import in a fresh interpreter ({fresh[0]})")
            env_dir = root / kind / "envs"
            for label, head_version in (("first build, nothing cached", "2.0"),
                                        ("a new head against a built base", "3.0"),
                                        ("rerun", "3.0")):  # fmt: skip
                head = root / kind / f"head-{head_version}"
                if not head.exists():
                    make(head, head_version, wheels=("1.0", "2.0", "3.0"))
                wall, envs = timed(lambda: prepare(detect(base, head), env_dir=env_dir, settings=settings))
                sides = ", ".join(f"{s.side} {s.how} {s.build_seconds:.2f} s" for s in (envs.base, envs.head))
                print(f"{kind}: {label}: {wall:.2f} s ({sides}; compile_bytecode={settings.compile_bytecode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
