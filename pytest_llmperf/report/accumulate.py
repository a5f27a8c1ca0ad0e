"""`reports/<device>.json` accumulates: every benchmark measured on the device, newest result per benchmark.

A session's document replaces the entries of the benchmarks it measured and keeps the others from the
previous report; each benchmark records when and at which commit it was measured. A previous report
that cannot be read is not lost: it is moved aside to `<name>.corrupt-<UTC time>` and the caller warns.
The markdown is rendered from the accumulated document, the same way for every benchmark; entries an
older version wrote with raw runs are reduced to report/stored.py's format when the report is rewritten.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .stored import compact_entry, compact_reference

SCHEMA_VERSION = 1


class ReportError(Exception):
    """A report file that is missing, unreadable or not a pytest-llmperf report (the message names it)."""


def identity(entry: Mapping[str, Any]) -> tuple[str, str]:
    return str(entry.get("nodeid")), str(entry.get("key"))


def read_report(path: Path) -> dict[str, Any]:
    """A pytest-llmperf JSON report, or ReportError saying what is wrong with the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if (
        not isinstance(document, dict)
        or not isinstance(document.get("benchmarks"), list)
        or "device" not in document
        or "schema_version" not in document
    ):
        raise ReportError(
            f"{path}: not a pytest-llmperf report (expected the JSON that pytest-llmperf writes to "
            "reports/<device>.json, with schema_version, device and benchmarks)"
        )
    for i, benchmark in enumerate(document["benchmarks"]):
        batches = benchmark.get("batches") if isinstance(benchmark, dict) else None
        if (
            not isinstance(batches, list)
            or not {"key", "nodeid"} <= set(benchmark)
            or not all(isinstance(b, dict) and isinstance(b.get("batch_size"), int) for b in batches)
        ):
            raise ReportError(
                f"{path}: benchmarks[{i}] is damaged (each needs key, nodeid and batches with a "
                "batch_size); restore the file from the job's artifacts or re-run the benchmarks"
            )
    return document


def stamp(document: dict[str, Any]) -> dict[str, Any]:
    """Mark each benchmark of a session's document with when and at which commit it was measured."""
    git = (document.get("fingerprint") or {}).get("git") or {}
    measured = {"created": document.get("created"), "commit": git.get("commit"), "dirty": bool(git.get("dirty"))}
    for benchmark in document.get("benchmarks") or []:
        benchmark.setdefault("measured", dict(measured))
    for outcome in document.get("outcomes") or []:
        outcome.setdefault("measured", dict(measured))
    return document


def accumulate(previous: Mapping[str, Any] | None, current: dict[str, Any]) -> dict[str, Any]:
    """The current session's document, plus every benchmark of `previous` it did not measure again."""
    current = stamp(current)
    if not previous:
        return current
    previous = stamp(json.loads(json.dumps(previous)))  # an older report has no stamps: its own date and commit
    measured_now = {identity(b) for b in current.get("benchmarks") or []}
    measured_now |= {identity(o) for o in current.get("outcomes") or []}
    merged = dict(current)
    for name in ("benchmarks", "outcomes", "verdicts"):
        kept = [e for e in previous.get(name) or [] if identity(e) not in measured_now]
        merged[name] = kept + list(current.get(name) or [])
    # a report written before report/stored.py's format shrinks as it is rewritten
    merged["benchmarks"] = [compact_entry(b) for b in merged["benchmarks"]]
    merged["outcomes"] = [{**o, "reference": compact_reference(o.get("reference"))} for o in merged["outcomes"]]
    merged["benchmarks"].sort(key=identity)
    merged["outcomes"].sort(key=identity)
    merged["counts"] = dict(current.get("counts") or {})  # this session's; the others' are in their rows
    return merged


def load_previous(path: Path, now: datetime | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(previous report or None, warning or None). A corrupt one is moved to <name>.corrupt-<time>."""
    if not path.exists():
        return None, None
    try:
        return read_report(path), None
    except ReportError as exc:
        stamp_ = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
        aside = path.with_name(f"{path.name}.corrupt-{stamp_}")
        try:
            os.replace(path, aside)
        except OSError as move_error:
            return None, (
                f"{exc}; could not move it aside ({move_error}); the report now holds this session's benchmarks only"
            )
        return None, (f"{exc}. Moved it to {aside} (nothing lost); the report now holds this session's benchmarks only")


def update_report(path: Path, session_document: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The accumulated document to write to `path` (reports/<device>.json), and a warning when the previous
    report could not be read (it was moved aside, see load_previous)."""
    previous, warning = load_previous(path)
    if previous is not None and previous.get("device") != session_document.get("device"):
        warning = (
            f"{path} holds device {previous.get('device')!r}, this session measured "
            f"{session_document.get('device')!r}: its benchmarks are not carried over"
        )
        previous = None
    return accumulate(previous, session_document), warning
