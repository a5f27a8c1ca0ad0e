"""The reference pages stay true: the pages made from the code are what the code makes today, and the figures the
hand-written pages state are the code's constants (a change of one fails here until the page says it)."""

import re
from pathlib import Path

import pytest

from pytest_llmperf.judge import procedure, stats
from pytest_llmperf.judge.rows import MEMORY_FLOOR_MIB
from pytest_llmperf.judge.verdicts import JUDGED, NOT_JUDGED
from pytest_llmperf.orchestrate import worker
from pytest_llmperf.orchestrate.options import DEFAULT_FAIL_ON
from pytest_llmperf.orchestrate.options import OPTIONS_BY_NAME
from pytest_llmperf.orchestrate.campaign import BUDGET_FACTOR, BUDGET_MOST_MORE_S
from pytest_llmperf.orchestrate.session import DEFAULT_AB_PROCESSES, DEFAULT_PROCESSES, DEFAULT_RTOL
from pytest_llmperf.orchestrate import progress
from pytest_llmperf.report.verdict_table import CELL_LIMIT
from tests.server_helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def page(name):
    return " ".join((DOCS / name).read_text().split())  # figures may wrap across lines


def reference_docs():
    return load_script("reference_docs")


@pytest.mark.parametrize("name", ["options.md", "metrics.md"])
def test_the_pages_made_from_the_code_are_current(name):
    reference = reference_docs()
    expected = {path.name: make for path, make in reference.PAGES.items()}[name]()
    assert (DOCS / name).read_text() == expected, f"docs/{name} is stale: run python scripts/reference_docs.py"


def test_every_option_and_marker_keyword_is_on_the_options_page():
    text = (DOCS / "options.md").read_text()
    generated, _, reasons = text.partition(reference_docs().HAND_WRITTEN)
    for option in OPTIONS_BY_NAME.values():
        assert f"`{option.ini}`" in generated and (option.expert or f"`{option.cli}" in generated)
        # the hand-written reasons cover every option, by the name a user types
        assert f"- `{option.ini if option.expert else option.cli}`: " in reasons, option.name
    assert "`LLMPERF_HISTORY`" in generated and [o.env for o in OPTIONS_BY_NAME.values() if o.env] == ["LLMPERF_HISTORY"]


def test_the_gate_page_states_the_codes_figures():
    text = page("gate.md")
    assert f"more than {stats.OUTLIER_Z:g} robust standard deviations" in text
    assert f"from {stats.SCREEN_MIN} units on" in text
    assert f"the {stats.TRIM:.0%}-trimmed mean" in text
    assert f"the {1 - procedure.DECISION_LEVEL:.0%} lower bound" in text
    assert f"{1 - procedure.DECISION_LEVEL:.0%} upper bound" in text
    assert f"at a per-unit noise of {procedure.REFERENCE_NOISE:.0%}" in text
    assert (f"`auto` is {DEFAULT_RTOL['ab']:g} for A/B, and against stored baselines the drift measured between "
            f"sessions: {DEFAULT_RTOL['cpu']:g} on the cpu target, {DEFAULT_RTOL['gpu']:g} on GPU targets") in text
    assert f"by more than {MEMORY_FLOOR_MIB:g} MiB" in text
    assert f"(default {OPTIONS_BY_NAME['memory_rtol'].default:.0%})" in text
    assert f"the default, `{','.join(DEFAULT_FAIL_ON)}`" in text
    assert f"A cell is at most {CELL_LIMIT} characters" in text
    # the A/B gate on every run (judge/stats.py's nested, judge/procedure.py's planned looks, runs and processes)
    assert f"the {stats.RUN_TRIM:.0%}-trimmed mean: from 10 runs on, one a tail" in text and stats.RUN_TRIM == 0.1
    assert f"a prior of {stats.PRIOR_DF:g} degrees of freedom" in text
    assert f"each look spends a share w_k of {1 - procedure.CONFIDENCE:.0%} ({procedure.CONFIDENCE:.0%} confidence)" in text
    first, planned = procedure.PLANNED_SHARES
    assert f"at {DEFAULT_AB_PROCESSES} processes per side (`--llmperf-processes`" in text
    assert f"spends {first:.0%} and measures the job's own two levels" in text
    assert f"and spends {planned:.0%}; a last one" in text and f"spends what is left ({1 - first - planned:.0%}, less" in text
    assert f"Runs grow at most {procedure.GROWTH} times from one look to the next" in text
    assert f"with {procedure.PLANNED_POWER:.0%} power" in text
    assert (f"an interim look every {procedure.INTERIM_EVERY} rounds spends {procedure.INTERIM_SHARE:.0%} (at most "
            f"{procedure.INTERIM_LOOKS} of them)") in text
    assert f"`auto` is {BUDGET_FACTOR:g} times the first look's time" in text
    assert f"and at most {BUDGET_MOST_MORE_S / 60:g} min more than the first look" in text


