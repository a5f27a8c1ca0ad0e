"""Each side's environment for an A/B job: shared, built, the user's base interpreter, or code-only, and why.

    detection = detect(base_root, head_root, extra)        # inputs.py: by bytes, nothing built
    environments = prepare(detection, mode=..., ...)       # here: may build; CannotBuild says the ways out

`auto` (the default) shares the controller's environment where the sides' inputs are byte-identical; where they
differ it builds both sides (at the same time) and compares what the two environments hold: the same packages, and
the sides run shared again, said so; else each side runs its own, the packages that differ named. `build` always
builds both, each its own (the A/A check of the machinery); `code-only` never builds, and the record says the
difference was not measured. A base interpreter (`--llmperf-base-python`) runs the base side instead of a build,
checked by uv against the base side's files; the head side runs in the controller's environment, checked likewise.
Nothing that is not measured passes in `auto` or `build`: CannotBuild, with the ways out.
"""

from __future__ import annotations

import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import build, cache, wheels
from .errors import CODE_ONLY_WAY, CannotBuild, EnvironmentsError
from .inputs import Detection
from .installed import installed_here, probe
from .records import (
    BASE_PYTHON,
    CHANGED,
    CODE_ONLY,
    COMPARE_DEPS_MODES,
    CURRENT,
    NONE_FOUND,
    SHARED,
    UNCHANGED,
    BuildSettings,
    Environments,
    SideEnvironment,
    canonical_name,
    held_changes,
)  # fmt: skip
from .uv_runner import find_uv

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _record(detection: Detection, mode: str, base: SideEnvironment, head: SideEnvironment, **more) -> Environments:
    status = CHANGED if detection.differs else UNCHANGED if detection.found else NONE_FOUND
    return Environments(mode, status, base, head, detection.files, detect_seconds=detection.seconds, **more)


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
    """Each side's environment for `detection`'s two sides.

    mode: auto, build or code-only (--llmperf-compare-deps). base_python: the base side's interpreter
    (--llmperf-base-python), which wins over the mode: nothing is built. env_dir: the cache of built environments
    (default cache.default_env_dir()). settings: how both sides are built. uv: the uv binary (default: on PATH or
    the uv package's). cpu_target: the job measures the cpu target (a CUDA build of torch is worth a warning).

    Raises CannotBuild (the dependencies differ and what they change cannot be measured: no uv, a failed build, a
    base interpreter that does not hold the base side's dependencies; the message names the side and the ways out)
    and EnvironmentsError (a base_python that cannot be used at all)."""
    if mode not in COMPARE_DEPS_MODES:
        raise ValueError(f"mode must be one of {', '.join(COMPARE_DEPS_MODES)}, got {mode!r}")
    settings = settings or BuildSettings()
    if base_python is not None:
        return _with_base_python(detection, mode, str(base_python), settings, uv)
    if mode != "build" and not detection.differs:
        notes = () if detection.found else (detection.none_found(),)
        return _record(detection, mode, _here("base", SHARED), _here("head", SHARED), notes=notes)
    if mode == "code-only":
        ours = installed_here()
        missed = f"{', '.join(detection.files)} differ (both sides ran this environment)"
        base, head = _here("base", CODE_ONLY, installed=ours), _here("head", CODE_ONLY, installed=ours)
        return _record(detection, mode, base, head, not_measured=(missed,))
    base, head = _build_both(detection, mode, env_dir, settings, uv)
    unread = [p for p in detection.files if _unread(detection, p)]
    if unread:
        raise CannotBuild(f"{', '.join(unread)} differ and no build reads them, so what they change is not measured",
                          files=detection.files,
                          fix="name in llmperf_compare_deps_paths only files the sides are built from")  # fmt: skip
    warned = (_cuda_note(side) for side in (base, head) if cpu_target)
    said = (*_refused_notes(detection), *(note for note in warned if note))
    changes = held_changes(base.installed, head.installed, base.contents, head.contents)
    if not changes and mode == "auto":  # a form-only edit: one build to learn it, then the job runs as before
        return _record(detection, mode, _here("base", SHARED), _here("head", SHARED), notes=said)
    other = (f"built from {base.recipe} -> {head.recipe}",) if base.recipe != head.recipe else ()
    return _record(detection, mode, base, head, changes=changes, other=other, notes=said)


def _unread(detection: Detection, path: str) -> bool:
    """Whether a differing input is one that no build reads: a file named by llmperf_compare_deps_paths that is no
    requirements file, nor a wheel or directory that one names."""
    file, named = (
        detection.head.get(path) or detection.base.get(path),
        {*dict(detection.base.local), *dict(detection.head.local)},
    )
    return file is not None and file.kind == "other" and path not in ("uv.toml", ".python-version", *named)


def _refused_notes(detection: Detection) -> list[str]:
    refused = [
        p for p in detection.files if (f := detection.head.get(p) or detection.base.get(p)) and f.kind == "refused"
    ]
    return [f"{', '.join(refused)} differ: not what the environments are built from"] if refused else []


