"""Re-run commands printed in messages: they repeat the options the user gave on the command line, so
following a hint (e.g. an update) never lands in the same refusal for want of --llmperf-baseline-dir."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from .options import OPTIONS_BY_NAME, Settings

#: Options a hint decides itself instead of repeating.
NOT_REPEATED = ("update", "update_missing", "device")


def _format(name: str, value: Any) -> list[str]:
    option = OPTIONS_BY_NAME[name]
    if isinstance(value, bool) and not option.expert:
        return [option.cli] if value else []
    if isinstance(value, Mapping):  # --llmperf-model NAME=PATH, repeated
        return [f"{option.cli}=" + shlex.quote(f"{k}={v}") for k, v in value.items()]
    if isinstance(value, (tuple, list)):
        text = ",".join(map(str, value)) or ("" if option.expert else "none")
    elif isinstance(value, float):
        text = format(value, "g")
    else:
        text = str(value).lower() if isinstance(value, bool) else str(value)
    if option.expert:  # an ini key only: -o sets it for the one run
        return ["-o", shlex.quote(f"{option.ini}={text}")]
    return [f"{option.cli}={shlex.quote(text)}"]


def rerun_command(
    settings: Settings,
    device: str,
    nodeid: str | None = None,
    *,
    update: bool = False,
    replace: Mapping[str, Any] | None = None,
    extra: Sequence[str] = (),
) -> str:
    """`pytest [nodeid] --llmperf-device=D <the options given> [--llmperf-update]`; `replace` sets or
    overrides options (e.g. a higher max_load)."""
    replace = dict(replace or {})
    parts = ["pytest"] + ([shlex.quote(nodeid)] if nodeid else [])
    parts.append(f"--llmperf-device={shlex.quote(replace.pop('device', device))}")
    for name in settings.given:
        if name in NOT_REPEATED or name in replace:
            continue
        parts += _format(name, getattr(settings, name))
    for name, value in replace.items():
        parts += _format(name, value)
    parts += list(extra)
    if update:
        parts.append("--llmperf-update")
    return " ".join(parts)
