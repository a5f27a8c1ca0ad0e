"""What a side's environment is built from, chosen from its dependency inputs: its uv.lock (with pyproject.toml), its
requirements files (with pyproject.toml's [project] dependencies, when it declares some), or pyproject.toml alone.
Detection reads a package where the build does (differences.py), so that what decides a difference is what is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import formats
from .errors import CannotBuild
from .inputs import DependencyInputs

UV_LOCK, REQUIREMENTS, PYPROJECT = "uv.lock", "requirements", "pyproject.toml"
#: How to turn a lock pytest-llmperf does not build from into one it does.
EXPORTS = {
    "poetry.lock": "poetry export -o requirements.txt",
    "pdm.lock": "pdm export -o requirements.txt",
    "Pipfile.lock": "pipenv requirements > requirements.txt",
}


@dataclass(frozen=True)
class Recipe:
    """What a side's environment is built from."""

    kind: str  # UV_LOCK, REQUIREMENTS or PYPROJECT
    requirements: tuple[str, ...] = ()  # -r files (REQUIREMENTS; pyproject.toml where it declares dependencies)
    constraints: tuple[str, ...] = ()  # -c files (REQUIREMENTS)

    @property
    def label(self) -> str:
        if self.kind != REQUIREMENTS:
            return self.kind
        return " ".join([*self.requirements, *(f"-c {c}" for c in self.constraints)])


def project_dependencies(inputs: DependencyInputs) -> bool:
    """Whether the side's pyproject.toml declares [project] dependencies (not only optional ones or groups)."""
    file = inputs.get("pyproject.toml")
    if file is None or file.data is None:
        return False
    try:
        declared = formats.read(file)
    except formats.Unreadable:
        return False
    return any(not entry.group for entry in declared.entries)


def recipe_for(inputs: DependencyInputs) -> Recipe:
    """How the side at `inputs.root` is built; CannotBuild when no file it has can be built from, or when the lock it
    has (poetry, pdm, pipenv) would be set aside for a resolution made at build time."""
    if inputs.of_kind("uv.lock") and inputs.of_kind("pyproject"):
        return Recipe(UV_LOCK)
    top = [f for f in inputs.files if f.included_by is None and not f.missing]
    # The .txt files (pip-compile's outputs, or plain lists); .in files (its inputs) only where there is no .txt.
    listed = [f.path for f in top if f.kind == "requirements"]
    requirements = tuple(p for p in listed if p.endswith(".txt")) or tuple(listed)
    if requirements:
        # requirements-dev.txt beside a package's own [project] dependencies: both are what the project runs with
        project = ("pyproject.toml",) if project_dependencies(inputs) else ()
        return Recipe(REQUIREMENTS, (*project, *requirements), tuple(f.path for f in top if f.kind == "constraints"))
    others = [f for f in top if f.kind in (*EXPORTS, "conda")]
    if others:
        names = ", ".join(f.path for f in others)
        exports = "; ".join(EXPORTS[f.kind] for f in others if f.kind in EXPORTS)
        fix = f"export it to a requirements file and commit it ({exports})" if exports else None
        raise CannotBuild(
            f"{inputs.root}: {names} is not built by pytest-llmperf (it builds from uv.lock, requirements files or "
            "pyproject.toml [project] dependencies, and would not set a lock aside)",
            fix=fix,
        )
    if project_dependencies(inputs):
        return Recipe(PYPROJECT)
    raise CannotBuild(
        f"{inputs.root} declares no dependencies to build from (no uv.lock, requirements file or "
        "pyproject.toml [project] dependencies)"
    )


def kind_of_build(inputs: DependencyInputs) -> str | None:
    """The kind of recipe the side is built with; None where it cannot be built."""
    try:
        return recipe_for(inputs).kind
    except CannotBuild:
        return None