def _cuda_note(side: SideEnvironment) -> str | None:
    """A warning where a side's torch is a CUDA build on the cpu target (a different torch from the job's own)."""
    torch, nvidia = side.version("torch"), [name for name in side.installed if name.startswith("nvidia-")]
    if torch is None or not (nvidia or "+cu" in torch):
        return None
    return (f"the {side.side} side's torch {torch} is a CUDA build ({len(nvidia)} nvidia-* packages) on the cpu "
            f"target: give its dependency files torch's CPU index, as the job's install has it: "
            f"`--extra-index-url {CPU_INDEX}` in requirements.txt, or a [[tool.uv.index]] with that url for torch in "
            f"pyproject.toml")  # fmt: skip


def _build_both(
    detection: Detection, mode: str, env_dir: str | Path | None, settings: BuildSettings, uv: str | Path | None
) -> tuple[SideEnvironment, SideEnvironment]:
    """Both sides built at the same time (uv mostly waits on files and the network; a cache hit beside a build costs
    nothing): the first failure, in side order, is raised, and the other side's uv is stopped."""
    root = Path(env_dir) if env_dir is not None else cache.default_env_dir()
    try:
        tool, base_interpreter = find_uv(uv), probe(sys.executable, installed=False)
        plugin = wheels.plugin_wheel(root / cache.WHEELS, write=cache.writable(root))
    except CannotBuild as exc:
        raise exc.naming(detection.files) from None
    except EnvironmentsError as exc:  # this job's plugin cannot be installed elsewhere (not installed here)
        raise CannotBuild(str(exc), files=detection.files) from None
    except OSError as exc:
        raise CannotBuild(f"cannot write the environments' cache: {exc}", files=detection.files,
                          fix="give a writable directory: -o llmperf_env_dir=PATH") from None  # fmt: skip

    def one(side: str) -> SideEnvironment:
        inputs = detection.base if side == "base" else detection.head
        try:
            return build.build_side(side, inputs, base=base_interpreter, uv=tool, env_dir=root, settings=settings,
                                    plugin=plugin, copy=side if mode == "build" else "")  # fmt: skip
        except CannotBuild as exc:
            raise exc.naming(detection.files) from None
        except EnvironmentsError as exc:  # a built interpreter that does not run, a plugin that is not installed here
            raise CannotBuild(str(exc), side=side, files=detection.files) from None
        except OSError as exc:  # the cache: a file where a directory goes, a full disk
            raise CannotBuild(f"cannot write the environments' cache: {exc}", side=side, files=detection.files,
                              fix="give a writable directory: -o llmperf_env_dir=PATH, or the ini key "
                              "llmperf_env_dir") from None  # fmt: skip

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
    from .plugin_install import PLUGIN

    try:
        given = probe(path)
    except EnvironmentsError as exc:
        raise EnvironmentsError(f"--llmperf-base-python {path}: {exc}") from None
    ours = probe(sys.executable).installed
    plugin = canonical_name(PLUGIN)
    if given.installed.get(plugin) != ours.get(plugin):
        have = given.installed.get(plugin)
        raise EnvironmentsError(
            f"--llmperf-base-python {path} has {PLUGIN} {have or '(not installed)'}, this job runs {ours.get(plugin)}: "
            f"both sides must run the same plugin. Install it there: {path} -m pip install {PLUGIN}=={ours.get(plugin)}"
        )
    tool = find_uv(uv)
    findings: dict[str, tuple[str, ...]] = {}
    sides = (("base", detection.base, path, given.markers["python_full_version"]),
             ("head", detection.head, sys.executable, platform.python_version()))  # fmt: skip
    for side, inputs, python, version in sides:
        try:
            recipe = build.recipe_for(inputs, settings, version, side)
        except CannotBuild as exc:  # poetry, conda: what the interpreter was prepared for; uv cannot check it
            findings[side] = (f"not checked: {exc.reason}",)
            continue
        missing = build.unsatisfied(recipe, inputs.root, python, tool, settings, side)
        findings[side] = tuple(f"does not hold what {recipe.label(settings)} asks for: {m}" for m in missing)
    base = SideEnvironment("base", BASE_PYTHON, path, given.python_version, installed=given.installed,
                           findings=findings["base"])  # fmt: skip
    head = _here("head", CURRENT, installed=ours, findings=findings["head"])
    missed = tuple(f"the {s.side} side's interpreter {s.python} {f}" for s in (base, head) for f in s.findings
                   if not f.startswith("not checked"))  # fmt: skip
    if missed and mode != "code-only":
        raise CannotBuild("\n    ".join(["what a side runs is not what its files ask for, so the difference is not "
                                         "measured:", *missed]), files=detection.files, ways=(
            "install into each interpreter what its side's files ask for", CODE_ONLY_WAY))  # fmt: skip
    return _record(detection, mode, base, head, changes=held_changes(given.installed, ours), not_measured=missed)
