"""Which environment each side of an A/B job gets: shared, built, the user's base interpreter, or code-only; nothing
unmeasured passes in `auto` or `build` (docs/environments.md, the table of modes)."""

from __future__ import annotations

import platform
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import build, cache, plugin_install
from .build import find_uv
from .inputs import Detection
from .installed import installed_here, probe
from .records import (
    BASE_PYTHON,
    BUILT,
    CODE_ONLY,
    CODE_ONLY_WAY,
    COMPARE_DEPS_MODES,
    CURRENT,
    SHARED,
    WRITABLE_WAY,
    BuildSettings,
    CannotBuild,
    Environments,
    EnvironmentsError,
    SideEnvironment,
    held_changes,
)

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _record(detection: Detection, mode: str, base: SideEnvironment, head: SideEnvironment, **more) -> Environments:
    return Environments(mode, detection.status, base, head, detection.files, detect_seconds=detection.seconds, **more)


def _here(side: str, how: str, **more) -> SideEnvironment:
    version = f"{platform.python_implementation()} {platform.python_version()}"
    return SideEnvironment(side, how, sys.executable, version, **more)


def prepare(
    detection: Detection,
    *,
    mode: str = "auto",
    base_python: str | Path | None = None,
    env_dir: str | Path | None = None,
    settings: BuildSettings | None = None,
    uv: str | Path | None = None,
    cpu_target: bool = False,
) -> Environments:
    """Each side's environment, as the options ask (`cpu_target`: a CUDA torch is worth a warning); CannotBuild where
    what differs cannot be measured, EnvironmentsError where `base_python` cannot be used at all."""
    if mode not in COMPARE_DEPS_MODES:
        raise ValueError(f"mode must be one of {', '.join(COMPARE_DEPS_MODES)}, got {mode!r}")
    settings = settings or BuildSettings()
    if base_python is not None:
        return _with_base_python(detection, mode, str(base_python), settings, uv)
    if mode != "build" and not detection.differs:
        none_found = () if detection.found else (detection.none_found(),)
        return _record(detection, mode, _here("base", SHARED), _here("head", SHARED), notes=none_found)
    if mode == "code-only":
        ours, missed = installed_here(), f"{', '.join(detection.files)} differ (both sides ran this environment)"
        base, head = _here("base", CODE_ONLY, installed=ours), _here("head", CODE_ONLY, installed=ours)
        return _record(detection, mode, base, head, not_measured=(missed,))
    root = Path(env_dir) if env_dir is not None else cache.default_env_dir()
    base, head = _build_both(detection, mode, root, settings, uv)
    kinds = {f.path: f.kind for f in (*detection.base.files, *detection.head.files) if f.data is not None}
    named = {*dict(detection.base.local), *dict(detection.head.local)}  # what a requirements file names: built
    unread = [p for p in detection.files if kinds.get(p) == "other" and p not in ("uv.toml", ".python-version", *named)]
    if unread:
        raise CannotBuild(f"{', '.join(unread)} differ and no build reads them, so what they change is not measured",
                          files=detection.files,
                          fix="name in llmperf_compare_deps_paths only files the sides are built from")  # fmt: skip
    pruned = cache.prune(root) if BUILT in (base.how, head.how) else []  # the cache grew: what no job uses goes
    cuda = [_cuda_note(side) for side in (base, head)] if cpu_target else []
    refused = [p for p in detection.files if kinds.get(p) == "refused"]
    notes = [f"{', '.join(refused)} differ: not what the environments are built from"] if refused else []
    notes += filter(None, cuda)
    if pruned:
        notes.append(f"removed {len(pruned)} environments or wheels that no job used for {cache.UNUSED_DAYS} days "
                     f"from {root}")  # fmt: skip
    changes = held_changes(base.installed, head.installed, base.contents, head.contents)
    if not changes and mode == "auto":  # a form-only edit: one build to learn it, then the job runs as before
        return _record(detection, mode, _here("base", SHARED), _here("head", SHARED), notes=tuple(notes))
    other = (f"built from {base.recipe} -> {head.recipe}",) if base.recipe != head.recipe else ()
    return _record(detection, mode, base, head, changes=changes, other=other, notes=tuple(notes))


