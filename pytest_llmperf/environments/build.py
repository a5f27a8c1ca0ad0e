"""One side's environment: what it is built from (by file name), its cache key, and its build with uv, or the reuse
of a cache entry that still holds what the side asks for (docs/environments.md); and uv itself, found and run: each
uv in a process group of its own that dies with the controller ("The cache"). An inherited UV_NO_CONFIG would hide
the side's [tool.uv], a VIRTUAL_ENV another environment: dropped."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import cache, plugin_install
from .inputs import REFUSED, DependencyInputs
from .installed import Probe, probe
from .records import (
    BUILT,
    CACHE_HIT,
    WRITABLE_WAY,
    BuildFailed,
    BuildSettings,
    CannotBuild,
    EnvironmentsError,
    SideEnvironment,
    held_changes,
)

UV_LOCK, PYLOCK, REQUIREMENTS, PYPROJECT = "uv.lock", "pylock", "requirements", "pyproject.toml"
#: UV_* variables that change how uv works, not what it installs: left out of the key.
HARMLESS = {"UV_CACHE_DIR", "UV_NO_PROGRESS", "UV_CONCURRENT_DOWNLOADS", "UV_CONCURRENT_BUILDS",
            "UV_CONCURRENT_INSTALLS", "UV_HTTP_TIMEOUT", "UV_REQUEST_TIMEOUT", "UV_LINK_MODE", "UV_NO_CACHE",
            "UV_COLOR", "UV_NATIVE_TLS", "UV_SYSTEM_CERTS"}  # fmt: skip
#: UV_* variables that name files whose content decides what is installed.
FILE_SETTINGS = ("UV_CONSTRAINT", "UV_OVERRIDE", "UV_BUILD_CONSTRAINT", "UV_EXCLUDE", "UV_CONFIG_FILE")
#: Local packages (workspace members, editable sources) go in as copies, not links into the checkout: the base
#: side's worktree is removed at the job's end, the working tree moves on, and the environment stays in the cache.
COPIES = "--no-editable"


@dataclass(frozen=True)
class Recipe:
    """What a side's environment is built from."""

    kind: str  # UV_LOCK, PYLOCK, REQUIREMENTS or PYPROJECT
    requirements: tuple[str, ...] = ()  # -r files (with pyproject.toml where it declares dependencies)
    constraints: tuple[str, ...] = ()  # -c files
    selects: bool = True  # whether the project's extras and groups apply (it reads a pyproject.toml or a lock)

    def label(self, settings: BuildSettings) -> str:
        """What the side was built from, as the header says it ('uv.lock --extra gpu')."""
        files = [*self.requirements, *(f"-c {c}" for c in self.constraints)] or [self.kind]
        return " ".join([*files, *(settings.selection() if self.selects else [])])

    def install_args(self, settings: BuildSettings) -> list[str]:
        args = [item for r in self.requirements for item in ("-r", r)]
        args += [item for c in self.constraints for item in ("-c", c)]
        return args + (settings.selection() if self.selects else [])


def _project(inputs: DependencyInputs) -> dict[str, Any]:
    """The [project] table of the side's pyproject.toml ({} where there is none)."""
    file = inputs.get("pyproject.toml")
    if file is None or file.data is None:
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib  # pytest requires it there
    try:
        project = tomllib.loads(file.data.decode("utf-8-sig")).get("project")
    except (ValueError, UnicodeDecodeError) as exc:
        raise CannotBuild(f"cannot read {inputs.root / 'pyproject.toml'}: {exc}") from None
    return project if isinstance(project, dict) else {}


