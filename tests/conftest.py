import pytest

try:  # report/html.py imports matplotlib lazily; imported first inside a pytester in-process run, it is
    # dropped from sys.modules after that run and a second import mixes two copies of its classes
    import pytest_llmperf.report.plots  # noqa: F401
except ImportError:  # without the report extra the HTML page is skipped; its tests say so
    pass
# The statistics as well (scipy.stats, numpy.fft): the plugin imports them only when a campaign runs, and numpy's C
# modules refuse a second import in one process ("cannot load module more than once per process").
import pytest_llmperf.judge.procedure  # noqa: F401,E402
try:  # the same for torch, which --llmperf-instructions asks whether valgrind is supported: imported a second time
    # after a pytester run dropped it, its C extension fails ("SystemError: ... bad call flags", then a segfault)
    import torch  # noqa: F401
except ImportError:  # tox -e noextras
    pass


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    """Embedded models built once per test session, outside the user's cache."""
    import os

    cached = os.environ.get("LLMPERF_TEST_MODEL_CACHE")
    return cached if cached else str(tmp_path_factory.mktemp("models"))


@pytest.fixture(autouse=True)
def _measure_in_process(monkeypatch):
    """The suite's pytester runs measure in-process unless a test asks for worker processes
    (tests/test_workers.py): the default on the cpu target spawns workers, which these tests do not test."""
    monkeypatch.setenv("LLMPERF_PROCESSES", "1")


@pytest.fixture
def project(pytester, monkeypatch):
    """A pytester project as a new user's is: no LLMPERF_* variable or GitHub step summary inherited from the
    environment that runs the suite, an empty pytest.ini, measured in-process. A test file
    adds its own files by overriding it: `def project(project): project.makepyfile(...); return project`."""
    from pytest_llmperf.orchestrate.options import OPTIONS

    for option in OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("LLMPERF_PROCESSES", "1")  # cleared with the other options above
    pytester.makeini("[pytest]\n")
    return pytester