def test_the_workers_page_states_the_progress_figures():
    text = page("workers.md")
    assert f"a line at least every {progress.LINE_EVERY_S:g} s" in text
    assert worker.PROGRESS_EVERY_S == 1.0 and "at most one record a second" in text


def test_the_readme_states_the_defaults_and_the_kinds():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert DEFAULT_PROCESSES["cpu"] == DEFAULT_PROCESSES["gpu"]
    assert f"fresh worker processes ({DEFAULT_PROCESSES['cpu']} per side by default" in text
    assert f"(`--llmperf-fail-on={','.join(DEFAULT_FAIL_ON)}`)" in text
    judged, not_judged = (", ".join(map(str, kinds)) for kinds in (JUDGED, NOT_JUDGED))
    assert f"{judged} (judged); {not_judged} (not judged)" in text


def test_every_link_between_the_pages_resolves():
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links {target}"


def sections(page):
    """A page's headings and bold lead-ins (`**Name**`, `**Name.**`), the names a citation may give."""
    found = []
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            found.append(line.lstrip("#").strip())
        elif line.startswith("**"):
            found.append(line[2:].split("**", 1)[0].rstrip(".:"))
    return found


def cited(text):
    """(page, section) of every `docs/notes/PAGE.md, "Section"` in a file's text, comment markers and line breaks
    between its words removed."""
    text = " ".join(re.sub(r"^\s*(#:?|//)\s?", "", line) for line in text.splitlines())
    text = " ".join(text.split())
    return re.findall(r'docs/notes/([\w-]+\.md)[,;:]? "([^"]+)"', text)


def test_the_notes_cited_in_the_code_hold_the_sections_they_are_cited_for():
    """A comment that cites a note by page and section (`docs/notes/noise.md, "Turns"`) names a heading or bold
    lead-in the page has: a section renamed or moved fails here until the comment follows it."""
    files = [ROOT / "tox.ini", *(ROOT / "pytest_llmperf").rglob("*.py"), *(ROOT / "scripts").glob("*.py"),
             *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]  # fmt: skip
    citations = [
        (path, page, section)
        for path in files
        if path.name != "test_docs.py"  # this file's own examples
        for page, section in cited(path.read_text())
    ]
    assert len(citations) >= 20  # the package's comments cite the notes (a pattern that finds none checks nothing)
    for path, page, section in citations:
        assert (DOCS / "notes" / page).exists(), f"{path.relative_to(ROOT)} cites docs/notes/{page}"
        assert any(s.startswith(section) for s in sections(DOCS / "notes" / page)), (
            f'{path.relative_to(ROOT)} cites docs/notes/{page}, "{section}": no such section'
        )


def test_the_sections_the_pages_cite_exist():
    """`[page](page.md), "Section"` between the pages names a heading or bold lead-in of that page."""
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        text = " ".join(path.read_text().split())
        for target, section in re.findall(r'\]\(([^)#:]+\.md)\),? "([^"]+)"', text):
            assert any(s.startswith(section) for s in sections(path.parent / target)), (
                f'{path.relative_to(ROOT)} cites {target}, "{section}": no such section'
            )
