"""A replayed history of 60 jobs on main (scripts/history_replay.py: the shipped suite's per-process medians, changes
injected, a git repository with merges whose first-parent line orders the series) through the store, the analysis
and reports/index.html, opened in a real browser (chromium through Playwright, offline)."""

from __future__ import annotations

import pytest

from tests.server_helpers import load_script
from tests.test_html_report import browser, opened

pytestmark = pytest.mark.slow  # the replay runs git and a browser (a script loaded by path, which tests/conftest.py cannot follow)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    script = load_script("history_replay")
    return script, script.replay(tmp_path_factory.mktemp("replay"))


def test_the_replayed_history_finds_the_injected_changes(replayed):
    script, done = replayed
    shas, analysis = done["shas"], done["analysis"]
    confirmed = {(c["series"].split(" (")[0], shas.index(c["first_bad"])) for c in analysis["changes"]
                 if c["state"] == "confirmed"}  # fmt: skip
    step = "benchmarks/test_seed000_prefill_decode.py::test_prefill_decode[llama]"
    assert any(s == f"{step} prefill_ms bs 4" and abs(j - 20) <= 2 for s, j in confirmed)
    assert any(s == f"{step} throughput_tokens_per_s bs 4" and abs(j - 38) <= 2 for s, j in confirmed)
    assert not any(s == f"{step} prefill_ms bs 2" and abs(j - 50) <= 2 for s, j in confirmed)  # the outlier job
    creep = {c["series"].split(" (")[0]: c["drift"] for c in analysis["creep"]}
    assert 0.05 <= creep["benchmarks/test_seed003_dtype_sweep.py::test_batch_sweep_until_oom[fp32] prefill_ms bs 8"]


def test_the_report_shows_them_in_chromium_offline(replayed, tmp_path):
    sync_playwright, executable = browser()
    _, done = replayed
    index = done["index"]
    errors, requests = [], []
    with opened(sync_playwright, executable, index.as_uri(), errors, requests) as page:
        rows = page.evaluate("""() => [...document.querySelectorAll('table.history-changes tr.change')]
            .map(r => [...r.cells].map(c => c.textContent))""")
        plots = page.evaluate("""() => [...document.querySelectorAll('figure.history-series')].map(f => {
            const box = f.querySelector('svg').getBoundingClientRect();
            return {caption: f.querySelector('figcaption').textContent, width: box.width, height: box.height,
                    points: f.querySelectorAll('circle.point').length,
                    confirmed: f.querySelectorAll('line.cp.confirmed').length}; })""")
        creep = page.evaluate("() => [...document.querySelectorAll('ul.creep li')].map(li => li.textContent)")
        page.screenshot(path=str(tmp_path / "history.png"), full_page=True)
    assert errors == [] and requests == [index.as_uri()]
    shas = done["shas"]
    injected = [r for r in rows if "[llama] prefill_ms bs 4" in r[1] and r[2].endswith(shas[20][:12])]
    assert injected and injected[0][0] == "confirmed (failing)" and "regression" in injected[0][4]  # +8%, not marked
    lower = [r for r in rows if "[llama] throughput_tokens_per_s bs 4" in r[1] and r[2].endswith(shas[38][:12])]
    assert lower and "-1" in lower[0][4] and "regression" in lower[0][4]  # lower throughput is a regression
    drawn = {p["caption"].split(" (")[0].split("::")[1]: p for p in plots}
    step = drawn["test_prefill_decode[llama] prefill_ms bs 4"]
    assert step["points"] == 60 and step["confirmed"] >= 1 and step["width"] > 300 and step["height"] > 100
    assert any("[fp32] prefill_ms bs 8" in text and "regression" in text for text in creep)
