"""Each side's environment for an A/B job: shared, built, the user's base interpreter, or code-only, and why.

    detection = detect(base_root, head_root, extra)        # detection.py: cheap, nothing built
    environments = prepare(detection, mode=..., ...)       # here: may build; CannotBuild says the ways out

`auto` (the default) builds both sides' environments when their dependencies differ and shares the controller's
when they do not; `build` always builds both, each its own (the A/A check of the machinery); `code-only` never
builds, and the record names each dependency change as not measured. A base interpreter (`--llmperf-base-python`)
runs the base side instead of a build, checked against the base side's declared dependencies; the head side then runs
in the controller's environment. Nothing that cannot be measured passes silently: CannotBuild, or `not_measured`.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import replace
from pathlib import Path

from .detection import Detection
from .errors import CannotBuild, EnvironmentsError
from .records import (
    BASE_PYTHON,
    CODE_ONLY,
    COMPARE_DEPS_MODES,
    CURRENT,
    SHARED,
    BuildSettings,
    Environments,
    SideEnvironment,
    canonical_name,
    unmeasured,
)


def _python_matches(wanted: str | None, version: str) -> bool:
    """Whether a .python-version entry ('3.11', '3.11.7', 'cpython-3.11') names the interpreter of `version`."""
    if not wanted:
        return True
    text = wanted.strip().lower()
    for prefix in ("cpython-", "cpython", "python"):
        text = text.removeprefix(prefix)
    return version == text or version.startswith(text + ".")


def _record(detection: Detection, mode: str, base: SideEnvironment, head: SideEnvironment, **more) -> Environments:
    return Environments(
        mode,
        detection.status,
        base,
        head,
        detection.files,
        detection.changes,
        detection.other,
        detection.notes,
        detect_seconds=detection.seconds,
        **more,
    )


def _python_difference(detection: Detection, version: str) -> tuple[str | None, str | None]:
    """(a note when the sides' .python-version differ but both name `version`, the difference otherwise)."""
    if detection.python_versions is None:
        return None, None
    before, after = detection.python_versions
    said = f".python-version {before} -> {after}"
    if _python_matches(before, version) and _python_matches(after, version):
        return f"{said}: both name the interpreter of this job, Python {version}", None
    return None, said


def _with_base_python(detection: Detection, mode: str, path: str) -> Environments:
    from .differences import declare
    from .installed import installed_here, probe
    from .plugin_install import PLUGIN
    from .satisfied import unsatisfied

    try:
        given = probe(path)
    except EnvironmentsError as exc:
        raise EnvironmentsError(f"--llmperf-base-python {path}: {exc}") from None
    ours = installed_here()
    plugin = canonical_name(PLUGIN)
    if given.installed.get(plugin) != ours.get(plugin):
        have = given.installed.get(plugin)
        raise EnvironmentsError(
            f"--llmperf-base-python {path} has {PLUGIN} {have or '(not installed)'}, this job runs {ours.get(plugin)}: "
            f"both sides must run the same plugin. Install it there: {path} -m pip install {PLUGIN}=={ours.get(plugin)}"
        )
    here = {"python_full_version": platform.python_version(), "sys_platform": sys.platform}
    base = SideEnvironment(
        "base",
        BASE_PYTHON,
        path,
        given.python_version,
        installed=given.installed,
        findings=unsatisfied(declare(detection.base), given.installed, given.markers),
    )
    head = SideEnvironment(
        "head",
        CURRENT,
        sys.executable,
        f"{platform.python_implementation()} {platform.python_version()}",
        installed=ours,
        findings=unsatisfied(declare(detection.head), ours, {**given.markers, **here}),
    )
    return _record(detection, mode, base, head, not_measured=unmeasured(detection.changes, base, head))


def _code_only(detection: Detection, mode: str, python_difference: str | None) -> Environments:
    from .installed import installed_here

    ours = installed_here()
    version = f"{platform.python_implementation()} {platform.python_version()}"
    base, head = (SideEnvironment(s, CODE_ONLY, sys.executable, version, installed=ours) for s in ("base", "head"))
    missed = [*unmeasured(detection.changes, base, head), *detection.other]
    missed += [python_difference] if python_difference else []
    missed += [f"cannot read {item}" for item in detection.unreadable]
    return _record(detection, mode, base, head, not_measured=tuple(missed))


def prepare(
    detection: Detection,
    *,
    mode: str = "auto",
    base_python: str | Path | None = None,
    env_dir: str | Path | None = None,
    settings: BuildSettings | None = None,
    uv: str | Path | None = None,
) -> Environments:
    """Each side's environment for `detection`'s two sides.

    mode: auto, build or code-only (--llmperf-compare-deps). base_python: the base side's interpreter
    (--llmperf-base-python). env_dir: the cache of built environments (default cache.default_env_dir()).
    settings: how both sides are built (default: BuildSettings()); both are built with this interpreter's base.
    uv: the uv binary (default: found on PATH or from the uv package).

    A base_python wins over the mode: nothing is built, and the base side runs it.

    Raises CannotBuild (the dependencies differ and cannot be built: no uv, a file not read, a failed build; the
    message names the packages and the ways out) and EnvironmentsError (a base_python that cannot be used)."""
    if mode not in COMPARE_DEPS_MODES:
        raise ValueError(f"mode must be one of {', '.join(COMPARE_DEPS_MODES)}, got {mode!r}")
    if base_python is not None:
        return _with_base_python(detection, mode, str(base_python))
    note, python_difference = None, None
    if detection.python_versions is not None:
        note, python_difference = _python_difference(detection, platform.python_version())
    only_python = not (detection.changes or detection.other or detection.unreadable)
    differs = detection.differs and not (only_python and python_difference is None)
    if note:
        detection = replace(detection, notes=(*detection.notes, note))
    if mode == "code-only" or (mode == "auto" and not differs):
        if differs:
            return _code_only(detection, mode, python_difference)
        shared = SideEnvironment("base", SHARED, sys.executable)
        return _record(detection, mode, shared, replace(shared, side="head"))
    return _build_both(detection, mode, python_difference, env_dir, settings, uv)


def _build_both(
    detection: Detection,
    mode: str,
    python_difference: str | None,
    env_dir: str | Path | None,
    settings: BuildSettings | None,
    uv: str | Path | None,
) -> Environments:
    changes, other = detection.changes, detection.other
    if detection.unreadable:
        raise CannotBuild(
            "cannot read " + "; ".join(detection.unreadable),
            changes=changes,
            other=other,
            fix="fix the file; name in llmperf_compare_deps_paths only files pytest-llmperf reads",
        )
    if python_difference:
        raise CannotBuild(
            f"{python_difference}, and both sides are built with one interpreter",
            changes=changes,
            other=other,
            fix="run the job with the head side's Python, and give the base side's as --llmperf-base-python",
        )
    from . import build, cache
    from .installed import probe
    from .uv_runner import find_uv

    try:
        tool = find_uv(uv)
        base_interpreter = probe(sys.executable, installed=False)
        root = Path(env_dir) if env_dir is not None else cache.default_env_dir()
        sides = [
            build.build_side(
                side,
                inputs,
                base=base_interpreter,
                uv=tool,
                env_dir=root,
                settings=settings or BuildSettings(),
                copy=side if mode == "build" else "",
            )
            for side, inputs in (("base", detection.base), ("head", detection.head))
        ]
    except CannotBuild as exc:
        raise exc.with_differences(changes, other) from None
    except EnvironmentsError as exc:  # a built interpreter that does not run, a plugin that is not installed here
        raise CannotBuild(str(exc), changes=changes, other=other) from None
    except OSError as exc:  # the cache: not writable, a file where a directory goes, a full disk
        raise CannotBuild(
            f"cannot write the environments' cache: {exc}",
            changes=changes,
            other=other,
            fix="give a writable directory: --llmperf-env-dir=PATH (ini llmperf_env_dir, or LLMPERF_ENV_DIR)",
        ) from None
    return _record(detection, mode, sides[0], sides[1], not_measured=unmeasured(changes, sides[0], sides[1]))
