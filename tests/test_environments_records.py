"""The environments' records as the report reads them (JSON both ways, the header's lines), what a worker imported,
and the option values (pytest_llmperf/environments/records.py, installed.py; orchestrate/options.py)."""

from __future__ import annotations

import json
import sys

import pytest

from pytest_llmperf.environments.installed import check_imported, imported_distributions, installed_here
from pytest_llmperf.environments.records import (
    BASE_PYTHON,
    BUILT,
    CACHE_HIT,
    CODE_ONLY,
    CURRENT,
    SHARED,
    Environments,
    PackageChange,
    SideEnvironment,
    held_changes,
)
from pytest_llmperf.orchestrate import options

BUMP = (PackageChange("torch", "2.5.1", "2.6.0"), PackageChange("triton", "3.1.0", "3.2.0"))


def built(side, how, seconds, torch):
    return SideEnvironment(side, how, f"/envs/{side}/bin/python", "CPython 3.11.7", f"{side}0123456789abcdef",
                           f"/envs/{side}", "uv.lock", seconds, {"torch": torch, "triton": "3.1.0"})  # fmt: skip


def test_per_side_environments_round_trip_through_json_and_read_in_the_header():
    envs = Environments("auto", "changed", built("base", CACHE_HIT, 0.21, "2.5.1"), built("head", BUILT, 41.0, "2.6.0"),
                        ("uv.lock",), BUMP, notes=("a note",), detect_seconds=0.01)  # fmt: skip
    data = json.loads(json.dumps(envs.to_json()))  # as the JSON report keeps it, and its markdown reads it back
    assert data["summary"] == envs.summary_line() and data["measured"] is True and data["files"] == ["uv.lock"]
    assert data["base"]["installed"] == {"torch": "2.5.1", "triton": "3.1.0"} and data["head"]["how"] == BUILT
    assert data["notes"] == ["a note"] and data["detect_seconds"] == 0.01
    assert data["changes"][0] == {"name": "torch", "base": "2.5.1", "head": "2.6.0"}  # as the markdown report reads it
    assert envs.summary_line() == ("environments: per side (torch 2.5.1 -> 2.6.0; triton 3.1.0 -> 3.2.0; "
                                   "base cache hit 0.2 s, head built 41.0 s) [auto]")  # fmt: skip
    assert envs.summary_lines("base origin/main@abc1234", "head HEAD@def5678")[1:] == [
        "  base origin/main@abc1234: env base01234567 from uv.lock, CPython 3.11.7, cache hit 0.2 s",
        "  head HEAD@def5678:        env head01234567 from uv.lock, CPython 3.11.7, built 41.0 s",
        "  packages that differ (2): torch 2.5.1 -> 2.6.0; triton 3.1.0 -> 3.2.0",
        "  note: a note",
    ]


def test_a_package_that_no_worker_imported_is_said_once_the_workers_ran():
    envs = Environments("auto", "changed", built("base", BUILT, 1.0, "2.5.1"), built("head", BUILT, 1.0, "2.6.0"),
                        ("requirements.txt",), (*BUMP, PackageChange("tabulate", "0.9.0", "0.10.0")))  # fmt: skip
    lines = envs.shown_lines("A", "B", imported={"torch", "triton", "numpy"})
    assert "  tabulate 0.9.0 -> 0.10.0: imported by no benchmark" in lines
    assert not any("torch" in line and "imported by no" in line for line in lines)
    assert not any("imported by no" in line for line in envs.shown_lines("A", "B"))  # before the workers ran


def test_what_two_environments_hold_differently():
    base, head = {"torch": "2.5.1", "numpy": "2.2.6", "old": "1"}, {"torch": "2.6.0", "numpy": "2.2.6", "new": "2"}
    assert [str(c) for c in held_changes(base, head)] == ["+new 2", "-old 1", "torch 2.5.1 -> 2.6.0"]
    # A wheel rebuilt under the same version holds other files: a change, said as such.
    changes = held_changes({"fastlib": "1.0"}, {"fastlib": "1.0"}, {"fastlib": "aaaa"}, {"fastlib": "bbbb"})
    assert [str(c) for c in changes] == ["fastlib 1.0 -> 1.0 (other files)"]
    assert held_changes({"fastlib": "1.0"}, {"fastlib": "1.0"}, {"fastlib": "aaaa"}, {"fastlib": "aaaa"}) == ()


def test_code_only_and_shared_summaries():
    side = SideEnvironment("base", CODE_ONLY, sys.executable, installed={"torch": "2.6.0"})
    head = SideEnvironment("head", CODE_ONLY, sys.executable, installed={"torch": "2.6.0"})
    missed = ("uv.lock differ (both sides ran this environment)",)
    envs = Environments("code-only", "changed", side, head, ("uv.lock",), not_measured=missed)
    assert envs.summary_line() == ("environments: DEPENDENCY CHANGES NOT MEASURED: uv.lock differ (both sides ran "
                                   "this environment) [code-only]")  # fmt: skip
    assert not envs.measured and not envs.per_side
    shared = SideEnvironment("base", SHARED, sys.executable)
    same = Environments("auto", "changed", shared, shared, ("requirements.txt",))
    assert same.summary_line() == ("environments: shared (requirements.txt differ; both sides' environments hold the "
                                   "same packages) [auto]")  # fmt: skip
    noted = Environments("auto", "changed", shared, shared, ("poetry.lock",), notes=("poetry.lock differ: ...",))
    assert "  note: poetry.lock differ: ..." in noted.shown_lines("A", "B")
    assert Environments("auto", "unchanged", shared, shared).shown_lines("A", "B") == [
        "environments: shared (dependency files unchanged) [auto]"]  # fmt: skip


