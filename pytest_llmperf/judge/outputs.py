"""Outputs unchanged: the generated token ids of a batch, stored beside its timings and compared.

A perf change that decodes faster by producing other tokens is not a speed-up. Backends that know
their generated ids (the in-process ones: greedy decoding, fixed length) put them in each run's
`RunSample.output_ids`; a batch size's outputs are those ids, the same in every run. A stored baseline keeps
their digest (what is compared; the ids and text of a run are in its report); an A/B comparison has both sides'
ids and text, so it says where they first differ and gives both strings.

Runs that disagree among themselves (a nondeterministic kernel, sampling) have no outputs to compare:
that is reported, never failed. `--llmperf-outputs` (marker `outputs=`) says what a change does:
fail (default), warn, or off.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..measure.records import BatchResult, RunSample
from .verdicts import Verdict

OUTPUTS_METRIC = "outputs"  # the verdict table's metric column for these rows


def digest(ids: Sequence[Sequence[int]]) -> str:
    """sha256 of the token ids of every sequence, in order (JSON without spaces: stable across versions)."""
    text = json.dumps([[int(t) for t in seq] for seq in ids], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Outputs:
    """What one batch size generated: per sequence its token ids and (where the backend decodes) text."""

    tokens: tuple[tuple[int, ...], ...]
    texts: tuple[str, ...] | None = None

    @property
    def digest(self) -> str:
        return digest(self.tokens)

    def to_json(self) -> dict[str, Any]:
        # ids as one string per sequence: a baseline diff shows a changed sequence as one changed line
        data: dict[str, Any] = {"digest": self.digest, "tokens": [" ".join(map(str, seq)) for seq in self.tokens]}
        if self.texts is not None:
            data["texts"] = list(self.texts)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Outputs:
        """Raises ValueError when the stored ids are not integers or do not match the stored digest."""
        tokens = data.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(seq, str) for seq in tokens):
            raise ValueError("outputs: 'tokens' must be a list of space-separated token ids, one string per sequence")
        try:
            ids = tuple(tuple(int(t) for t in seq.split()) for seq in tokens)
        except ValueError:
            raise ValueError("outputs: 'tokens' holds something other than integer token ids") from None
        texts = data.get("texts")
        if texts is not None and (
            not isinstance(texts, list) or len(texts) != len(ids) or not all(isinstance(t, str) for t in texts)
        ):
            raise ValueError("outputs: 'texts' must be one string per sequence")
        outputs = cls(ids, tuple(texts) if texts is not None else None)
        if data.get("digest") != outputs.digest:
            raise ValueError(
                f"outputs: digest {data.get('digest')!r} does not match the stored tokens "
                f"({outputs.digest}); edited by hand? re-record with --llmperf-update"
            )
        return outputs


def _of_sample(sample: RunSample) -> Outputs:
    texts = tuple(sample.output_texts) if sample.output_texts is not None else None
    return Outputs(tuple(tuple(int(t) for t in seq) for seq in sample.output_ids or ()), texts)


@dataclass(frozen=True)
class Observed:
    """A batch size's outputs over its runs: `outputs` when every run generated the same ids, else the
    number of distinct outputs the runs gave (`distinct` > 1 means nondeterministic)."""

    outputs: Outputs | None
    distinct: int


def observed(samples: Sequence[RunSample]) -> Observed | None:
    """None when the backend reports no output ids (servers, for now)."""
    with_ids = [s for s in samples if s.output_ids is not None]
    if not with_ids:
        return None
    seen = {o.digest: o for o in map(_of_sample, with_ids)}
    if len(seen) == 1:
        return Observed(next(iter(seen.values())), 1)
    return Observed(None, len(seen))


def outputs_by_batch(batches: Sequence[BatchResult]) -> dict[int, Outputs]:
    """What a baseline stores: the outputs of each batch size whose runs all agree."""
    found = {}
    for batch in batches:
        seen = observed(batch.samples) if batch.ok else None
        if seen is not None and seen.outputs is not None:
            found[batch.batch_size] = seen.outputs
    return found


def _quote(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def difference(baseline: Outputs, now: Outputs) -> str | None:
    """None when equal; else where they first differ and both decoded strings."""
    if baseline.digest == now.digest:
        return None
    if len(baseline.tokens) != len(now.tokens):
        return f"{len(now.tokens)} sequences now, {len(baseline.tokens)} in the baseline"
    for index, (was, is_) in enumerate(zip(baseline.tokens, now.tokens)):
        if was == is_:
            continue
        position = next((i for i, (a, b) in enumerate(zip(was, is_)) if a != b), min(len(was), len(is_)))
        ids = (
            f"id {was[position] if position < len(was) else 'none'} -> "
            f"{is_[position] if position < len(is_) else 'none'}"
        )
        text = ""
        if baseline.texts is not None and now.texts is not None:
            text = f"; baseline {_quote(baseline.texts[index])}, now {_quote(now.texts[index])}"
        return f"sequence {index} differs first at generated token {position} ({ids}){text}"
    return "token ids differ"  # unreachable while the digest covers exactly the ids


def check(
    baseline: Outputs | str | None, current: Observed | None, reference_label: str = "the baseline"
) -> tuple[Verdict, str] | None:
    """(verdict, note) for the verdict table, or None when there is nothing to say: equal, or either side
    has no outputs (`unchecked` says so once per benchmark). `baseline` is the reference's outputs, or the
    digest a stored baseline keeps."""
    if current is None or baseline is None:
        return None
    if current.outputs is None:
        return Verdict.VARIES, (
            f"outputs differ between this run's runs ({current.distinct} distinct): "
            f"nondeterministic, not compared with {reference_label}"
        )
    if isinstance(baseline, str):
        if baseline == current.outputs.digest:
            return None
        now = current.outputs.texts[0] if current.outputs.texts else " ".join(map(str, current.outputs.tokens[0]))
        return Verdict.CHANGED, (
            f"outputs changed from {reference_label} (its digest {baseline}, now "
            f"{current.outputs.digest}); sequence 0 now reads {_quote(now)}"
        )
    diff = difference(baseline, current.outputs)
    if diff is None:
        return None
    return Verdict.CHANGED, f"outputs changed from {reference_label}: {diff}"


def unchecked(reference: Mapping[int, Outputs | str], batches: Sequence[BatchResult]) -> bool:
    """The runs generated outputs the reference has none of to compare with (a baseline recorded before
    outputs were stored, or a compared ref whose code does not report them)."""
    return not reference and any(observed(b.samples) is not None for b in batches if b.ok)
