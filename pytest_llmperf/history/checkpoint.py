"""Where the sequential read of a series (alarms.py) stopped at its last analysis, kept in the store: the next job
goes on from there, and reads only the commits it added instead of the whole history again.

A commit's verdict reads only the commits up to it, so going on from the read's state after the first n commits
gives what reading all of them gives, exactly (tests/test_history_checkpoint.py asserts the same analysis). A
checkpoint is used only where it was computed from the same values: the digest of the series' first n values, the
method, the smallest change that matters and the code (this plugin's version, the rule's modules, numpy, scipy and
ruptures) must all be those of this analysis; anything else (a rewritten history, an older run imported into the
middle, an excluded run, another llmperf_history_min_effect, an upgrade) reads the series whole. It is a cache:
losing it costs time, never a verdict, and the store's rows stay the only facts.

Kept in `llmperf_meta`, one row a series (`checkpoint:SERIES_KEY`), written by the job that analysed it in one
transaction (history/store.py).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from . import alarms, detect, thresholds
from .detect import Method

FORMAT = 1


def digests(values: Sequence[float], lengths: Collection[int]) -> dict[int, str]:
    """The digest of the series' first values (float64, in order) at each of `lengths`, in one pass."""
    data, found, done = np.asarray(values, dtype=np.float64), {}, 0
    running = hashlib.sha256()
    for length in sorted(set(lengths)):
        running.update(data[done:length].tobytes())
        found[length], done = running.copy().hexdigest(), length
    return found


@lru_cache(maxsize=1)
def code() -> str | None:
    """What computed a read: this plugin's version, the rule's source and the libraries it calls; None where that
    cannot be told (no checkpoint is used or kept then)."""
    found = hashlib.sha256(str(FORMAT).encode())
    for name in ("pytest-llmperf", "numpy", "scipy", "ruptures"):
        try:
            found.update(f"{name} {importlib.metadata.version(name)}\n".encode())
        except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path: its source says what it is
            found.update(f"{name} -\n".encode())
    try:
        for module in (alarms, detect, thresholds):
            found.update(Path(str(module.__file__)).read_bytes())
    except OSError:
        return None
    return found.hexdigest()


def _params(method: Method, min_effect: float) -> dict[str, Any]:
    return {"method": asdict(method), "min_effect": min_effect}


def lengths(length: int) -> set[int]:
    """The lengths at which the reads of a series of `length` values are kept: `length` itself, and, 2^(k-1) to
    2^k commits before it, the one length of them that is a multiple of 2^(k-1). Each is kept by every later
    analysis until it is too old for its span, so a checkpoint holds about log2(length) reads. A job that adds a
    run at a commit measured `d` commits back (an A/B job's base side, a job run again) goes on from a read at most
    about 2d commits before it."""
    found = {length}
    for k in range(length.bit_length()):
        step = 1 << k
        if length - step > 0:
            found.add((length - step) // step * step)
    return found


def valid(text: str | None, values: Sequence[float], method: Method, min_effect: float) -> list[dict[str, Any]]:
    """The kept states of the checkpoint `text` that this code computed with these parameters from the same first
    values as `values` (shortest first; each as {"digest", "state"}): empty where none was (the series is read
    whole)."""
    if not text:
        return []
    try:
        kept = json.loads(text)
        if kept["code"] != code() or {k: kept[k] for k in ("method", "min_effect")} != _params(method, min_effect):
            return []
        reads = [r for r in kept["reads"] if 0 < r["state"]["length"] <= len(values)]
        now = digests(values, [r["state"]["length"] for r in reads])
        return [r for r in reads if r["digest"] == now[r["state"]["length"]]]
    except (ValueError, KeyError, TypeError):  # not a checkpoint this code wrote
        return []


def written(
    kept: list[dict[str, Any]],
    snapshots: Sequence[Mapping[str, Any]],
    values: Sequence[float],
    method: Method,
    min_effect: float,
) -> str | None:
    """The checkpoint to keep after a read of `values`: the states `valid` gave and the read's new `snapshots`
    (alarms.Analyses), those at the lengths still kept (`lengths`)."""
    made_by = code()
    if made_by is None:
        return None
    now = digests(values, [s["length"] for s in snapshots])
    new = [{"digest": now[s["length"]], "state": s} for s in snapshots]
    wanted = lengths(len(values))
    reads = [read for read in [*kept, *new] if read["state"]["length"] in wanted]
    return json.dumps({"code": made_by, **_params(method, min_effect), "reads": reads})
