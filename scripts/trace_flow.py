"""The way one benchmark takes through the package: which modules `llmperf.measure()` passes, in order.

Runs a benchmark test of the simulated engine in this process (a baseline first, then the gate), records every
call between pytest_llmperf modules while the gate's `llmperf.measure()` runs (sys.setprofile), and prints the
modules in the order they are first entered, and every call that ran from a lower layer back up to a higher one
(tests/test_layers.py's layers): the way should read downwards, orchestrate -> measure -> judge -> report.

    python scripts/trace_flow.py
"""

from __future__ import annotations

import sys
import tempfile
import textwrap
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEST = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1, 2], runs=10, warmups=0)
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend(seed=1, noise=0.01))
"""


class Tracer:
    """Collects the pytest_llmperf modules entered, and the calls between them, while `measure` of the fixture
    object runs."""

    def __init__(self) -> None:
        self.visits: list[str] = []
        self.calls: Counter[tuple[str, str]] = Counter()  # (caller, callee) between modules
        self.depth = 0  # > 0 while inside Benchmark.measure

    def __call__(self, frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event != "call":
            if event == "return" and frame.f_code.co_name == "measure" and \
                    frame.f_globals.get("__name__") == "pytest_llmperf.orchestrate.benchmark":
                self.depth -= 1
            return
        module = frame.f_globals.get("__name__", "")
        if module == "pytest_llmperf.orchestrate.benchmark" and frame.f_code.co_name == "measure":
            self.depth += 1
        if not self.depth or not module.startswith("pytest_llmperf."):
            return
        if module not in self.visits:
            self.visits.append(module)
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if caller.startswith("pytest_llmperf.") and caller != module:
            self.calls[(caller, module)] += 1


def main() -> int:
    import pytest

    with tempfile.TemporaryDirectory() as root:
        Path(root, "test_engine.py").write_text(textwrap.dedent(TEST))
        Path(root, "pytest.ini").write_text("[pytest]\n")
        args = [root, "-q", "-p", "no:cacheprovider", "--llmperf-device=cpu", "--llmperf-max-load=inf",
                "--llmperf-processes=1", f"--llmperf-baseline-dir={root}/baselines",
                f"--llmperf-report-dir={root}/reports",
                "-o", "llmperf_memory_rtol=100"]  # one process runs both sessions: its RSS grows between them
        if pytest.main([*args, "--llmperf-update"]) != 0:
            raise SystemExit("recording the baseline failed")
        tracer = Tracer()
        sys.setprofile(tracer)
        try:
            code = pytest.main(args)
        finally:
            sys.setprofile(None)
    from tests.test_layers import _layer

    short = [m.removeprefix("pytest_llmperf.") for m in tracer.visits]
    print(f"\nllmperf.measure() -> verdict: {len(short)} modules, in the order first entered:\n  " + " -> ".join(short))
    upward = {(a, b): n for (a, b), n in tracer.calls.items()
              if _layer(b.removeprefix("pytest_llmperf.")) > _layer(a.removeprefix("pytest_llmperf."))}
    print(f"{len(tracer.calls)} distinct calls between modules; calls back up a layer: "
          + (", ".join(f"{a} -> {b} ({n}x)" for (a, b), n in upward.items()) or "none"))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
