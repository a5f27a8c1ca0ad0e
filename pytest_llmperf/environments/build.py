"""Building one side's environment with uv, from that side's own files (its recipe: recipe.py), into the cache.

Both sides are built alike: the same base interpreter, the same flags (bytecode compiled at install, or not, on
both), the same uv. From a uv.lock: `uv sync --frozen --no-install-project` into UV_PROJECT_ENVIRONMENT (the side's
[tool.uv] holds). From requirements files: `uv venv`, then `uv pip install -r ... -c ...` (with `-r pyproject.toml`
where it declares [project] dependencies). From pyproject.toml dependencies alone: `uv pip install -r
pyproject.toml` (resolved when built: not locked). The project itself is never installed: workers import it from the
side's checkout. Then this plugin goes in (plugin_install.py), and the environment's installed set is recorded in
its marker.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import cache, formats, plugin_install, wheels
from .errors import BuildFailed
from .inputs import DependencyInputs
from .installed import Probe, probe
from .recipe import PYPROJECT, REQUIREMENTS, UV_LOCK, Recipe, recipe_for
from .records import BUILT, CACHE_HIT, BuildSettings, SideEnvironment
from .uv_runner import Uv


def normalized(inputs: DependencyInputs) -> dict[str, Any]:
    """The side's dependency inputs as the cache key sees them: a lock by its parsed content, the others by what
    they declare, so that a comment or the order of lines makes no new environment."""
    found: dict[str, Any] = {}
    for file in inputs.files:
        if file.data is None:
            found[file.path] = None
        elif file.kind in ("uv.lock", "poetry.lock", "pdm.lock", "Pipfile.lock"):
            try:
                parsed = json.loads(file.data) if file.kind == "Pipfile.lock" else formats.load_toml(file)
                found[file.path] = json.dumps(parsed, sort_keys=True, default=str)
            except (formats.Unreadable, ValueError):
                found[file.path] = hashlib.sha256(file.data).hexdigest()
        else:
            try:
                entries, settings = formats.read(file).keys()
                found[file.path] = [sorted(entries), list(settings)]
            except formats.Unreadable:
                found[file.path] = hashlib.sha256(file.data).hexdigest()
    return found


def key_parts(
    inputs: DependencyInputs, recipe: Recipe, base: Probe, uv: Uv, settings: BuildSettings, plugin: str, copy: str
) -> dict[str, Any]:
    """Everything that defines a built environment (`copy`: a name that keeps two builds of equal inputs apart)."""
    build = {k: v for k, v in asdict(settings).items() if k != "timeout_s"}
    return {
        "python": dict(base.identity),
        "platform": [base.markers["sys_platform"], base.markers["platform_machine"], *platform.libc_ver()],
        "uv": uv.version,
        "recipe": asdict(recipe),
        "inputs": normalized(inputs),
        "settings": build,
        "plugin": plugin,
        "plugin_requirements": plugin_install.requirement_closure(),
        **({"copy": copy} if copy else {}),
    }


def _selects(recipe: Recipe) -> bool:
    """Whether the project's extras and groups apply: built from its uv.lock or its pyproject.toml."""
    return recipe.kind != REQUIREMENTS or PYPROJECT in recipe.requirements


def _shown(recipe: Recipe, settings: BuildSettings) -> str:
    """What the side was built from, as the header says it ('uv.lock --extra gpu')."""
    return " ".join([recipe.label, *(settings.selection() if _selects(recipe) else [])])


def _run_recipe(recipe: Recipe, root: Path, directory: Path, base: Probe, uv: Uv, settings: BuildSettings) -> None:
    flags, timeout = settings.flags(), settings.timeout_s
    what = f"building {directory} from {root}/{recipe.label}"
    if recipe.kind == UV_LOCK:
        args = ["sync", "--frozen", "--no-install-project", "--python", base.base_executable, *flags]
        uv.run(
            [*args, *settings.selection()],
            cwd=root,
            env={"UV_PROJECT_ENVIRONMENT": str(directory)},
            timeout=timeout,
            what=what,
        )
        return
    uv.run(
        ["venv", "--no-project", "--python", base.base_executable, str(directory)], cwd=root, timeout=timeout, what=what
    )
    args = ["pip", "install", "--python", str(cache.python_in(directory)), *flags]
    if recipe.kind == REQUIREMENTS:
        args += [item for r in recipe.requirements for item in ("-r", r)]
        args += [item for c in recipe.constraints for item in ("-c", c)]
        args += settings.selection() if _selects(recipe) else []
    else:
        args += ["-r", "pyproject.toml", *settings.selection()]
    uv.run(args, cwd=root, timeout=timeout, what=what)


def build_side(
    side: str,
    inputs: DependencyInputs,
    *,
    base: Probe,
    uv: Uv,
    env_dir: Path,
    settings: BuildSettings,
    copy: str = "",
    clock: Callable[[], float] = time.perf_counter,
) -> SideEnvironment:
    """The environment of `side` ("base" or "head") built from `inputs` with the interpreter `base` (its base
    executable), or reused from `env_dir`; CannotBuild/BuildFailed when it cannot be. Sides with equal inputs share
    one environment unless `copy` names each (--llmperf-compare-deps=build: two builds, the A/A of the machinery)."""
    start = clock()
    recipe = recipe_for(inputs)
    shown = _shown(recipe, settings)
    plugin, wheel = wheels.plugin_wheel(env_dir / cache.WHEELS)
    key = cache.key_of(key_parts(inputs, recipe, base, uv, settings, plugin, copy))
    directory = env_dir / key
    python = cache.python_in(directory)
    with cache.building(directory):
        marker = cache.ready(directory, key)
        if marker is not None:
            now = probe(str(python))
            if now.installed == marker["installed"]:  # nothing was installed or removed since it was built
                cache.touch(directory)
                seconds = clock() - start
                return SideEnvironment(
                    side, CACHE_HIT, str(python), now.python_version, key, str(directory), shown, seconds, now.installed
                )
        cache.discard(directory)  # what a killed build left, or an environment changed since
        try:
            done = _make(recipe, inputs, directory, base, uv, settings, wheel, env_dir / cache.WHEELS)
        except BaseException:
            cache.discard(directory)  # nothing half built stays behind
            raise
        seconds = clock() - start
        record = {"side_root": str(inputs.root), "recipe": shown, "seconds": seconds}
        cache.mark_ready(directory, key, {**record, "installed": done.installed, "python": done.python_version})
    return SideEnvironment(
        side, BUILT, str(python), done.python_version, key, str(directory), shown, seconds, done.installed
    )


def _make(
    recipe: Recipe,
    inputs: DependencyInputs,
    directory: Path,
    base: Probe,
    uv: Uv,
    settings: BuildSettings,
    wheel: Path,
    wheels_dir: Path,
) -> Probe:
    """Build the environment at `directory` (its lock held): the side's dependencies, then the plugin."""
    python = cache.python_in(directory)
    _run_recipe(recipe, inputs.root, directory, base, uv, settings)
    own = probe(str(python))
    plugin_install.install(
        uv,
        python,
        own.installed,
        wheel=wheel,
        wheels_dir=wheels_dir,
        flags=settings.flags(),
        cwd=inputs.root,
        timeout=settings.timeout_s,
    )
    done = probe(str(python))
    expected, found = plugin_install.controller_version(), done.installed.get(plugin_install.PLUGIN)
    if found != expected:
        raise BuildFailed(f"{directory} has {plugin_install.PLUGIN} {found}, not the controller's {expected}")
    return done
