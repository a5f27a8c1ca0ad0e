"""One side's environment built with uv, from that side's own files, into the cache; or reused from it where it still
holds what the side asks for.

What a side is built from is chosen by file name, from what uv builds from: its uv.lock (with pyproject.toml), a
pylock.toml, its requirements and constraints files (with pyproject.toml where it declares [project] dependencies),
or pyproject.toml alone. The files of other tools (poetry, pdm, pipenv, conda) are never read: named, with the
command that exports each. Both sides are built alike: the same base interpreter, the same flags, the same uv. The
project itself is never installed (workers import it from the side's checkout); then this plugin goes in
(plugin_install.py), and what the environment holds is recorded in its marker.

A cache entry is reused only where it still holds what was recorded, its files are intact (probed against their
RECORD) and uv finds the side's own requirements satisfied by it (`uv pip install --dry-run`); otherwise it is
rebuilt, and the side's record says why.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import cache, plugin_install
from .errors import BuildFailed, CannotBuild, EnvironmentsError
from .inputs import REFUSED, DependencyInputs
from .installed import Probe, probe
from .records import BUILT, CACHE_HIT, BuildSettings, SideEnvironment, held_changes
from .uv_runner import Uv

UV_LOCK, PYLOCK, REQUIREMENTS, PYPROJECT = "uv.lock", "pylock", "requirements", "pyproject.toml"
#: UV_* variables that change how uv works, not what it installs: left out of the key.
HARMLESS = {"UV_CACHE_DIR", "UV_NO_PROGRESS", "UV_CONCURRENT_DOWNLOADS", "UV_CONCURRENT_BUILDS",
            "UV_CONCURRENT_INSTALLS", "UV_HTTP_TIMEOUT", "UV_REQUEST_TIMEOUT", "UV_LINK_MODE", "UV_NO_CACHE",
            "UV_COLOR", "UV_NATIVE_TLS", "UV_SYSTEM_CERTS"}  # fmt: skip
#: UV_* variables that name files whose content decides what is installed.
FILE_SETTINGS = ("UV_CONSTRAINT", "UV_OVERRIDE", "UV_BUILD_CONSTRAINT", "UV_EXCLUDE", "UV_CONFIG_FILE")


@dataclass(frozen=True)
class Recipe:
    """What a side's environment is built from."""

    kind: str  # UV_LOCK, PYLOCK, REQUIREMENTS or PYPROJECT
    requirements: tuple[str, ...] = ()  # -r files (REQUIREMENTS, with pyproject.toml where it declares dependencies)
    constraints: tuple[str, ...] = ()  # -c files (REQUIREMENTS)
    selects: bool = True  # whether the project's extras and groups apply (it reads a pyproject.toml or a lock)

    def label(self, settings: BuildSettings) -> str:
        """What the side was built from, as the header says it ('uv.lock --extra gpu')."""
        files = [*self.requirements, *(f"-c {c}" for c in self.constraints)] or [self.kind]
        return " ".join([*files, *(settings.selection() if self.selects else [])])

    def install_args(self, settings: BuildSettings) -> list[str]:
        """What `uv pip install` installs: the files and the selection."""
        args = [item for r in self.requirements for item in ("-r", r)]
        args += [item for c in self.constraints for item in ("-c", c)]
        return args + (settings.selection() if self.selects else [])


