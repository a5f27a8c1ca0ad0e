"""This plugin in a side's environment: the controller's own pytest-llmperf (same version, same files), and those of
its requirements that the side's dependencies lack, at the versions the controller runs.

What the side installed is never changed: its installed versions are constraints of the install, so a conflict (the
side pins a pytest older than the plugin needs) fails the build with uv's words naming both, instead of replacing it.
The missing requirements come from wheels of the controller's installed distributions (wheels.py), so no index is
needed for them.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from . import wheels
from .errors import EnvironmentsError
from .uv_runner import Uv

PLUGIN = wheels.PLUGIN


def controller_version() -> str:
    """The version of pytest-llmperf that the controller runs (both sides' environments get it)."""
    return importlib.metadata.version(PLUGIN)


def _marker_environment() -> dict[str, str]:
    """This interpreter's PEP 508 marker environment, no extra selected (a side's is the same interpreter)."""
    return {**{key: str(value) for key, value in default_environment().items()}, "extra": ""}


def requirement_closure(name: str = PLUGIN, have: Mapping[str, str] | None = None) -> dict[str, str]:
    """The controller's installed distributions that `name` needs, transitively, without extras (canonical name ->
    version), leaving out those in `have` (and what only they need)."""
    have = have or {}
    environment = _marker_environment()
    found: dict[str, str] = {}
    queue = [name]
    while queue:
        dist = importlib.metadata.distribution(queue.pop())
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            needed = canonicalize_name(requirement.name)
            if needed in found or needed in have or needed == canonicalize_name(PLUGIN):
                continue
            try:
                found[needed] = importlib.metadata.version(needed)
            except importlib.metadata.PackageNotFoundError:
                raise EnvironmentsError(
                    f"{dist.metadata['Name']} needs {requirement}, which is not installed here: "
                    "reinstall pytest-llmperf"
                ) from None
            queue.append(needed)
    return found


def install(
    uv: Uv,
    python: Path,
    installed: Mapping[str, str],
    *,
    wheel: Path,
    wheels_dir: Path,
    flags: list[str],
    cwd: Path,
    timeout: float,
    side: str,
    hold: tuple[int, ...] = (),
) -> None:
    """Install the plugin wheel `wheel` and its missing requirements into the environment of `python`, whose
    distributions are `installed` (the side's own)."""
    side_own = {name: version for name, version in installed.items() if name != canonicalize_name(PLUGIN)}
    missing = requirement_closure(have=side_own)
    links, from_index = [str(wheel.parent)], []
    for name in missing:
        try:
            links.append(str(wheels.repack(importlib.metadata.distribution(name), wheels_dir).parent))
        except EnvironmentsError:  # an editable install here: from the index (or uv's cache) instead
            from_index.append(name)
    constraints = python.parent.parent / "llmperf-constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(side_own.items())))
    version = controller_version()
    args = ["pip", "install", "--python", str(python), "--reinstall-package", PLUGIN, "-c", str(constraints)]
    args += [] if from_index else ["--no-index"]
    args += [item for link in sorted(set(links)) for item in ("--find-links", link)]
    args += [*flags, f"{PLUGIN}=={version}", *(f"{name}=={v}" for name, v in sorted(missing.items()))]
    what = f"installing {PLUGIN} {version} into {python.parent.parent}"
    uv.run(args, cwd=cwd, timeout=timeout, what=what, side=side, hold=hold)
