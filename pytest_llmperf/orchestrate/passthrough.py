"""pytest's own options of the invocation that a worker must get too: what changes what it loads."""

from __future__ import annotations

import pytest


def passthrough_args(config: pytest.Config) -> list[str]:
    """The invocation's options that change what a worker loads: -p plugins and -o ini overrides."""
    args = list(config.invocation_params.args)
    keep: list[str] = []
    for i, arg in enumerate(args):
        if arg in ("-p", "-o", "--override-ini") and i + 1 < len(args):
            keep += [arg, args[i + 1]]
        elif arg.startswith(("-p", "--override-ini=", "--import-mode")) and len(arg) > 2:
            keep.append(arg)
    return keep