def _check_python(inputs: DependencyInputs, project: dict[str, Any], version: str, side: str) -> None:
    """CannotBuild where the side asks for a Python that this job's is not: both sides are built with it."""
    wanted = project.get("requires-python")
    if wanted:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        with contextlib.suppress(InvalidSpecifier):  # uv says what is wrong with it
            if not SpecifierSet(wanted).contains(version, prereleases=True):
                raise CannotBuild(f"its pyproject.toml has requires-python {wanted}; this job's Python is {version}, "
                                  "and both sides are built with it", side=side)  # fmt: skip
    pinned = inputs.get(".python-version")
    words = pinned.data.decode("utf-8-sig", errors="replace").split() if pinned and pinned.data else []
    named = re.sub(r"^(cpython-?|python)", "", words[0].lower()) if words else ""
    if named and version != named and not version.startswith(named + "."):
        raise CannotBuild(f".python-version names {named}; this job's Python is {version}, and both sides are built "
                          "with it", side=side)  # fmt: skip


def recipe_for(inputs: DependencyInputs, settings: BuildSettings, version: str, side: str) -> Recipe:
    """How the side is built on Python `version`; CannotBuild where uv cannot build it or it wants another Python."""
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
    """uv's configuration beyond the side's files: UV_* variables (and the files they name), every uv.toml it reads."""
    found: dict[str, Any] = {k: v for k, v in os.environ.items() if k.startswith("UV_") and k not in HARMLESS}
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
    paths = [config / "uv" / "uv.toml", Path("/etc/uv/uv.toml"), *(Path(d) / "uv" / "uv.toml" for d in dirs)]
    paths += [d / "uv.toml" for d in root.resolve().parents]
    paths += [Path(p) for name in FILE_SETTINGS for p in os.environ.get(name, "").split() if p]
    for path in paths:
        with contextlib.suppress(OSError):
            found[str(path)] = path.read_text(errors="replace")
    return found