def test_a_package_change_reads_as_its_direction():
    assert [str(PackageChange("newpkg", None, "1.0")), str(PackageChange("oldpkg", "0.3", None))] == [
        "+newpkg 1.0",
        "-oldpkg 0.3",
    ]


def test_the_distributions_behind_imported_modules():
    import pytest as imported  # noqa: F401  (what the fingerprint names: pytest's distribution, at its version)

    found = imported_distributions(["pytest", "_pytest.config", "json", "os.path", "tests.env_projects"])
    assert found == {"pytest": installed_here()["pytest"]}  # the standard library and the project's own: none
    assert "pytest" in imported_distributions()  # by default, every module this process imported


def test_the_projects_own_egg_info_is_not_a_dependency(tmp_path, monkeypatch):
    # `pip install -e .` with setuptools writes src/<name>.egg-info into the working tree; a worker that imports the
    # project from src/ then finds it as a distribution, which no built environment has (the project is never
    # installed there): counted as a dependency, every per-side round would be refused.
    package = tmp_path / "src" / "ownproj"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    info = tmp_path / "src" / "ownproj.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: ownproj\nVersion: 0.3\n")
    (info / "top_level.txt").write_text("ownproj\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    assert imported_distributions(["ownproj", "pytest"]) == {"ownproj": "0.3", "pytest": installed_here()["pytest"]}
    own = imported_distributions(["ownproj", "pytest"], own=[tmp_path, tmp_path / "src"])
    assert own == {"pytest": installed_here()["pytest"]}


def test_check_imported_names_what_is_not_the_sides_environment():
    base = SideEnvironment("base", BASE_PYTHON, "/prepared/python", installed={"torch": "2.5.1", "numpy": "2.2.6"})
    assert check_imported({"torch": "2.5.1"}, base) == ()
    assert check_imported({"torch": "2.6.0", "fastlib": "1.0"}, base) == (
        "fastlib 1.0 is not installed in the base environment",
        "torch 2.6.0 was imported; the base environment has 2.5.1",
    )
    head = SideEnvironment("head", CURRENT, sys.executable, installed={"torch": "2.6.0"})
    assert check_imported({"Torch": "2.6.0"}, head) == ()  # names compare as PEP 503 does


@pytest.mark.parametrize("text, expected", [("auto", "auto"), (" Build ", "build"), ("code-only", "code-only")])
def test_compare_deps_values(text, expected):
    assert options.compare_deps(text) == expected


def test_compare_deps_refuses_other_values():
    with pytest.raises(ValueError, match="expected one of auto, build, code-only, got 'never'"):
        options.compare_deps("never")


def test_extra_dependency_paths():
    assert options.path_list(["ci/torch.txt", " docker/*.env "]) == ("ci/torch.txt", "docker/*.env")
    assert options.path_list("ci/torch.txt, docker/*.env") == ("ci/torch.txt", "docker/*.env")
    assert options.path_list(["ci/torch.txt, docker/*.env"]) == ("ci/torch.txt", "docker/*.env")  # -o key=a,b
    with pytest.raises(ValueError, match="relative to the rootdir"):
        options.path_list(["/etc/requirements.txt"])


def test_the_options_reach_the_session_and_a_bad_value_is_a_usage_error(pytester, monkeypatch):
    from pytest_llmperf.orchestrate.options import Settings

    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # not the suite's --llmperf-processes=1
    pytester.makeini("[pytest]\nllmperf_compare_deps = code-only\nllmperf_compare_deps_paths =\n    ci/*.txt\n"
                     "    docker/versions.env\n")  # fmt: skip
    config = pytester.parseconfig("-o", "llmperf_env_dir=envs", "--llmperf-base-python=/opt/base/bin/python")
    settings = Settings.from_config(config)
    assert settings.compare_deps == "code-only"
    assert settings.compare_deps_paths == ("ci/*.txt", "docker/versions.env")
    # a directory given on the command line (-o too) is resolved against where pytest was invoked, as pytest's own are
    assert (settings.env_dir, settings.base_python) == (str((pytester.path / "envs").resolve()), "/opt/base/bin/python")
    result = pytester.runpytest("--llmperf-compare-deps=never", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-compare-deps*expected one of auto, build, code-only*"])
    pytester.makeini("[pytest]\nllmperf_env_extras =\n    gpu\n    cuda12\n")
    chosen = Settings.from_config(pytester.parseconfig("-o", "llmperf_env_groups=bench, lint"))
    assert (chosen.env_extras, chosen.env_groups) == (("gpu", "cuda12"), ("bench", "lint"))
    result = pytester.runpytest("-o", "llmperf_env_extras=gpu;rm", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*llmperf_env_extras*expected names of extras or dependency groups*"])
