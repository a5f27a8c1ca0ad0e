"""Baseline files on disk: where they lie (one set per device, and on the cpu target one set per machine), and
their text, laid out for review (one line per metric and batch size).

    <baseline_dir>/<device>/<module>.json              GPU targets (the device name is the GPU model)
    <baseline_dir>/cpu/<machine>/<module>.json          the cpu target: a baseline is valid only for its CPU
    <baseline_dir>/<device>/<machine>/<module>.json     any target, with --llmperf-machine NAME

The machine name is a readable slug of the CPU's identity (model, family/model/stepping, the strongest
kernel ISA), so a laptop's `--llmperf-update` writes the laptop's own set and never the CI runner's,
and each set is compared only on the machine that recorded it. Device and machine names become path
components: they must be plain names, never `..` or a path.

The text: a baseline is committed and its diff reviewed, so its layout is fixed by the document's structure,
never by its values: the structural objects (the document, the benchmarks, an entry, its batch sizes, its values per
batch size, its errors and fingerprint) have one key per line, and everything under them is one line: a batch
size's runs per process, load and outputs digest, a metric's per-process medians, the scenario, the backend.
Keys are sorted. A re-record of unchanged code therefore changes the value lines and the recording stamps (date,
commit) in place, and no line moves.

   "batches": {
    "1": {"foreign_load": 0.043, "outputs": "sha256:6553680d2b8eecfeca91935e0fe6c18e", "runs_per_process": [5, 5, 5]},
   ...
   "values": {
    "1": {
     "decode_token_ms": [6.13588, 5.57412, 6.52521],

Read back with `parse`, which refuses a key given twice in one object: a merge that kept both sides' entry of a
test is valid JSON, and `json.loads` keeps the last copy in silence.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..files import finite_or_null

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


#: Paths of the objects written one key per line ("*" stands for any key); everything below them is one line.
EXPANDED = frozenset(
    {
        (),
        ("benchmarks",),
        ("benchmarks", "*"),
        ("benchmarks", "*", "batches"),
        ("benchmarks", "*", "values"),
        ("benchmarks", "*", "values", "*"),
        ("benchmarks", "*", "errors"),
        ("benchmarks", "*", "fingerprint"),
    }
)


def _expanded(path: tuple[str, ...]) -> bool:
    return any(len(pattern) == len(path) and all(p in ("*", k) for p, k in zip(pattern, path)) for pattern in EXPANDED)


def _inline(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=False, ensure_ascii=False)


def _write(value: Any, path: tuple[str, ...], depth: int, out: list[str]) -> None:
    if not isinstance(value, dict) or not value or not _expanded(path):
        out.append(_inline(value))
        return
    out.append("{\n")
    items = sorted(value.items())
    for i, (key, item) in enumerate(items):
        out.append(" " * (depth + 1) + _inline(str(key)) + ": ")
        _write(item, (*path, str(key)), depth + 1, out)
        out.append(",\n" if i + 1 < len(items) else "\n")
    out.append(" " * depth + "}")


def render(document: dict[str, Any]) -> str:
    """The file's text: strict JSON (a non-finite metadata value, e.g. a scenario's max_load=inf, is null)."""
    out: list[str] = []
    _write(finite_or_null(document), (), 0, out)
    return "".join(out) + "\n"


class DuplicateKey(ValueError):
    """An object of the document gives one key twice; `path` leads to it, the key last."""

    def __init__(self, path: tuple[str, ...]) -> None:
        self.path = path
        where = f" under {' > '.join(map(repr, path[:-1]))}" if len(path) > 1 else " at the top"
        super().__init__(
            f"the key {path[-1]!r}{where} is given twice (a merge that kept both sides?); a JSON reader keeps the "
            "last copy in silence"
        )


class _Duplicated(dict[str, Any]):
    """An object that gives a key twice or holds one that does: `path` leads to the key."""

    path: tuple[str, ...] = ()


def _inner(value: Any) -> tuple[str, ...] | None:
    """The path to a duplicated key within a value already parsed, or None."""
    if isinstance(value, _Duplicated):
        return value.path
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _inner(item)
            if found is not None:
                return (f"[{i}]", *found)
    return None


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: the object, marked (objects are built inside out) where a key repeats."""
    built: dict[str, Any] = {}
    path: tuple[str, ...] | None = None
    for key, value in pairs:
        if path is None:
            inner = _inner(value)
            path = (key,) if key in built else (key, *inner) if inner is not None else None
        built[key] = value
    if path is None:
        return built
    marked = _Duplicated(built)
    marked.path = path
    return marked


def parse(text: str) -> Any:
    """A baseline file's document from its text; DuplicateKey where an object gives a key twice, ValueError
    (json.JSONDecodeError) where the text is not JSON."""
    document = json.loads(text, object_pairs_hook=_object)
    path = _inner(document)
    if path is not None:
        raise DuplicateKey(path)
    return document
