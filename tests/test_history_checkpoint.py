"""A job's analysis goes on from where the last one's sequential read stopped (history/alarms.py's checkpoint): the same
analysis as reading the whole history, on seeded and real histories, after each job and after what changes the
values read (a rewritten history, an older run imported into the middle, a second run at a measured commit), a
marked change, and another method or smallest change that matters; the checkpoints are kept in the store (SQLite
and PostgreSQL) and one of other values or other code is never used."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pytest_llmperf.history import alarms
from pytest_llmperf.history.alarms import Analyses, checkpoint_lengths, checkpoint_valid, checkpoint_written
from pytest_llmperf.history.analysis import analyze
from pytest_llmperf.history.detect import DEFAULT_METHOD, Method
from pytest_llmperf.history.records import Mark
from pytest_llmperf.history.series import build
from pytest_llmperf.history.store import Store
from pytest_llmperf.history.summary import document
from tests.history_rows import results, run, sha
from tests.history_synthetic import Case, history
from tests.test_history_store import location, postgres  # noqa: F401 (the store's fixtures: SQLite, PostgreSQL)

REAL = Path(__file__).parent / "data" / "history-real"


def _real(name: str, series: int, last: int) -> list[list[float]]:
    data = json.loads(gzip.decompress((REAL / f"{name}.json.gz").read_bytes()))
    return [[v for v in s["values"] if v is not None and v > 0][-last:] for s in data["series"][:series]]


def _replayed(values: list[float], every: int, min_effect: float = 0.05) -> list[int]:
    """Analyse `values` cut at every `every` commits, each going on from the checkpoint the one before kept; assert
    the signals are those of the whole read cut there, and give the lengths each analysis went on from."""
    whole, text, went_on = Analyses(values, min_effect=min_effect).signals, None, []
    for length in range(10, len(values) + 1, every):
        cut = values[:length]
        kept = checkpoint_valid(text, cut, DEFAULT_METHOD, min_effect)
        went_on.append(kept[-1]["state"]["length"] if kept else 0)
        read = Analyses(cut, DEFAULT_METHOD, min_effect, kept[-1]["state"] if kept else None, checkpoint_lengths(length))
        assert read.signals == [s for s in whole if s.length <= length]
        text = checkpoint_written(kept, read.snapshots, cut, DEFAULT_METHOD, min_effect)
    return went_on


@pytest.mark.parametrize("seed", range(6))
def test_going_on_from_the_checkpoint_reads_what_the_whole_series_reads(seed):
    cases = [Case(150, 0.03, ((40, 0.05), (100, -0.08))), Case(150, 0.10, ((60, 0.20),)),
             Case(150, 0.01, ((50, 0.03),), outliers=((70, 0.3),))]  # fmt: skip
    confirmed = 0
    for case in cases:
        values = list(history(case, seed))
        went_on = _replayed(values, 1 + seed % 3)
        assert all(went_on[1:])  # each analysis after the first went on from the one before
        confirmed += len(Analyses(values).signals)
    assert confirmed >= 2  # something to hold (measured: 3-5 a seed)


def test_going_on_from_the_checkpoint_reads_what_the_whole_series_reads_on_real_histories():
    confirmed = 0
    for name in ("bsl-language-server", "mountpoint-s3", "django-asv"):
        for values in _real(name, 2, 300):
            _replayed(values, 11)
            confirmed += len(Analyses(values).signals)
    assert confirmed >= 5  # measured: 14


def test_a_checkpoint_holds_about_log2_states_and_the_one_just_before_a_changed_point():
    values = list(history(Case(300, 0.03, ((100, 0.08),)), 1))
    text = None
    for length in range(100, 301):
        kept = checkpoint_valid(text, values[:length], DEFAULT_METHOD, 0.05)
        read = Analyses(values[:length], keep=checkpoint_lengths(length), resume=kept[-1]["state"] if kept else None)
        text = checkpoint_written(kept, read.snapshots, values[:length], DEFAULT_METHOD, 0.05)
    held = [r["state"]["length"] for r in json.loads(text)["reads"]]
    assert held == [128, 192, 256, 272, 288, 296, 298, 299, 300]  # one of each span 2^(k-1) to 2^k commits back
    changed = [*values[:290], values[290] * 1.01, *values[291:]]  # a second run at commit 290 moved its point
    assert [r["state"]["length"] for r in checkpoint_valid(text, changed, DEFAULT_METHOD, 0.05)][-1] == 288


def test_a_checkpoint_of_other_values_parameters_or_code_is_not_used(monkeypatch):
    values = list(history(Case(80, 0.03, ((40, 0.08),)), 2))
    read = Analyses(values, keep=checkpoint_lengths(80))
    text = checkpoint_written([], read.snapshots, values, DEFAULT_METHOD, 0.05)
    assert checkpoint_valid(text, values, DEFAULT_METHOD, 0.05)
    assert checkpoint_valid(text, [*values, 100.0], DEFAULT_METHOD, 0.05)  # a commit added: goes on
    assert not checkpoint_valid(text, [values[1], values[0], *values[2:]], DEFAULT_METHOD, 0.05)
    assert not checkpoint_valid(text, values, DEFAULT_METHOD, 0.03)
    assert not checkpoint_valid(text, values, Method(penalty=3.0), 0.05)
    assert not checkpoint_valid("not json", values, DEFAULT_METHOD, 0.05)
    assert not checkpoint_valid('{"reads": 3}', values, DEFAULT_METHOD, 0.05)
    monkeypatch.setattr(alarms, "checkpoint_code", lambda: "another version")
    assert not checkpoint_valid(text, values, DEFAULT_METHOD, 0.05)


# -- through the store, as a job does ------------------------------------------------------------------------------

METRICS = (("decode_token_ms", 1), ("prefill_ms", 1), ("prefill_ms", 4))


def _job(i: int, values: dict, **overrides) -> tuple:
    r = run(i, **overrides)
    return [r], results(r, {key: [v * 0.99, v, v * 1.01] for key, v in values.items()})


def _values(commits: int, seed: int) -> list[dict]:
    """Three series: +8% at commit 30 in the first, -10% at 55 in the second, noise only in the third (CV 3%)."""
    steps = {METRICS[0]: ((30, 0.08),), METRICS[1]: ((55, -0.10),), METRICS[2]: ()}
    drawn = {key: history(Case(commits, 0.03, steps[key]), seed + n) for n, key in enumerate(METRICS)}
    return [{key: float(drawn[key][i]) for key in METRICS} for i in range(commits)]


def _analysis(store: Store, *, line=None, min_effect: float = 0.05, resume: bool = True) -> dict:
    """The analysis document a job writes; `resume`: going on from the store's checkpoints, and keeping the new
    ones (else the whole read, keeping nothing)."""
    built = build(store.runs(), store.results(), line)
    kept = store.checkpoints(built) if resume else {}
    analyses = analyze(built, min_effect=min_effect, marks=store.marks(), checkpoints=kept)
    if resume:
        store.keep_checkpoints({a.series.key: a.checkpoint for a in analyses if a.checkpoint})
    return document(analyses, DEFAULT_METHOD, min_effect, "store")


def _went_on(store: Store, min_effect: float = 0.05, line=None) -> list[int]:
    """Per series, the length of the longest kept read the next analysis would go on from (0: none)."""
    built = build(store.runs(), store.results(), line)
    texts = store.checkpoints(built)
    kept = [checkpoint_valid(texts.get(k), s.values, DEFAULT_METHOD, min_effect) for k, s in sorted(built.items())]
    return [reads[-1]["state"]["length"] if reads else 0 for reads in kept]


def test_each_job_going_on_from_the_stored_checkpoints_analyses_as_the_whole_history(location):  # noqa: F811
    values = _values(80, 3)
    with Store(location) as store:
        for i in range(75):
            if i == 35:
                continue  # measured later, by an imported older run
            store.append(*_job(i, values[i]))
            if i >= 20:
                assert _analysis(store) == _analysis(store, resume=False)
                assert _went_on(store) == [i + (i < 35)] * 3  # the whole series this job read (35 aside)
        final = _analysis(store)
        confirmed = {(c["series"].split()[1], c["fails"]) for c in final["changes"] if c["state"] == "confirmed"}
        assert ("decode_token_ms", True) in confirmed  # something to hold: the +8% regression fails
        # a second run at the newest commit (a job run again, an A/B job's base side) moves its point
        store.append(*_job(74, {k: v * 1.2 for k, v in values[74].items()}, job="again"))
        assert _went_on(store) == [73] * 3 and _analysis(store) == _analysis(store, resume=False)
        # a marked change: the reads go on, the mark is the analysis'
        regression = next(c for c in final["changes"] if c["fails"])
        store.mark(Mark(regression["series_key"], regression["first_bad"], "expected"))
        assert _went_on(store) == [74] * 3
        marked = _analysis(store)
        assert marked == _analysis(store, resume=False) and not any(c["fails"] for c in marked["changes"])
        # an older run imported, placed in the middle of the series: only reads before it can go on
        store.append(*_job(35, values[35]))
        assert max(_went_on(store)) <= 35 and _analysis(store) == _analysis(store, resume=False)
        # another smallest change that matters: none
        assert _went_on(store, 0.03) == [0] * 3
        assert _analysis(store, min_effect=0.03) == _analysis(store, min_effect=0.03, resume=False)
        # a rewritten history: the default branch's line now holds commits 40-49 after 50-74
        line = [sha(i) for i in (*range(40), *range(50, 75), *range(40, 50))]
        assert max(_went_on(store, line=line)) <= 40
        assert _analysis(store, line=line) == _analysis(store, line=line, resume=False)
        for i in range(75, 80):  # and the jobs after it go on from there
            store.append(*_job(i, values[i]))
            line.append(sha(i))
            assert _went_on(store, line=line) == [i] * 3
            assert _analysis(store, line=line) == _analysis(store, line=line, resume=False)


def test_a_checkpoint_of_another_series_never_hides_its_regression(location):  # noqa: F811
    """A quiet series' checkpoint stored as that of a series with a confirmed regression (a damaged or hand-edited
    store): its values are not those read, so the regression is found and fails as in the whole analysis."""
    values = _values(70, 5)
    with Store(location) as store:
        for i in range(70):
            store.append(*_job(i, values[i]))
        whole = _analysis(store, resume=False)
        built = build(store.runs(), store.results())
        keys = {s.id.metric + str(s.id.batch_size): k for k, s in built.items()}
        quiet = {a.series.key: a.checkpoint for a in analyze(built)}[keys["prefill_ms4"]]
        store.keep_checkpoints({keys["decode_token_ms1"]: quiet})
        assert _analysis(store) == whole and any(c["fails"] for c in whole["changes"])


def test_checkpoints_are_kept_one_a_series_and_replaced(location):  # noqa: F811
    with Store(location) as store:
        store.keep_checkpoints({"a": "one", "b": "two"})
        store.keep_checkpoints({"a": "three"})
        assert store.checkpoints(["a", "b", "c"]) == {"a": "three", "b": "two"}
        assert store.checkpoints([]) == {}
        assert store.version() == 2  # kept beside the schema version: no new table for a cache
