"""The "History over commits" panel of reports/index.html, through real data: baselines recorded by the
plugin (simulated engine, --llmperf-update) and committed three times in a temp git repository, then a
gated run writes the page, which chromium opens; the points it plots are counted and read back."""

import json
import re
import subprocess

import numpy as np
import pytest

from pytest_llmperf.judge.baselines import BaselineEntry
from tests.test_html_report import BROWSER_ARGS, browser, git
from tests.test_plugin import baseline_file, project, run  # noqa: F401  (fixture)

SLOWDOWNS = (1.0, 1.5, 2.0)  # prefill per commit: each recorded baseline is slower than the one before


def committed_medians(path, commit, key, metric):
    """batch size -> the median of the per-process medians of the file as committed, read by the store's parser."""
    relative = path.relative_to(path.parents[3]).as_posix()  # baselines/cpu/<machine>/test_engine.json
    text = subprocess.run(["git", "show", f"{commit}:{relative}"], cwd=path.parents[3], capture_output=True,
                          text=True, check=True).stdout
    entry = BaselineEntry.from_json(key, json.loads(text)["benchmarks"][key])
    return {bs: float(np.median(entry.process_values(bs)[metric])) for bs in (1, 2, 4)}


@pytest.fixture
def history(project, run, monkeypatch):  # noqa: F811
    """Three committed baselines, each slower in prefill, then a gated run at the last speed."""
    git(project.path, "init", "-q", ".")
    commits = []
    for slowdown in SLOWDOWNS:
        monkeypatch.setenv("SIM_PREFILL", str(slowdown))
        run("--llmperf-update").assert_outcomes(passed=1)
        git(project.path, "add", "baselines")
        git(project.path, "commit", "-qm", f"baseline at prefill x{slowdown}")
        commits.append(subprocess.run(["git", "rev-parse", "HEAD"], cwd=project.path, capture_output=True,
                                      text=True, check=True).stdout.strip())
    run().assert_outcomes(passed=1)  # unchanged code against the last baseline: its report is the 4th point
    return project, commits


def test_history_plots_each_committed_baseline_and_the_report_in_chromium(history):
    sync_playwright, executable = browser()
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is part of tox -e test")
    project, commits = history
    expected = [committed_medians(baseline_file(project), c, "test_engine", "prefill_ms") for c in commits]
    report = json.loads((project.path / "reports" / "cpu.json").read_text())
    index = project.path / "reports" / "index.html"
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=BROWSER_ARGS)
        try:
            page = chromium.new_page(viewport={"width": 1400, "height": 900})
            page.goto(index.as_uri(), wait_until="load")
            table = page.evaluate("""() => [...document.querySelectorAll('details.history-numbers tr')].slice(1)
                .map(tr => [...tr.querySelectorAll('td')].map(td => ({text: td.textContent,
                    metric: td.dataset.metric || null, bs: td.dataset.batchSize || null})))""")
            markers = page.evaluate("""() => Object.fromEntries([1, 2, 4].map(bs => {
                const line = document.getElementById('history0-prefill_ms-bs' + bs);
                return [bs, line ? [...line.querySelectorAll('use')].map(u => parseFloat(u.getAttribute('y'))) : null];
            }))""")
        finally:
            chromium.close()

    labels = [row[0]["text"] for row in table]
    assert len(labels) == 4, labels  # three committed baselines and this report
    for label, commit in zip(labels[:3], [None, *commits[:2]]):
        # measured at the commit before it was recorded (the first: before any commit, so the file's own)
        assert label.endswith(" baseline") and "{" not in label
        assert label.startswith((commit or commits[0])[:7])
    assert re.fullmatch(r"[0-9a-f]{7}( dirty)? \d{4}-\d\d-\d\d \d\d:\d\d cpu", labels[3]), labels[3]
    assert labels[3].startswith(commits[2][:7])

    plotted = {bs: [float(cell["text"]) for row in table for cell in row[1:]
                    if cell["metric"] == "prefill_ms" and cell["bs"] == str(bs)] for bs in (1, 2, 4)}
    batches = {b["batch_size"]: b for b in report["benchmarks"][0]["batches"]}
    for bs in (1, 2, 4):
        now = float(np.median([r["values"]["prefill_ms"] for r in batches[bs]["runs"]]))  # one process: its runs
        assert plotted[bs] == pytest.approx([e[bs] for e in expected] + [now], rel=1e-5)
        assert plotted[bs][0] < plotted[bs][1] < plotted[bs][2]  # each baseline recorded slower
        # one marker per point, drawn in the order of the values (SVG y grows downwards)
        ys = markers[str(bs)]
        assert ys is not None and len(ys) == 4, markers
        assert ys[0] > ys[1] > ys[2]


@pytest.mark.slow
def test_a_history_version_the_parser_cannot_read_is_left_out(tmp_path):
    from pytest_llmperf.report.html import baseline_points

    path = tmp_path / "baselines" / "cpu" / "test_engine.json"
    path.parent.mkdir(parents=True)
    git(tmp_path, "init", "-q", ".")
    entry = {"batches": {"1": {"runs": {"prefill_ms": [[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]]}}}, "created": "2026-01-01",
             "git_commit": "a" * 40}
    versions = [{"schema_version": 1, "benchmarks": {"t": {"batches": {"1": {"prefill_ms": [1.0, 2.0]}},
                                                          "created": "2025-12-01"}}},  # per-run lists: schema 1
                {"schema_version": 2, "benchmarks": {"t": entry}}]
    for document in versions:
        path.write_text(json.dumps(document))
        git(tmp_path, "add", "-A")
        git(tmp_path, "commit", "-qm", "v")
    points = baseline_points(path, "t", [1], ["prefill_ms"], {})
    assert [p.label for p in points] == ["aaaaaaa 2026-01-01 baseline"]
    assert points[0].medians == {1: {"prefill_ms": 4.0}}  # median of the process medians 2 and 6