@dataclass(frozen=True)
class Build:
    """One side's build: the side, its inputs and recipe, and the uv and settings both sides are built with."""

    side: str
    inputs: DependencyInputs
    recipe: Recipe
    uv: Uv
    settings: BuildSettings

    def run(self, args: list[str], **more: Any) -> Any:
        return self.uv.run(args, cwd=self.inputs.root, timeout=self.settings.timeout_s, side=self.side, **more)

    def key_parts(self, base: Probe, plugin: str, copy: str) -> dict[str, Any]:
        """Everything that decides what the environment holds (`copy`: a name that keeps two builds apart)."""
        return {
            "python": dict(base.identity),
            "platform": platform.libc_ver(),
            "uv": self.uv.version,
            "uv_settings": uv_settings(self.inputs.root),
            "recipe": asdict(self.recipe),
            "inputs": self.inputs.digests(),
            "settings": {k: v for k, v in asdict(self.settings).items() if k != "timeout_s"},
            "plugin": plugin,
            "plugin_requirements": plugin_install.requirement_closure(),
            **({"copy": copy} if copy else {}),
        }

    def unsatisfied(self, python: str) -> tuple[str, ...]:
        """What `python` lacks of what the side asks for, as uv's dry run says it; this plugin aside (it is ours)."""
        flags = [COPIES, *self.settings.flags()]
        with tempfile.TemporaryDirectory(prefix="llmperf-env-") as scratch:
            args = ["pip", "install", "--dry-run", "--python", python, *flags]
            if self.recipe.kind == UV_LOCK:
                exported = Path(scratch, "requirements.txt")
                export = ["export", "--frozen", "--no-hashes", "--no-emit-workspace", "--format", "requirements-txt"]
                self.run([*export, "-q", "-o", str(exported), *flags, *self.settings.selection()])
                args += ["-r", str(exported)]
            else:
                args += self.recipe.install_args(self.settings)
            done = self.run(args, check=False)
        said = [line.strip() for line in done.stderr.splitlines()]
        changes = [line for line in said if line[:2] in ("+ ", "- ") and plugin_install.PLUGIN not in line]
        if done.returncode == 0 and not changes:
            return ()
        return tuple(changes) or tuple(said[-3:]) or (f"uv exited with {done.returncode}",)

    def reusable(self, directory: Path, key: str) -> tuple[Probe | None, str | None]:
        """The ready entry at `directory`, probed (None: there is none), and why it cannot be reused (None: it can)."""
        marker = cache.ready(directory, key)
        if marker is None:
            return None, None
        try:
            now = probe(str(cache.python_in(directory)))
        except EnvironmentsError as exc:  # its base interpreter moved or went
            return None, f"its interpreter does not run ({exc})"
        if now.damaged:
            return now, f"its files changed since it was built ({'; '.join(now.damaged)})"
        if now.installed != marker.get("installed") or now.contents != marker.get("contents"):
            changed = held_changes(marker.get("installed") or {}, now.installed, marker.get("contents") or {},
                                   now.contents)  # fmt: skip
            return now, f"what it holds changed since it was built ({'; '.join(map(str, changed))})"
        missing = self.unsatisfied(now.executable)
        return now, f"it does not hold what the side asks for (uv: {'; '.join(missing)})" if missing else None

    def make(self, directory: Path, base: Probe, wheel: Path, wheels_dir: Path, lock: int) -> Probe:
        """Build the environment at `directory`, every uv inheriting its `lock`: the side's dependencies, the plugin."""
        python, flags = cache.python_in(directory), [COPIES, *self.settings.flags()]
        what = f"building the {self.side} side's environment {directory} from {self.inputs.root}/{self.label()}"
        run = functools.partial(self.run, hold=(lock,), what=what)
        env: Mapping[str, str] | None = None
        if self.recipe.kind == UV_LOCK:
            args = ["sync", "--frozen", "--no-install-project", "--python", base.base_executable, *flags]
            args, env = [*args, *self.settings.selection()], {"UV_PROJECT_ENVIRONMENT": str(directory)}
        else:
            run(["venv", "--no-project", "--python", base.base_executable, str(directory)])
            args = ["pip", "install", "--python", str(python), *flags, *self.recipe.install_args(self.settings)]
        run(args, env=env)
        own = probe(str(python))
        if own.local:  # uv's cache knows a local package's build by its path and pyproject.toml's time, not its files
            run([*args, *(item for name in own.local for item in ("--reinstall-package", name))], env=env)
            own = probe(str(python))
        plugin_install.install(run, python, own.installed, wheel, wheels_dir, self.settings.flags())
        done = probe(str(python))
        expected, found = plugin_install.controller_version(), done.installed.get(plugin_install.PLUGIN)
        if found != expected:
            raise BuildFailed(f"{directory} has {plugin_install.PLUGIN} {found}, not the controller's {expected}",
                              side=self.side)  # fmt: skip
        return done

    def label(self) -> str:
        return self.recipe.label(self.settings)


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
    """The environment of `side` built from `inputs` on `base`, or reused from `env_dir`; `copy` keeps the sides'
    entries apart where their inputs are equal (--llmperf-compare-deps=build, the machinery's A/A check)."""
    start = clock()
    build = Build(side, inputs, recipe_for(inputs, settings, base.version, side), uv, settings)
    key = cache.key_of(build.key_parts(base, plugin[0], copy))
    directory, writable = env_dir / key, cache.writable(env_dir)

    def record(how: str, held: Probe, findings: tuple[str, ...] = ()) -> SideEnvironment:
        return SideEnvironment(side, how, str(cache.python_in(directory)), held.python_version, key, str(directory),
                               build.label(), clock() - start, held.installed, findings, held.contents)  # fmt: skip

    # A cache this job cannot write is read without a lock: a ready entry is used as it is, nothing is built.
    with cache.entry_lock(directory) if writable else contextlib.nullcontext() as lock:
        now, why = build.reusable(directory, key)
        if now is not None and why is None:
            if writable:
                cache.touch(directory)
            return record(CACHE_HIT, now)
        if lock is None:
            raise CannotBuild(f"the environments' cache {env_dir} cannot be written, and it holds no usable environment"
                              f" for this side{f' ({why})' if why else ''}", side=side, fix=WRITABLE_WAY)  # fmt: skip
        cache.discard(directory)  # what a killed build left, or an environment that no longer holds
        try:
            done = build.make(directory, base, plugin[1], env_dir / cache.WHEELS, lock)
        except BaseException:
            cache.discard(directory)  # nothing half built stays behind
            raise
        cache.mark_ready(directory, key, {"side_root": str(inputs.root), "recipe": build.label(),
                                          "seconds": clock() - start, "installed": done.installed,
                                          "contents": done.contents, "python": done.python_version})  # fmt: skip
    return record(BUILT, done, (f"rebuilt: {why}",) if why else ())


