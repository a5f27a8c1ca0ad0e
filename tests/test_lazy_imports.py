"""Installing the plugin must never break pytest: the entry point imports only the core, and a fixture whose
extra is missing fails its own test in one line naming the extra (the other tests run as usual).

The "missing" extras are simulated in a subprocess by an import hook that refuses their modules, the way a
venv without them would; tox -e noextras does the same with a real install without extras.
"""

import re
import subprocess
import sys
import textwrap

import pytest

#: What `import pytest_llmperf.plugin` may add to what `import pytest` already imported (top-level names,
#: standard library aside): pytest loads the plugin in every run, so numpy, scipy and the rest load when a
#: benchmark runs.
CORE = {"psutil", "pytest_llmperf"}
#: Never at import: the statistics, the plots, the models.
HEAVY = {"numpy", "scipy", "matplotlib", "torch", "transformers"}

HF_MODULES = ("torch", "transformers", "tokenizers", "safetensors")
EVERY_EXTRA = (*HF_MODULES, "huggingface_hub", "httpx", "httpx2", "openai", "aiohttp", "grpc", "google.protobuf",
               "jetstream")

RUNNER = """
import importlib.abc, sys

BLOCKED = [name for name in sys.argv[1].split(",") if name]


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
import pytest

sys.exit(pytest.main(sys.argv[2:]))
"""

TESTS = """
def test_plain():
    assert 1 + 1 == 2

def test_servers(llmperf_servers):
    assert llmperf_servers.processes == []

def test_hf(llmperf_hf):
    llmperf_hf("tiny-llama")

def test_offload(llmperf_offload):
    llmperf_offload("tiny-mixtral")

def test_tgi(llmperf_tgi):
    llmperf_tgi(model_id="some/model")

def test_openai(llmperf_openai):
    llmperf_openai(["some-server", "--port", "{port}"])

def test_vllm(llmperf_vllm):
    llmperf_vllm("tiny-llama")

def test_jetstream(llmperf_jetstream):
    llmperf_jetstream(["some-server", "--port", "{port}"])
"""


