"""Detecting how two sides' dependencies differ (pytest_llmperf/environments/detection.py): at no cost when nothing
changed, a change in form only is none, and a real one is named package by package, for every format read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_llmperf.environments.detection import CHANGED, NONE_FOUND, SAME_IN_FORM, UNCHANGED, UNREADABLE, detect
from pytest_llmperf.environments.inputs import InputsUnreadable, find_inputs, inputs_roots
from pytest_llmperf.environments.records import PackageChange
from tests.env_projects import requirements_project, uv_project


def sides(tmp_path: Path) -> tuple[Path, Path]:
    base, head = tmp_path / "base", tmp_path / "head"
    base.mkdir()
    head.mkdir()
    return base, head


def write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def detected(tmp_path: Path, name: str, base_text: str, head_text: str):
    """Detection of two sides whose only input is `name`, with these texts."""
    base, head = sides(tmp_path)
    write(base, name, base_text)
    write(head, name, head_text)
    return detect(base, head)


def test_byte_identical_inputs_are_unchanged_without_loading_a_parser(tmp_path):
    base = uv_project(tmp_path / "base", "1.0")
    requirements_project(base, "1.0")
    head = tmp_path / "head"
    shutil.copytree(base, head)
    # In a fresh interpreter: detection of unchanged inputs reads bytes and nothing more.
    code = (
        "import sys, json; from pytest_llmperf.environments.detection import detect; "
        f"d = detect({str(base)!r}, {str(head)!r}); "
        "print(json.dumps([d.status, sorted(m for m in ('packaging', 'tomllib', 'tomli', 'yaml') if m in sys.modules),"
        " d.base.paths()]))"
    )
    status, parsers, paths = json.loads(subprocess.check_output([sys.executable, "-c", code], text=True))
    assert status == UNCHANGED
    assert parsers == []
    assert paths == ["pyproject.toml", "requirements.txt", "uv.lock"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "head"]  # nothing written


def test_reordered_requirements_with_comments_are_the_same_in_form(tmp_path):
    found = detected(tmp_path, "requirements.txt", "--find-links wheels\nfastlib==1.0\nnumpy>=1.24,<3\n",
                     "# pinned for the benchmarks\nnumpy <3, >=1.24   # arrays\n-f wheels\nfastlib==1.0.0\n")
    assert found.status == SAME_IN_FORM and not found.differs
    assert found.files == ("requirements.txt",)
    assert "requirements.txt changed in form only" in found.summary()


def test_a_bump_an_addition_and_a_removal_are_named(tmp_path):
    found = detected(tmp_path, "requirements.txt", "torch==2.5.1\noldpkg==0.3\nnumpy\n",
                     "torch==2.6.0\nnumpy\nnewpkg==1.0\n")
    assert found.status == CHANGED and found.differs
    assert [str(c) for c in found.changes] == ["+newpkg 1.0", "-oldpkg 0.3", "torch 2.5.1 -> 2.6.0"]
    assert found.changes[-1] == PackageChange("torch", "2.5.1", "2.6.0", "requirements.txt")


def test_includes_and_constraints_are_inputs_too(tmp_path):
    base, head = sides(tmp_path)
    for root, version in ((base, "1.0"), (head, "2.0")):
        write(root, "requirements.txt", "-r requirements/common.txt\n--constraint=pins/constraints.txt\n")
        write(root, "requirements/common.txt", "fastlib\n")
        write(root, "pins/constraints.txt", f"fastlib=={version}\n")
    assert find_inputs(base).paths() == ("pins/constraints.txt", "requirements.txt", "requirements/common.txt")
    assert find_inputs(base).get("pins/constraints.txt").kind == "constraints"
    found = detect(base, head)
    assert [str(c) for c in found.changes] == ["fastlib 1.0 [constraint] -> 2.0 [constraint]"]


def test_a_missing_include_on_one_side_cannot_be_read(tmp_path):
    base, head = sides(tmp_path)
    write(base, "requirements.txt", "-r more.txt\n")
    write(base, "more.txt", "fastlib==1.0\n")
    write(head, "requirements.txt", "-r more.txt\n")
    found = detect(base, head)
    assert found.status == UNREADABLE
    assert found.unreadable == ("more.txt: named as a dependency input (included by requirements.txt) but missing",)


def test_a_uv_lock_bump_is_named_from_the_lock(tmp_path):
    base = uv_project(tmp_path / "base", "1.0")
    head = uv_project(tmp_path / "head", "2.0")
    found = detect(base, head)
    assert found.status == CHANGED
    assert found.changes == (PackageChange("fastlib", "1.0", "2.0", "uv.lock"),)
    assert found.other == ()  # the same source (the project's find-links) on both sides


def test_a_specifier_edited_while_the_lock_keeps_its_version_is_a_note(tmp_path):
    base = uv_project(tmp_path / "base", "1.0")
    head = tmp_path / "head"
    shutil.copytree(base, head)
    pyproject = head / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"fastlib==1.0"', '"fastlib>=1.0"'))
    found = detect(base, head)
    assert found.status == SAME_IN_FORM
    assert found.notes == ("fastlib: pyproject.toml declares 1.0 -> >=1.0; uv.lock has 1.0 on both sides",)


@pytest.mark.parametrize("lock", ["poetry.lock", "pdm.lock"])
def test_a_requirements_pin_bumped_beside_a_lock_that_is_not_built_from_is_a_change(tmp_path, lock):
    # The environment is built from requirements.txt (recipe.py), so it decides; the other lock is a note. Read lock
    # first, this pull request was "changed in form only" and passed green.
    base, head = sides(tmp_path)
    for root, version in ((base, "1.0"), (head, "2.0")):
        write(root, lock, '[[package]]\nname = "fastlib"\nversion = "1.0"\n')
        write(root, "requirements.txt", f"fastlib=={version}\n")
    found = detect(base, head)
    assert found.status == CHANGED
    assert found.changes == (PackageChange("fastlib", "1.0", "2.0", "requirements.txt"),)
    assert found.notes == ()  # the lock did not move: nothing more to say


def test_a_lock_that_is_not_built_from_moving_beside_unchanged_requirements_is_a_note(tmp_path):
    base, head = sides(tmp_path)
    for root, version in ((base, "1.0"), (head, "2.0")):
        write(root, "poetry.lock", f'[[package]]\nname = "fastlib"\nversion = "{version}"\n')
        write(root, "requirements.txt", "fastlib==1.0\n")
    found = detect(base, head)
    assert found.status == SAME_IN_FORM
    assert found.notes == ("fastlib: poetry.lock declares 1.0 -> 2.0; requirements.txt has 1.0 on both sides",)


def test_moving_from_requirements_to_a_uv_lock_is_a_change_of_recipe(tmp_path):
    base = requirements_project(tmp_path / "base", "1.0")
    head = uv_project(tmp_path / "head", "1.0")
    found = detect(base, head)
    assert found.status == CHANGED
    assert "built from requirements -> uv.lock" in found.other


def test_pyproject_groups_extras_and_tool_uv_settings(tmp_path):
    template = """\
        [project]
        name = "demo"
        dependencies = ["transformers=={tf}"]
        [project.optional-dependencies]
        gpu = ["flash-attn=={fa}"]
        [dependency-groups]
        bench = ["pytest-llmperf", {{include-group = "other"}}]
        [tool.uv]
        index-url = "{index}"
        constraint-dependencies = ["tokenizers<0.22"]
        """
    found = detected(tmp_path, "pyproject.toml",
                     template.format(tf="4.44.0", fa="2.7.4", index="https://a.example/simple"),
                     template.format(tf="4.45.0", fa="2.8.1", index="https://b.example/simple"))
    assert [str(c) for c in found.changes] == ["flash-attn 2.7.4 [extra gpu] -> 2.8.1 [extra gpu]",
                                               "transformers 4.44.0 -> 4.45.0"]  # fmt: skip
    assert found.other == ('pyproject.toml [tool.uv] index-url: "https://a.example/simple" -> "https://b.example/simple"',)


@pytest.mark.parametrize("name", ["poetry.lock", "pdm.lock"])
def test_poetry_and_pdm_locks(tmp_path, name):
    base, head = sides(tmp_path)
    for root, version in ((base, "2.5.1"), (head, "2.6.0")):
        write(root, name, f'[[package]]\nname = "torch"\nversion = "{version}"\n\n[metadata]\ncontent-hash = "{version}"\n')
    assert [str(c) for c in detect(base, head).changes] == ["torch 2.5.1 -> 2.6.0"]


def test_pipfile_lock(tmp_path):
    base, head = sides(tmp_path)
    for root, version in ((base, "==2.5.1"), (head, "==2.6.0")):
        data = {"_meta": {"sources": []}, "default": {"torch": {"version": version}}, "develop": {}}
        (root / "Pipfile.lock").write_text(json.dumps(data, indent=4))
    assert [str(c) for c in detect(base, head).changes] == ["torch 2.5.1 -> 2.6.0"]


def test_a_conda_environment_file(tmp_path):
    base, head = sides(tmp_path)
    for root, version in ((base, "2.5.1"), (head, "2.6.0")):
        write(root, "environment.yml", f"channels: [pytorch]\ndependencies:\n  - pytorch::pytorch={version}\n"
                                       "  - pip:\n    - fastlib==1.0\n")  # fmt: skip
    assert [str(c) for c in detect(base, head).changes] == ["pytorch =2.5.1 [conda] -> =2.6.0 [conda]"]


def test_a_python_version_change_is_reported_apart(tmp_path):
    found = detected(tmp_path, ".python-version", "3.11\n", "3.12\n")
    assert found.status == CHANGED and found.changes == () and found.python_versions == ("3.11", "3.12")
    assert found.summary() == ".python-version 3.11 -> 3.12"


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    found = detected(tmp_path, "pyproject.toml", '[project]\nname = "demo"\ndependencies = ["fastlib==1.0"]\n',
                     '[project]\nname = "demo"\ndependencies = ["fastlib==2.0"\n')
    assert found.status == UNREADABLE and found.differs
    assert len(found.unreadable) == 1 and found.unreadable[0].startswith("pyproject.toml: not valid TOML")


def test_an_input_that_exists_but_cannot_be_read_is_an_error_naming_it(tmp_path):
    # A symlink loop (EACCES cannot be made as root): read as "missing" on both sides, it would compare equal.
    base, head = sides(tmp_path)
    for root in (base, head):
        write(root, "requirements.txt", "-r loop.txt\n")
        (root / "loop.txt").symlink_to(root / "loop.txt")
    with pytest.raises(InputsUnreadable, match=r"cannot read .*base/loop.txt, a dependency input of .*base: "):
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
    assert found.status == NONE_FOUND and not found.differs
    assert found.summary().startswith(f"no dependency files at {head} (nor above it in the repository)")
    assert "llmperf_compare_deps_paths" in found.summary()


def test_extra_paths_and_globs_from_the_ini_option(tmp_path):
    base, head = sides(tmp_path)
    write(base, "ci/requirements-gpu.lst", "flash-attn==2.7.4\n")
    write(head, "ci/requirements-gpu.lst", "flash-attn==2.8.1\n")
    write(base, "docker/versions.env", "CUDA=12.4\n")
    write(head, "docker/versions.env", "CUDA=12.4\n")
    assert detect(base, head).status == NONE_FOUND  # not looked at unless named
    found = detect(base, head, ["ci/*.lst", "docker/versions.env"])
    assert found.status == UNREADABLE  # a .lst file is no format read here
    assert found.unreadable == ("ci/requirements-gpu.lst: not a format pytest-llmperf reads; its change cannot be "
                                "told apart from others",)  # fmt: skip
    write(head, "ci/requirements-gpu.lst", "flash-attn==2.7.4\n")
    assert detect(base, head, ["ci/*.lst", "docker/versions.env"]).status == UNCHANGED


def test_detection_cost_is_measured_with_the_injected_clock(tmp_path):
    base, head = sides(tmp_path)
    ticks = iter([10.0, 10.25])
    assert detect(base, head, clock=lambda: next(ticks)).seconds == 0.25
