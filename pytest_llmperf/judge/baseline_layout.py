"""Where baselines live: one set per device, and on the cpu target one set per machine.

    <baseline_dir>/<device>/<module>.json              GPU targets (the device name is the GPU model)
    <baseline_dir>/cpu/<machine>/<module>.json          the cpu target: a baseline is valid only for its CPU
    <baseline_dir>/<device>/<machine>/<module>.json     any target, with --llmperf-machine NAME

The machine name is a readable slug of the CPU's identity (model, family/model/stepping, the strongest
kernel ISA), so a laptop's `--llmperf-update` writes the laptop's own set and never the CI runner's,
and each set is compared only on the machine that recorded it. Device and machine names become path
components: they must be plain names, never `..` or a path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

#: Strongest first: the ISA level that tells two hosts behind one CPU name apart.
ISA_RANK = (
    "amx_bf16",
    "avx512_fp16",
    "avx512_bf16",
    "avx512_vnni",
    "avx512f",
    "avx_vnni",
    "avx2",
    "sve2",
    "sve",
    "asimd",
)
_NOISE_WORDS = {"r", "tm", "cpu", "processor", "core", "with", "radeon", "graphics"}


def check_name(value: str) -> str:
    """`value` when it is a plain name (letters, digits, '.', '_', '-'; not starting with '.'), else ValueError."""
    if not NAME.fullmatch(value or ""):
        raise ValueError(
            f"{value!r} is not a plain name: it names a directory under the baseline and "
            "report directories, so use letters, digits, '.', '_' or '-' (at most 64, not starting "
            "with '.'), e.g. cpu, a100, ci-runner"
        )
    return value


def machine_slug(identity: Mapping[str, Any]) -> str:
    """'Intel(R) Xeon(R) Processor', family 6 model 167 stepping 1, AMX -> 'intel-xeon-f6-m167-s1-amxbf16'."""
    model = re.sub(r"\([^)]*\)|@.*$|\b\d+-core\b", " ", str(identity.get("cpu_model") or "").lower())
    words = [w for w in re.split(r"[^a-z0-9]+", model) if w and w not in _NOISE_WORDS]
    fields = dict(re.findall(r"(cpu family|model|stepping)=(\S+)", str(identity.get("cpu_signature") or "")))
    signature = [
        f"{prefix}{fields[name]}"
        for prefix, name in (("f", "cpu family"), ("m", "model"), ("s", "stepping"))
        if name in fields
    ]
    isa = [flag.replace("_", "") for flag in ISA_RANK if flag in (identity.get("cpu_isa") or [])][:1]
    slug = "-".join([*words[:4], *signature, *isa]) or "machine"
    return re.sub(r"[^a-z0-9.-]+", "-", slug)[:64].strip("-.") or "machine"


def set_directory(root: Path, device: str, machine: str | None) -> Path:
    """One machine's set: `<root>/<device>/<machine>`, or `<root>/<device>` without a machine."""
    return root / device / machine if machine else root / device


def module_file(module: str) -> Path:
    """`benchmarks/test_x.py` -> `benchmarks/test_x.json`."""
    return Path(module).with_suffix(".json")


def other_sets(device_dir: Path, machine: str, module: str) -> list[str]:
    """The other machines of this device whose set holds a file for `module`."""
    if not device_dir.is_dir():
        return []
    return sorted(
        d.name
        for d in device_dir.iterdir()
        if d.is_dir() and d.name != machine and NAME.fullmatch(d.name) and (d / module_file(module)).is_file()
    )


def key_of_test(nodeid: str) -> str:
    """The baseline key of a test item: its node id without the module ('TestX::test_y[a]')."""
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def stale_keys(stored: list[str], tests: set[str]) -> list[str]:
    """Stored keys that belong to none of `tests` (a key is a test's key, or that key + '::<name>')."""

    def belongs(key: str) -> bool:
        parts = key.split("::")
        return any("::".join(parts[:i]) in tests for i in range(1, len(parts) + 1))

    return sorted(k for k in stored if not belongs(k))