def load_toml(text: str) -> dict[str, Any]:
    """A TOML document (tomllib; tomli before Python 3.11, which pytest requires there); ValueError if invalid."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    return tomllib.loads(text.removeprefix("\ufeff"))


def _project(inputs: DependencyInputs) -> dict[str, Any]:
    """The [project] table of the side's pyproject.toml ({} where there is none); CannotBuild naming the file where
    it is not valid TOML."""
    file = inputs.get("pyproject.toml")
    if file is None or file.data is None:
        return {}
    try:
        project = load_toml(file.data.decode("utf-8-sig")).get("project")
    except (ValueError, UnicodeDecodeError) as exc:
        raise CannotBuild(f"cannot read {inputs.root / 'pyproject.toml'}: {exc}") from None
    return project if isinstance(project, dict) else {}


def _check_python(inputs: DependencyInputs, project: dict[str, Any], version: str, side: str) -> None:
    """CannotBuild where the side asks for a Python that this job's interpreter is not: both sides are built with it."""
    wanted = project.get("requires-python")
    if wanted:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            fits = SpecifierSet(wanted).contains(version, prereleases=True)
        except InvalidSpecifier:
            fits = True  # uv says what is wrong with it
        if not fits:
            raise CannotBuild(f"its pyproject.toml has requires-python {wanted}; this job's Python is {version}, and "
                              "both sides are built with it", side=side)  # fmt: skip
    pinned = inputs.get(".python-version")
    if pinned is not None and pinned.data is not None:
        text = (
            pinned.data.decode("utf-8-sig", errors="replace").strip().splitlines()[0].lower()
            if pinned.data.strip()
            else ""
        )
        for prefix in ("cpython-", "cpython", "python"):
            text = text.removeprefix(prefix)
        if text and not (version == text or version.startswith(text + ".")):
            raise CannotBuild(f".python-version names {text}; this job's Python is {version}, and both sides are "
                              "built with it", side=side)  # fmt: skip


def recipe_for(inputs: DependencyInputs, settings: BuildSettings, version: str, side: str) -> Recipe:
    """How the side at `inputs.root` is built (with the interpreter of Python `version`); CannotBuild when no file it
    has is what uv builds from, or when it asks for another Python."""
    project = _project(inputs)
    _check_python(inputs, project, version, side)
    if inputs.of_kind("uv.lock") and inputs.get("pyproject.toml"):
        return Recipe(UV_LOCK)
    locks = sorted(f.path for f in inputs.of_kind("pylock"))
    if locks:
        return Recipe(PYLOCK, ("pylock.toml" if "pylock.toml" in locks else locks[0],))
    listed = [f.path for f in inputs.of_kind("requirements")]
    # The .txt files (pip-compile's outputs, or plain lists); .in files (its inputs) only where there is no .txt.
    requirements = tuple(p for p in listed if p.endswith(".txt")) or tuple(listed)
    declares = bool(project.get("dependencies")) or bool(settings.extras and project.get("optional-dependencies"))
    if requirements:
        project_file = ("pyproject.toml",) if declares else ()
        constraints = tuple(f.path for f in inputs.of_kind("constraints"))
        return Recipe(REQUIREMENTS, (*project_file, *requirements), constraints, selects=declares)
    refused = [f.path for f in inputs.of_kind("refused")]
    if refused:
        exports = "; ".join(sorted({REFUSED[p.rsplit("/", 1)[-1]] for p in refused}))
        raise CannotBuild(f"{', '.join(refused)} at {inputs.root} cannot be built by uv, and nothing here reads it",
                          fix=f"export it to a requirements file and commit that: {exports}")  # fmt: skip
    if declares or project.get("dependency-groups") or (settings.groups and project):
        return Recipe(PYPROJECT, ("pyproject.toml",))
    extras = ", ".join(project.get("optional-dependencies") or ())
    hint = f"; its dependencies are only extras ({extras}): name them in llmperf_env_extras (ini)" if extras else ""
    raise CannotBuild(f"{inputs.root} declares no dependencies to build from (no uv.lock, pylock.toml, requirements "
                      f"file or pyproject.toml [project] dependencies){hint}", side=side)  # fmt: skip


def uv_settings(root: Path) -> dict[str, Any]:
    """uv's configuration beyond the side's own files: the UV_* variables (and the files they name), uv.toml above the
    side's root, the user's and the system's uv.toml."""
    found: dict[str, Any] = {k: v for k, v in os.environ.items() if k.startswith("UV_") and k not in HARMLESS}
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
    paths = [config / "uv" / "uv.toml", Path("/etc/uv/uv.toml"), *(Path(d) / "uv" / "uv.toml" for d in dirs)]
    paths += [d / "uv.toml" for d in root.resolve().parents]
    paths += [Path(p) for name in FILE_SETTINGS for p in os.environ.get(name, "").split() if p]
    for path in paths:
        try:
            found[str(path)] = path.read_text(errors="replace")
        except OSError:
            continue
    return found


