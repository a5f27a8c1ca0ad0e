"""Detecting whether two sides' dependencies differ (pytest_llmperf/environments/inputs.py): by bytes, at no cost when
nothing changed, the content of the local wheels and directories the files name included; and what each side is
built from, chosen by file name (build.recipe_for)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_llmperf.environments.build import PYPROJECT, REQUIREMENTS, UV_LOCK, recipe_for
from pytest_llmperf.environments.inputs import InputsUnreadable, detect, find_inputs, inputs_roots
from pytest_llmperf.environments.records import BuildSettings, CannotBuild
from tests.env_projects import fastlib_wheel, requirements_project, uv_project

VERSION = "3.11.7"


def sides(tmp_path: Path) -> tuple[Path, Path]:
    base, head = tmp_path / "base", tmp_path / "head"
    base.mkdir()
    head.mkdir()
    return base, head


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def recipe(root: Path, **settings):
    return recipe_for(find_inputs(root), BuildSettings(**settings), VERSION, "head")


def test_byte_identical_inputs_are_unchanged_without_loading_a_parser(tmp_path):
    base = uv_project(tmp_path / "base", "1.0")
    requirements_project(base, "1.0")
    head = tmp_path / "head"
    shutil.copytree(base, head)
    # In a fresh interpreter: detection of unchanged inputs reads bytes and nothing more.
    code = (
        "import sys, json; from pytest_llmperf.environments.inputs import detect; "
        f"d = detect({str(base)!r}, {str(head)!r}); "
        "print(json.dumps([d.files, sorted(m for m in ('packaging', 'tomllib', 'tomli', 'yaml') if m in sys.modules),"
        " d.base.paths(), [p for p, _ in d.base.local]]))"
    )
    files, parsers, paths, local = json.loads(subprocess.check_output([sys.executable, "-c", code], text=True))
    assert files == [] and parsers == []
    assert paths == ["pyproject.toml", "requirements.txt", "uv.lock"]
    assert local == ["wheels"]  # the find-links directory both files name, by its content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "head"]  # nothing written


def test_any_edit_of_a_dependency_file_is_a_difference(tmp_path):
    # A comment, the order of lines: not told apart from a bump here, the builds tell (plan.py runs them shared).
    base = requirements_project(tmp_path / "base", "1.0")
    head = requirements_project(tmp_path / "head", "1.0")
    assert detect(base, head).files == ()
    (head / "requirements.txt").write_text("fastlib==1.0  # pinned\n--find-links wheels\n")
    found = detect(base, head)
    assert found.differs and found.files == ("requirements.txt",)


def test_a_wheel_rebuilt_under_the_same_name_is_a_difference(tmp_path):
    # The hostile round's first case: vendor/fastlib-1.0-py3-none-any.whl rebuilt (slower), the requirements text the
    # same. Keyed by that text, the old build of both sides passed the slowdown.
    base, head = sides(tmp_path)
    for root, loops in ((base, 200_000), (head, 250_000)):
        fastlib_wheel(root / "vendor", "1.0", loops=loops)
        write(root, "requirements.txt", "./vendor/fastlib-1.0-py3-none-any.whl\n")
    assert detect(base, head).files == ("vendor/fastlib-1.0-py3-none-any.whl",)
    fastlib_wheel(head / "vendor", "1.0", loops=200_000)  # the same bytes again
    assert detect(base, head).files == ()


@pytest.mark.parametrize("named", ["--find-links wheels\nfastlib==1.0\n", "fastlib @ file:./wheels/fastlib-1.0-py3-none-any.whl\n",
                                   "-f ./wheels\nfastlib\n"])  # fmt: skip
def test_the_local_paths_a_requirements_file_names_are_fingerprinted(tmp_path, named):
    base, head = sides(tmp_path)
    for root, loops in ((base, 1), (head, 2)):
        fastlib_wheel(root / "wheels", "1.0", loops=loops)
        write(root, "requirements.txt", named)
    assert detect(base, head).differs


@pytest.mark.slow
def test_the_local_paths_of_a_uv_project_are_fingerprinted_its_editable_sources_too_not_the_project(tmp_path):
    # An editable source goes into an environment as a copy (build.COPIES): a link into the checkout it was built
    # from went with the base side's worktree, or followed the working tree. The project is imported from its checkout.
    base = uv_project(tmp_path / "base", "1.0")
    text = (base / "pyproject.toml").read_text()
    (base / "pyproject.toml").write_text(text + '[tool.uv.sources]\nengine = { path = "libs/engine", editable = true }\n')
    write(base, "libs/engine/engine.py", "X = 1\n")
    write(base, "requirements-dev.txt", "-e .\n")  # the project itself
    head = tmp_path / "head"
    shutil.copytree(base, head)
    assert [p for p, _ in detect(base, head).head.local] == ["libs/engine", "wheels"]
    write(head, "demo.py", "X = 2\n")  # the project's own code
    assert not detect(base, head).differs
    write(head, "libs/engine/engine.py", "X = 2\n")
    assert detect(base, head).files == ("libs/engine",)
    fastlib_wheel(head / "wheels", "2.0", loops=1)  # a wheel the lock reads through its registry = "wheels"
    assert detect(base, head).files == ("libs/engine", "wheels")


def test_a_path_outside_the_repository_is_fingerprinted_by_size_and_time_not_read(tmp_path, monkeypatch):
    outside = tmp_path / "opt-wheels"
    fastlib_wheel(outside, "1.0")
    base, head = sides(tmp_path)
    for root in (base, head):
        (root / ".git").mkdir()
        write(root, "requirements.txt", f"--find-links {outside}\nfastlib==1.0\n")
    read = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: (read.append(str(path)), real_open(path, *a, **k))[1])
    found = detect(base, head)
    assert not found.differs and [p for p, _ in found.base.local] == [str(outside)]
    assert not any(str(outside) in path for path in read)


def test_includes_and_constraints_are_inputs_too(tmp_path):
    base, head = sides(tmp_path)
    for root, version in ((base, "1.0"), (head, "2.0")):
        write(root, "requirements.txt", "-r requirements/common.txt\n--constraint=pins/constraints.txt\n")
        write(root, "requirements/common.txt", "fastlib\n")
        write(root, "pins/constraints.txt", f"fastlib=={version}\n")
    inputs = find_inputs(base)
    assert inputs.paths() == ("pins/constraints.txt", "requirements.txt", "requirements/common.txt")
    assert inputs.files[0].kind == "constraints" and inputs.files[0].included_by == "requirements.txt"
    assert detect(base, head).files == ("pins/constraints.txt",)
    assert recipe(base).requirements == ("requirements.txt",)  # what it includes, uv reads through it


def test_a_missing_include_on_one_side_is_a_difference(tmp_path):
    base, head = sides(tmp_path)
    write(base, "requirements.txt", "-r more.txt\n")
    write(base, "more.txt", "fastlib==1.0\n")
    write(head, "requirements.txt", "-r more.txt\n")
    assert detect(base, head).files == ("more.txt",)


def test_a_byte_order_mark_is_read_through(tmp_path):
    base, head = sides(tmp_path)
    for root, version in ((base, "1.0"), (head, "2.0")):
        (root / "requirements.txt").write_bytes(b"\xef\xbb\xbf-r more.txt\n")
        write(root, "more.txt", f"fastlib=={version}\n")
    assert detect(base, head).files == ("more.txt",)
    assert recipe(base).requirements == ("requirements.txt",)


@pytest.mark.slow
def test_what_a_side_is_built_from_is_chosen_by_file_name(tmp_path):
    project = uv_project(tmp_path / "uv", "1.0")
    assert recipe(project).kind == UV_LOCK
    (project / "uv.lock").unlink()
    assert (recipe(project).kind, recipe(project).requirements) == (PYPROJECT, ("pyproject.toml",))
    (project / "requirements-dev.txt").write_text("pytest\n")  # beside [project] dependencies: both
    assert (recipe(project).kind, recipe(project).requirements) == (REQUIREMENTS, ("pyproject.toml", "requirements-dev.txt"))
    write(project, "pylock.toml", 'lock-version = "1.0"\n')
    assert (recipe(project).kind, recipe(project).requirements) == ("pylock", ("pylock.toml",))


def test_an_extras_only_project_is_built_with_the_extras_option_and_named_without_it(tmp_path):
    write(tmp_path, "pyproject.toml", '[project]\nname = "demo"\nversion = "0"\n'
                                      '[project.optional-dependencies]\nbench = ["fastlib==1.0"]\n')  # fmt: skip
    with pytest.raises(CannotBuild, match=r"its dependencies are only extras \(bench\): name them in llmperf_env_extras \(ini\)"):
        recipe(tmp_path)
    assert recipe(tmp_path, extras=("bench",)).label(BuildSettings(extras=("bench",))) == "pyproject.toml --extra bench"


@pytest.mark.parametrize("name, export", [("poetry.lock", "poetry export -o requirements.txt"),
                                          ("pdm.lock", "pdm export -o requirements.txt"),
                                          ("Pipfile", "pipenv requirements > requirements.txt"),
                                          ("Pipfile.lock", "pipenv requirements > requirements.txt"),
                                          ("environment.yml", "conda env export")])  # fmt: skip
def test_other_tools_files_are_refused_by_name_with_their_export_and_never_read(tmp_path, name, export):
    (tmp_path / name).write_bytes(b"\x00 not read \xff")  # nothing parses it, so nothing fails on its content
    with pytest.raises(CannotBuild) as raised:
        recipe(tmp_path)
    message = str(raised.value)
    assert f"{name} at {tmp_path} cannot be built by uv" in message and export in message
    assert "--llmperf-base-python=PATH" in message and "--llmperf-compare-deps=code-only" in message
    write(tmp_path, "requirements.txt", "fastlib==1.0\n")  # an exported requirements file beside it: built from that
    assert recipe(tmp_path).requirements == ("requirements.txt",)


def test_a_side_that_asks_for_another_python_is_refused_naming_it(tmp_path):
    write(tmp_path, "pyproject.toml", '[project]\nname = "demo"\nversion = "0"\nrequires-python = ">=3.12"\n'
                                      'dependencies = ["fastlib"]\n')  # fmt: skip
    with pytest.raises(CannotBuild, match=r"the head side's environment cannot be made: its pyproject.toml has "
                                          r"requires-python >=3.12; this job's Python is 3.11.7"):
        recipe(tmp_path)
    write(tmp_path, "pyproject.toml", '[project]\nname = "demo"\nversion = "0"\ndependencies = ["fastlib"]\n')
    write(tmp_path, ".python-version", "3.11\n")
    assert recipe(tmp_path).kind == PYPROJECT
    write(tmp_path, ".python-version", "cpython-3.12\n")
    with pytest.raises(CannotBuild, match=r"\.python-version names 3\.12; this job's Python is 3\.11\.7"):
        recipe(tmp_path)


def test_a_pyproject_that_is_not_toml_is_named(tmp_path):
    write(tmp_path, "pyproject.toml", '[project]\nname = "demo"\ndependencies = ["fastlib==2.0"\n')
    with pytest.raises(CannotBuild, match=rf"cannot read {tmp_path}/pyproject.toml: "):
        recipe(tmp_path)


def test_no_dependencies_to_build_from_is_said(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.ruff]\nline-length = 120\n')
    with pytest.raises(CannotBuild, match="declares no dependencies to build from"):
        recipe(tmp_path)


@pytest.mark.parametrize("make", ["loop", "dangling"])
def test_an_input_that_exists_but_cannot_be_read_is_an_error_naming_it(tmp_path, make):
    # Read as "missing" on both sides, it would compare equal; a dangling requirements.txt read as absent made the
    # side "declare no dependencies" without naming the file.
    base, head = sides(tmp_path)
    for root in (base, head):
        if make == "loop":
            write(root, "requirements.txt", "-r loop.txt\n")
            (root / "loop.txt").symlink_to(root / "loop.txt")
        else:
            (root / "requirements.txt").symlink_to(root / "gone.txt")
    name = "loop.txt" if make == "loop" else "requirements.txt"
    with pytest.raises(InputsUnreadable, match=rf"cannot read .*base/{name}, a dependency input: "):
        detect(base, head)


def test_inputs_are_read_at_the_nearest_directory_that_has_them_from_the_rootdir_up(tmp_path):
    base, head = sides(tmp_path)
    for top in (base, head):
        (top / "tests" / "perf").mkdir(parents=True)
    rootdir = head / "tests" / "perf"
    assert inputs_roots(base, head, rootdir) == (base / "tests" / "perf", rootdir)  # none anywhere: the rootdir
    write(base, "requirements.txt", "fastlib==1.0\n")  # the base side has one at the top: both read there
    assert inputs_roots(base, head, rootdir) == (base, head)
    write(head, "tests/requirements.txt", "fastlib==2.0\n")  # nearer to the rootdir
    assert inputs_roots(base, head, rootdir) == (base / "tests", head / "tests")
    assert inputs_roots(base, head, tmp_path / "elsewhere") == (base, tmp_path / "elsewhere")


def test_no_dependency_files_on_either_side_is_said_not_unchanged(tmp_path):
    base, head = sides(tmp_path)
    found = detect(base, head)
    assert not found.found and not found.differs
    assert found.none_found().startswith(f"no dependency files at {head} (nor above it in the repository)")
    assert "llmperf_compare_deps_paths" in found.none_found()


def test_extra_paths_and_globs_from_the_ini_option(tmp_path):
    base, head = sides(tmp_path)
    write(base, "ci/requirements-gpu.lst", "flash-attn==2.7.4\n")
    write(head, "ci/requirements-gpu.lst", "flash-attn==2.8.1\n")
    write(base, "docker/versions.env", "CUDA=12.4\n")
    write(head, "docker/versions.env", "CUDA=12.4\n")
    assert not detect(base, head).found  # not looked at unless named
    found = detect(base, head, ["ci/*.lst", "docker/versions.env"])
    assert found.files == ("ci/requirements-gpu.lst",) and found.head.get("ci/requirements-gpu.lst").kind == "other"
    write(head, "ci/requirements-gpu.lst", "flash-attn==2.7.4\n")
    assert not detect(base, head, ["ci/*.lst", "docker/versions.env"]).differs


def test_detection_cost_is_measured_with_the_injected_clock(tmp_path):
    base, head = sides(tmp_path)
    ticks = iter([10.0, 10.25])
    assert detect(base, head, clock=lambda: next(ticks)).seconds == 0.25