def _cuda_note(side: SideEnvironment) -> str | None:
    """A warning where a side's torch is a CUDA build on the cpu target (a different torch from the job's own)."""
    torch, nvidia = side.version("torch"), [name for name in side.installed if name.startswith("nvidia-")]
    if torch is None or not (nvidia or "+cu" in torch):
        return None
    return (f"the {side.side} side's torch {torch} is a CUDA build ({len(nvidia)} nvidia-* packages) on the cpu "
            f"target: give its dependency files torch's CPU index, as the job's install has it: "
            f"`--extra-index-url {CPU_INDEX}` in requirements.txt, or a [[tool.uv.index]] with that url for torch in "
            f"pyproject.toml")  # fmt: skip


def _cannot_build(exc: Exception, side: str | None, files: Sequence[str]) -> CannotBuild:
    """`exc`, raised making a side's environment, as the job's error: naming the inputs that differ."""
    if isinstance(exc, CannotBuild):
        exc.files = tuple(files)
        return exc
    if isinstance(exc, OSError):  # the cache: a file where a directory goes, a full disk
        return CannotBuild(f"cannot write the environments' cache: {exc}", side=side, files=files, fix=WRITABLE_WAY)
    return CannotBuild(str(exc), side=side, files=files)  # a built interpreter that does not run, ...


def _build_both(
    detection: Detection, mode: str, root: Path, settings: BuildSettings, uv: str | Path | None
) -> tuple[SideEnvironment, SideEnvironment]:
    """Both sides built at the same time (uv mostly waits): the first failure, in side order, stops the other's uv."""
    try:
        tool, base_interpreter = find_uv(uv), probe(sys.executable, installed=False)
        plugin = plugin_install.plugin_wheel(root / cache.WHEELS, write=cache.writable(root))
    except (EnvironmentsError, OSError) as exc:  # no uv; this plugin not installed here
        raise _cannot_build(exc, None, detection.files) from None

    def one(side: str) -> SideEnvironment:
        try:
            return build.build_side(side, detection.base if side == "base" else detection.head, base=base_interpreter,
                                    uv=tool, env_dir=root, settings=settings, plugin=plugin,
                                    copy=side if mode == "build" else "")  # fmt: skip
        except (EnvironmentsError, OSError) as exc:
            raise _cannot_build(exc, side, detection.files) from None

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="llmperf-env") as pool:
        futures = [pool.submit(one, side) for side in ("base", "head")]
        try:
            return futures[0].result(), futures[1].result()
        except BaseException:  # a failed side, or Ctrl-C: the other side's uv is not left running
            tool.stop()
            raise


def _with_base_python(
    detection: Detection, mode: str, path: str, settings: BuildSettings, uv: str | Path | None
) -> Environments:
    try:
        given = probe(path)
    except EnvironmentsError as exc:
        raise EnvironmentsError(f"--llmperf-base-python {path}: {exc}") from None
    ours, plugin = probe(sys.executable).installed, plugin_install.PLUGIN
    if given.installed.get(plugin) != ours.get(plugin):
        raise EnvironmentsError(
            f"--llmperf-base-python {path} has {plugin} {given.installed.get(plugin) or '(not installed)'}, this job "
            f"runs {ours.get(plugin)}: both sides must run the same plugin. Install it there: {path} -m pip install "
            f"{plugin}=={ours.get(plugin)}"
        )
    tool, findings, missed = find_uv(uv), dict[str, tuple[str, ...]](), list[str]()
    sides = (("base", detection.base, path, given.version),
             ("head", detection.head, sys.executable, platform.python_version()))  # fmt: skip
    for side, inputs, python, version in sides:
        try:
            recipe = build.recipe_for(inputs, settings, version, side)
        except CannotBuild as exc:  # poetry, conda: what the interpreter was prepared for; uv cannot check it
            findings[side] = (f"not checked: {exc.reason}",)
            continue
        missing = build.Build(side, inputs, recipe, tool, settings).unsatisfied(python)
        findings[side] = tuple(f"does not hold what {recipe.label(settings)} asks for: {m}" for m in missing)
        missed += [f"the {side} side's interpreter {python} {finding}" for finding in findings[side]]
    base = SideEnvironment("base", BASE_PYTHON, path, given.python_version, installed=given.installed,
                           findings=findings["base"])  # fmt: skip
    head = _here("head", CURRENT, installed=ours, findings=findings["head"])
    if missed and mode != "code-only":
        raise CannotBuild("\n    ".join(["what a side runs is not what its files ask for, so the difference is not "
                                         "measured:", *missed]), files=detection.files, ways=(
            "install into each interpreter what its side's files ask for", CODE_ONLY_WAY))  # fmt: skip
    changes = held_changes(given.installed, ours)
    return _record(detection, mode, base, head, changes=changes, not_measured=tuple(missed))
