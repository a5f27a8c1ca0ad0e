"""reports/<device>.md read by a GitHub-flavoured markdown parser (markdown-it-py with GFM tables): a `|` in
a test id stays in its cell, medians are medians, run counts are the runs taken."""

import json

import numpy as np
import pytest
from markdown_it import MarkdownIt

from pytest_llmperf.measure.records import BatchResult, BenchmarkResult, RunSample
from pytest_llmperf.report import markdown as report
from pytest_llmperf.report.markdown import memory_table, parameters_table
from tests.test_plugin import project, run  # noqa: F401  (fixture)

PIPE_TEST = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1], runs=5, warmups=0)
@pytest.mark.parametrize("variant", ["a|b"], ids=["a|b"])
def test_pipe(llmperf, variant):
    llmperf.measure(SimulatedBackend())
"""


#: GitHub's markdown: CommonMark with GFM's tables and strikethrough.
GFM = MarkdownIt("commonmark").enable(["table", "strikethrough"])
#: What a text must not turn into: a link, an image, raw HTML, emphasis, code, struck through.
MARKUP = {"link_open", "image", "html_inline", "html_block", "em_open", "strong_open", "code_inline", "s_open"}


def shown(inline):
    """The text GitHub shows for an inline token (escapes and entities resolved), and the markup it holds."""
    text = "".join(c.content for c in inline.children if c.type in ("text", "text_special", "code_inline"))
    return text, {c.type for c in inline.children} & MARKUP


def gfm_tables(text):
    """Every table of a markdown text as GitHub would read it: a list of rows, each a list of the texts shown."""
    tables, rows, row = [], None, None
    for token in GFM.parse(text):
        if token.type == "table_open":
            rows = []
        elif token.type == "tr_open":
            row = []
        elif token.type == "inline" and row is not None:
            row.append(shown(token)[0])
        elif token.type == "tr_close":
            rows.append(row)
            row = None
        elif token.type == "table_close":
            tables.append(rows)
    return tables


def test_a_pipe_in_a_test_id_stays_in_its_cell(project, run):  # noqa: F811
    project.makepyfile(test_engine=PIPE_TEST)
    run("--llmperf-update").assert_outcomes(passed=1)
    md = (project.path / "reports" / "cpu.md").read_text()
    verdicts = gfm_tables(md.split("## Verdicts", 1)[1])[0]
    header, rows = verdicts[0], verdicts[1:]
    assert header[0] == "Test" and header[7] == "Verdict"
    assert rows and all(len(r) == len(header) for r in rows)
    for r in rows:
        assert r[0] == "test_pipe[a|b]" and r[7] == "created", r


IDS = ["[x](y)", "<b>bold</b>", "*em* _u_ ~~s~~", "`code` &amp; $m$ a\\b [r]: <http://e>"]
MARKDOWN_TEST = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

IDS = {ids!r}

@pytest.mark.llmperf(batch_sizes=[1], runs=5, warmups=0)
@pytest.mark.parametrize("variant", IDS, ids=IDS)
def test_md(llmperf, variant):
    llmperf.measure(SimulatedBackend())
"""