def test_the_plugin_imports_only_the_core():
    probe = textwrap.dedent("""
        import sys
        import pytest
        before = {m.split(".")[0] for m in sys.modules}
        import pytest_llmperf, pytest_llmperf.plugin
        after = {m.split(".")[0] for m in sys.modules}
        print(sorted(m for m in after - before if m not in sys.stdlib_module_names and not m.startswith("_")))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    added = set(eval(out))
    assert added <= CORE, f"the plugin's entry point imports {sorted(added - CORE)}: import them where they are used"
    assert not added & HEAVY and "pytest_llmperf" in added  # the probe sees imports at all


HEAVY_AT_THE_END = f"""
import sys

def pytest_unconfigure(config):
    print("heavy at the end:", sorted({{m.split(".")[0] for m in sys.modules}} & set({sorted(HEAVY)!r})))
"""


@pytest.mark.parametrize("args", [(), ("--llmperf-processes=1",), ("--llmperf-compare=HEAD",),
                                  ("--llmperf-device=a100",), ("--llmperf-update",)],
                         ids=["defaults", "in-process", "compare", "gpu-target", "update"])
def test_a_session_without_benchmarks_loads_nothing_heavy(pytester, args):
    """Every hook the plugin runs in a session (configure, the header, collection's settings check, the summary,
    sessionfinish) stays off the statistics when no benchmark is selected: a project's plain test run pays nothing
    for having the plugin installed (it paid 0.7 s of scipy.stats on every run before)."""
    pytester.makeconftest(HEAVY_AT_THE_END)
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", *args)
    result.stdout.fnmatch_lines(["*heavy at the end: []*"])
    result.assert_outcomes(passed=1)


def test_the_offload_package_loads_its_names_on_first_use():
    probe = ("import sys; import pytest_llmperf.offload as o; assert 'torch' not in sys.modules; "
             "from pytest_llmperf.offload import OffloadEngine, OffloadOptions; assert 'torch' in sys.modules; "
             "assert o.OffloadEngine is OffloadEngine and 'OffloadBackend' in o.__all__ and 'Scheduler' in dir(o); "
             "assert not hasattr(o, 'NoSuchName')")
    subprocess.run([sys.executable, "-c", probe], check=True)


def _run(pytester: pytest.Pytester, blocked: tuple[str, ...], *args: str) -> pytest.RunResult:
    pytester.makepyfile(runner=RUNNER, test_backends=TESTS)
    return pytester.run(sys.executable, "runner.py", ",".join(blocked), "-p", "no:cacheprovider",
                        "--llmperf-device=cpu", *args)


def test_with_no_extra_installed_pytest_runs_and_each_backend_fixture_fails_naming_its_extra(pytester):
    result = _run(pytester, EVERY_EXTRA, "test_backends.py")
    result.assert_outcomes(passed=2, failed=6)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines_random([
        "llmperf_hf needs torch and transformers: "
        "pip install pytest-llmperf[[]hf] (No module named 'torch')",
        "llmperf_offload needs torch and transformers: "
        "pip install pytest-llmperf[[]hf] (No module named 'torch')",
        "llmperf_tgi needs huggingface_hub (>= 2.0, on httpx2) and httpx: "
        "pip install pytest-llmperf[[]tgi] (No module named 'huggingface_hub')",
        "llmperf_openai needs aiohttp (the client) and httpx (health checks): "
        "pip install pytest-llmperf[[]openai] (No module named 'aiohttp')",
        "llmperf_vllm needs aiohttp (the client) and httpx (health checks): "
        "pip install pytest-llmperf[[]openai] (No module named 'aiohttp')",
        "llmperf_jetstream needs grpcio, protobuf and JetStream's gRPC "
        "stubs: pip install pytest-llmperf[[]jetstream] && pip install --no-deps google-jetstream "
        "(No module named 'grpc')",
    ])
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output and "Traceback" not in output
    assert not re.search(r"test_backends\.py:\d+", output)  # one line per failure, no source excerpt (pytrace=False)


def test_vllm_on_an_embedded_model_needs_the_hf_extra_to_build_it(pytester):
    result = _run(pytester, HF_MODULES, "test_backends.py", "-k", "hf or offload or vllm")
    result.assert_outcomes(failed=3, deselected=5)
    result.stdout.fnmatch_lines_random([
        "llmperf_hf needs torch and transformers: *[[]hf]*",
        "llmperf_vllm (to build the embedded model 'tiny-llama') needs torch "
        "and transformers: pip install pytest-llmperf[[]hf] (No module named 'torch')",
    ])


def test_with_no_extra_installed_pytest_help_and_plain_tests_work(pytester):
    help_run = _run(pytester, EVERY_EXTRA, "--help")
    assert help_run.ret == pytest.ExitCode.OK
    help_run.stdout.fnmatch_lines(["*--llmperf-device*"])
    plain = _run(pytester, EVERY_EXTRA, "test_backends.py", "-k", "plain or servers")
    plain.assert_outcomes(passed=2, deselected=6)
    assert plain.ret == pytest.ExitCode.OK


def test_a_worker_process_does_not_import_the_judge():
    """A worker hands its results to the controller: it needs no statistics. scipy.stats at import renders its
    docstrings' examples from unseeded generators, which moves a counting worker's memory layout from process to
    process (docs/notes/instructions.md, "Where the spread comes from"), and costs ~6 s under valgrind."""
    probe = textwrap.dedent("""
        import sys
        import pytest_llmperf.plugin, pytest_llmperf.orchestrate.benchmark, pytest_llmperf.orchestrate.worker
        import pytest_llmperf.orchestrate.items, pytest_llmperf.orchestrate.controller
        print(sorted(m for m in sys.modules if m == "scipy.stats" or m.startswith("pytest_llmperf.judge.procedure")))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
