"""pytest's own options of the invocation that a worker needs too, as pytest parsed them, for one side.

A worker runs in its side's rootdir with the tests' node ids, so whatever decides how pytest loads those tests must
reach it: plugins given with -p, ini overrides (-o), the ini file (-c), the import mode, conftest handling, warning
filters and strictness. They are read from pytest's parsed options, not the command line's words (`--import-mode
importlib`, value as a separate word, is one option), and a path is given absolute, or for the A side of an A/B job
its counterpart in the ref's checkout. The rootdir is the side's own, always: a worker's node ids are relative to
it (an invocation with `--rootdir=tests` gets its tests' ids back).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

#: pytest's boolean options that change what a collection accepts.
FLAGS = (("noconftest", "--noconftest"), ("strict_markers", "--strict-markers"), ("strict_config", "--strict-config"))


def passthrough_args(
    config: pytest.Config, root: Path, counterpart: Callable[[Path], Path] = lambda path: path
) -> list[str]:
    """The options a worker of a side whose rootdir is `root` gets; `counterpart` maps a path of the working tree to
    that side's (the ref's checkout)."""
    option, invoked = config.option, Path(config.invocation_params.dir)

    def path(value: str) -> str:
        return str(counterpart((invoked / value).resolve()))

    args = [f"--rootdir={root}"]
    for name in getattr(option, "plugins", None) or []:
        args += ["-p", name]
    for override in getattr(option, "override_ini", None) or []:
        args += ["-o", override]
    if getattr(option, "inifilename", None):
        args += ["-c", path(option.inifilename)]
    if getattr(option, "confcutdir", None):
        args.append(f"--confcutdir={path(option.confcutdir)}")
    if getattr(option, "importmode", None):
        args.append(f"--import-mode={option.importmode}")
    for warning in getattr(option, "pythonwarnings", None) or []:
        args += ["-W", warning]
    args += [flag for name, flag in FLAGS if getattr(option, name, False)]
    return args