def test_markdown_in_a_test_id_is_shown_as_text_in_the_report_and_the_job_summary(project, run, monkeypatch):  # noqa: F811
    """Issue 39, case 12: a test id holding `[x](y)` or `<b>` rendered as a link or bold."""
    project.makepyfile(test_md=MARKDOWN_TEST.format(ids=IDS))
    summary = project.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    run("--llmperf-update", "test_md.py").assert_outcomes(passed=len(IDS))
    keys = {b["key"] for b in json.loads((project.path / "reports" / "cpu.json").read_text())["benchmarks"]}
    assert len(keys) == len(IDS) and "test_md[[x](y)]" in keys and "test_md[<b>bold</b>]" in keys
    md = (project.path / "reports" / "cpu.md").read_text()
    for text in (md, summary.read_text()):
        tokens = GFM.parse(text)
        marked = [(t.content, shown(t)[1]) for t in tokens if t.type == "inline" and shown(t)[1]]
        assert not marked, marked  # nothing of the report turned into a link, HTML, emphasis, code
        verdicts = next(table for table in gfm_tables(text) if table[0][0] == "Test")
        assert {row[0] for row in verdicts[1:]} == keys
    tokens = GFM.parse(md)
    headings = [shown(tokens[i + 1])[0] for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert {f"test_md.py::{key}" for key in keys} <= set(headings)


def test_markdown_text_escapes_only_what_could_become_markup():
    from pytest_llmperf.report.tables import markdown_text

    assert markdown_text("tests/test_x.py::test_decode_ms[bs-1.5]") == "tests/test_x.py::test_decode_ms\\[bs-1.5\\]"
    assert markdown_text("_a__b_") == "\\_a\\_\\_b\\_"
    for text in ["a_b", "x*y*z", "<a href=u>", "&lt;", "line\nbreak | bar"]:
        rendered = GFM.parse(f"| {markdown_text(text)} |\n|---|\n")
        assert shown(next(t for t in rendered if t.type == "inline")) == (text.replace("\n", " "), set()), text


def batch(samples, bs=1):
    return BatchResult(bs, samples=samples)


def sample(e2e_ms, rss_mib=100.0, process=0):
    ns = int(e2e_ms * 1e6)
    return RunSample(1, [[ns // 2, ns]], ns, prefill_ns=ns // 2, decode_steps_ns=[ns // 2], memory={
        "peak_rss_mib": rss_mib}, process=process)


def result(samples, key="test_sweep[fp32]", runs=10, group="sweep", dtype="fp32"):
    scenario = {"sequence_length": 8, "decode_length": 2, "runs": runs, "warmups": 0, "knobs": {}}
    return BenchmarkResult(key=key, nodeid=f"t.py::{key}", module="t.py", scenario=scenario,
                           backend={"model": "m", "dtype": dtype}, batches=[batch(samples)], group=group)


def test_grid_and_memory_medians_are_true_medians():
    e2e = [100.0, 110.0, 120.0, 130.0]  # an even count: the median is 115, not the upper middle 120
    rss = [100.0, 110.0, 120.0, 130.0]
    r = result([sample(e, m) for e, m in zip(e2e, rss)])
    memory = gfm_tables(memory_table(r))[0]
    assert memory[1][:3] == ["Host RSS (measuring process)", "1", "115.00 MiB"]
    grid = report.grid_sections([r])[0]
    speed, seconds = gfm_tables(grid)
    tokens_per_s = np.median([2 / (e / 1000) for e in e2e])  # 2 generated tokens per run
    assert speed[1] == ["1", f"{tokens_per_s:.2f} | {1000 / tokens_per_s:.2f}"]  # the bar escaped, one cell
    assert seconds[1] == ["1", f"{np.median(e2e) / 1000:.3f}"]


def test_run_counts_are_the_runs_taken():
    second_look = result([sample(100.0 + i) for i in range(20)], runs=10)  # a second look doubled the runs
    parameters = dict(gfm_tables(parameters_table(second_look))[0][1:])
    assert parameters["N Runs"] == "20"
    workers = result([sample(100.0 + i, process=1 + i % 4) for i in range(20)], runs=5)  # 4 processes x 5
    assert dict(gfm_tables(parameters_table(workers))[0][1:])["N Runs"] == "20 (4 processes)"
    assert "medians of 20 (4 processes) runs" in report.grid_sections([workers])[0]


@pytest.mark.parametrize("text, expected", [("a|b", "a\\|b"), ("line\nbreak", "line break"), (1.5, "1.5")])
def test_cells_are_escaped(text, expected):
    from pytest_llmperf.report.tables import cell

    assert cell(text) == expected