# uv, found and run.
INSTALL_UV = "install uv (pip install uv; it is on PyPI) or name it with the uv argument"
DROPPED = ("VIRTUAL_ENV", "UV_NO_CONFIG", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")
#: Run by the controller's Python -I -S; argv: the controller's pid, then the command. The kernel tells it when the
#: controller dies, even by SIGKILL (PR_SET_PDEATHSIG, Linux); it then kills its group, uv's children with it.
SUPERVISOR = """\
import ctypes, os, signal, subprocess, sys
def stop(*_):
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, stop)
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    stop()
code = subprocess.call(sys.argv[2:])
sys.exit(code if code >= 0 else 128 - code)
"""
LINUX = sys.platform.startswith("linux")


@dataclass(frozen=True)
class Uv:
    path: str
    version: str  # e.g. "0.13.9"
    running: set[subprocess.Popen[str]] = field(default_factory=set, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def stop(self) -> None:
        """Kill every uv this one runs, from any thread: the controller stops waiting for them."""
        with self._lock:
            for proc in list(self.running):
                _kill_group(proc)

    def run(
        self,
        args: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        timeout: float = 3600.0,
        what: str = "",
        side: str | None = None,
        hold: Sequence[int] = (),
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run `uv ARGS` in `cwd`, inheriting `hold` (an entry's lock); BuildFailed with the command and uv's words."""
        environ = {**{k: v for k, v in os.environ.items() if k not in DROPPED}, **(env or {})}
        command, what = [self.path, *args], what or "uv"
        settings = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items()]
        shown = f"cd {shlex.quote(str(cwd))} && " + " ".join([*settings, shlex.join(command)])
        supervised = [sys.executable, "-I", "-S", "-c", SUPERVISOR, str(os.getpid())] if LINUX else []
        try:
            proc = subprocess.Popen([*supervised, *command], cwd=cwd, env=environ, text=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
                                    pass_fds=tuple(hold))  # fmt: skip
        except OSError as exc:
            raise BuildFailed(f"{what} could not start: {exc}", side=side, fix=INSTALL_UV) from None
        with self._lock:
            self.running.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc, wait=True)
            raise BuildFailed(f"{what} took more than {timeout:g} s:\n    {shown}", side=side) from None
        except BaseException:  # Ctrl-C, SIGTERM as KeyboardInterrupt: nothing of it goes on writing into the cache
            _kill_group(proc, wait=True)
            raise
        finally:
            with self._lock:
                self.running.discard(proc)
        if check and proc.returncode != 0:
            said = "\n".join(f"    {line}" for line in err.strip().splitlines()[-15:])
            raise BuildFailed(
                f"{what} failed (exit {proc.returncode}):\n    {shown}\n  uv said:\n{said}",
                side=side,
                fix="make it buildable here: an index reachable (or the packages in uv's cache, or find-links with "
                "the wheels), and a lock that resolves on this machine",
            )
        return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[str], wait: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if wait:
        proc.wait()


def find_uv(explicit: str | Path | None = None) -> Uv:
    """uv: `explicit`, else the one on PATH, else the uv Python package's; CannotBuild when none runs."""
    candidates = [str(explicit)] if explicit else [c for c in (shutil.which("uv"), _bundled()) if c]
    for path in candidates:
        try:
            words = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout.split()
        except (OSError, subprocess.SubprocessError):
            continue
        if len(words) >= 2 and words[0] == "uv":
            return Uv(path, words[1])
    where = f"{explicit} does not run" if explicit else "uv is not installed (not on PATH, no uv Python package)"
    raise CannotBuild(where, fix=INSTALL_UV)


def _bundled() -> str | None:
    """The uv binary of the `uv` Python package installed here, whether or not its bin is on PATH."""
    try:
        import uv

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError, AttributeError):
        return None