def key_parts(
    inputs: DependencyInputs, recipe: Recipe, base: Probe, uv: Uv, settings: BuildSettings, plugin: str, copy: str
) -> dict[str, Any]:
    """Everything that decides what a built environment holds (`copy`: a name that keeps two builds apart)."""
    return {
        "python": dict(base.identity),
        "platform": [base.markers["sys_platform"], base.markers["platform_machine"], *platform.libc_ver()],
        "uv": uv.version,
        "uv_settings": uv_settings(inputs.root),
        "recipe": asdict(recipe),
        "inputs": inputs.digests(),
        "settings": {k: v for k, v in asdict(settings).items() if k != "timeout_s"},
        "plugin": plugin,
        "plugin_requirements": plugin_install.requirement_closure(),
        **({"copy": copy} if copy else {}),
    }


def unsatisfied(recipe: Recipe, root: Path, python: str, uv: Uv, settings: BuildSettings, side: str) -> tuple[str, ...]:
    """What the interpreter `python` lacks of what the side at `root` asks for, as uv's dry run says it (empty: uv
    would change nothing); this plugin aside, which every side gets at the controller's version."""
    run = functools.partial(uv.run, cwd=root, timeout=settings.timeout_s, side=side)
    with tempfile.TemporaryDirectory(prefix="llmperf-env-") as scratch:
        args = ["pip", "install", "--dry-run", "--python", python, *settings.flags()]
        if recipe.kind == UV_LOCK:
            exported = Path(scratch, "requirements.txt")
            export = ["export", "--frozen", "--no-hashes", "--no-emit-workspace", "--format", "requirements-txt"]
            run([*export, "-q", "-o", str(exported), *settings.flags(), *settings.selection()])
            args += ["-r", str(exported)]
        else:
            args += recipe.install_args(settings)
        done = run(args, check=False)
    said = [line.strip() for line in done.stderr.splitlines()]
    if done.returncode == 0 and "Would make no changes" in said:
        return ()
    changes = [line for line in said if line[:2] in ("+ ", "- ") and plugin_install.PLUGIN not in line]
    if done.returncode == 0 and not changes:
        return ()
    return tuple(changes) or tuple(said[-3:]) or (f"uv exited with {done.returncode}",)


def _why_not_reused(
    marker: dict[str, Any], now: Probe, recipe: Recipe, root: Path, uv: Uv, settings: BuildSettings, side: str
) -> str | None:
    """Why the ready entry, probed as `now`, cannot be reused; None where it can."""
    if now.damaged:
        return f"its files changed since it was built ({'; '.join(now.damaged)})"
    if now.installed != marker.get("installed") or now.contents != marker.get("contents"):
        was, had = marker.get("installed") or {}, marker.get("contents") or {}
        changed = "; ".join(map(str, held_changes(was, now.installed, had, now.contents)))
        return f"what it holds changed since it was built ({changed})"
    missing = unsatisfied(recipe, root, now.executable, uv, settings, side)
    return f"it does not hold what the side asks for (uv: {'; '.join(missing)})" if missing else None


