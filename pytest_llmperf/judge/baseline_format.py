"""The text of a baseline file, laid out for review: one line per metric and batch size.

A baseline is committed and its diff reviewed, so the layout is fixed by the document's structure, never by
its values: the structural objects (the document, the benchmarks, an entry, its batch sizes, its values per
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
from typing import Any

from ..files import finite_or_null

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