def build_side(
    side: str,
    inputs: DependencyInputs,
    *,
    base: Probe,
    uv: Uv,
    env_dir: Path,
    settings: BuildSettings,
    plugin: tuple[str, Path],
    copy: str = "",
    clock: Callable[[], float] = time.perf_counter,
) -> SideEnvironment:
    """The environment of `side` ("base" or "head") built from `inputs` with the interpreter `base` (its base
    executable), or reused from `env_dir`; `plugin`: (its identity, its wheel). Sides with equal inputs share one
    environment unless `copy` names each (--llmperf-compare-deps=build: two builds, the A/A of the machinery)."""
    start = clock()
    version = base.markers["python_full_version"]
    recipe = recipe_for(inputs, settings, version, side)
    key = cache.key_of(key_parts(inputs, recipe, base, uv, settings, plugin[0], copy))
    directory, shown = env_dir / key, recipe.label(settings)

    def record(how: str, held: Probe, findings: tuple[str, ...] = ()) -> SideEnvironment:
        return SideEnvironment(side, how, str(cache.python_in(directory)), held.python_version, key, str(directory),
                               shown, clock() - start, held.installed, findings, held.contents)  # fmt: skip

    def reusable() -> tuple[Probe | None, str | None]:
        marker = cache.ready(directory, key)
        if marker is None:
            return None, None
        try:
            now = probe(str(cache.python_in(directory)))
        except EnvironmentsError as exc:  # its base interpreter moved or went: built again
            return None, f"its interpreter does not run ({exc})"
        return now, _why_not_reused(marker, now, recipe, inputs.root, uv, settings, side)

    if not cache.writable(env_dir):  # read-only: a ready entry is used as it is, nothing is built
        now, why = reusable()
        if now is not None and why is None:
            return record(CACHE_HIT, now)
        raise CannotBuild(f"the environments' cache {env_dir} cannot be written, and it holds no usable environment "
                          f"for this side{f' ({why})' if why else ''}", side=side,
                          fix="give a writable directory: -o llmperf_env_dir=PATH, or the ini key "
                          "llmperf_env_dir")  # fmt: skip
    with cache.entry_lock(directory) as lock:
        now, why = reusable()
        if now is not None and why is None:
            cache.touch(directory)
            return record(CACHE_HIT, now)
        cache.discard(directory)  # what a killed build left, or an environment that no longer holds
        try:
            done = _make(recipe, inputs.root, directory, base, uv, settings, plugin[1], env_dir / cache.WHEELS, side,
                         lock)  # fmt: skip
        except BaseException:
            cache.discard(directory)  # nothing half built stays behind
            raise
        cache.mark_ready(directory, key, {"side_root": str(inputs.root), "recipe": shown, "seconds": clock() - start,
                                          "installed": done.installed, "contents": done.contents,
                                          "python": done.python_version})  # fmt: skip
    return record(BUILT, done, (f"rebuilt: {why}",) if why else ())


def _make(
    recipe: Recipe,
    root: Path,
    directory: Path,
    base: Probe,
    uv: Uv,
    settings: BuildSettings,
    wheel: Path,
    wheels_dir: Path,
    side: str,
    lock: int,
) -> Probe:
    """Build the environment at `directory` (its lock held, and inherited by every uv): the side's dependencies, then
    the plugin."""
    python = cache.python_in(directory)
    what = f"building the {side} side's environment {directory} from {root}/{recipe.label(settings)}"
    run = functools.partial(uv.run, cwd=root, timeout=settings.timeout_s, side=side, hold=(lock,), what=what)
    if recipe.kind == UV_LOCK:
        args = ["sync", "--frozen", "--no-install-project", "--python", base.base_executable, *settings.flags()]
        run([*args, *settings.selection()], env={"UV_PROJECT_ENVIRONMENT": str(directory)})
    else:
        run(["venv", "--no-project", "--python", base.base_executable, str(directory)])
        run(["pip", "install", "--python", str(python), *settings.flags(), *recipe.install_args(settings)])
    own = probe(str(python))
    plugin_install.install(uv, python, own.installed, wheel=wheel, wheels_dir=wheels_dir, flags=settings.flags(),
                           cwd=root, timeout=settings.timeout_s, side=side, hold=(lock,))  # fmt: skip
    done = probe(str(python))
    expected, found = plugin_install.controller_version(), done.installed.get(plugin_install.PLUGIN)
    if found != expected:
        raise BuildFailed(
            f"{directory} has {plugin_install.PLUGIN} {found}, not the controller's {expected}", side=side
        )
    return done
