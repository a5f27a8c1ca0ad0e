"""reports/index.html (report/html.py): written at session end, opened in a real browser (chromium through
Playwright), with several targets, without matplotlib; and the job summary's mermaid chart."""

import contextlib
import copy
import json
import os
import re
import shutil
import subprocess

import pytest


ENGINE_TEST = """
import os
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(batch_sizes=[1, 2, 4, 8], runs=8, warmups=0)
def test_engine(llmperf):
    llmperf.measure(SimulatedBackend(seed=int(os.environ.get("SIM_SEED", "0")), oom_from_batch=8,
                                     decode_slowdown=float(os.environ.get("SIM_DECODE", "1"))))
"""

BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def project(pytester, monkeypatch):
    for name in ("SIM_SEED", "SIM_DECODE", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_engine=ENGINE_TEST)
    return pytester


@pytest.fixture
def run(run):
    return run.with_flags("--llmperf-max-load=1000", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def git(path, *args):
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=path, check=True,
                   capture_output=True)


def recorded_twice_then_gated(project, run, monkeypatch):
    """Two committed baselines (history), then a gated run: every view of the page has data."""
    git(project.path, "init", "-q", ".")
    run("--llmperf-update").assert_outcomes(passed=1)
    git(project.path, "add", "-A")
    git(project.path, "commit", "-qm", "first baseline")
    monkeypatch.setenv("SIM_SEED", "1")
    run("--llmperf-update").assert_outcomes(passed=1)
    git(project.path, "add", "-A")
    git(project.path, "commit", "-qm", "second baseline")
    monkeypatch.setenv("SIM_SEED", "2")
    monkeypatch.setenv("SIM_DECODE", "1.3")
    result = run()
    result.assert_outcomes(failed=1)  # decode 1.3x slower: regressed, and the page shows it
    return result


def browser():
    """Playwright's sync API and the system chromium, or a skip naming what is missing (never in CI)."""
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("the playwright package (pip install playwright)")
        sync_playwright = None
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        missing.append("chromium (apt-get install -y chromium)")
    if missing:
        message = "no browser to open the HTML report: " + " and ".join(missing) + " not installed"
        if os.environ.get("CI"):
            pytest.fail(message + "; .ci/run installs them", pytrace=False)
        pytest.skip(message)
    return sync_playwright, CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")


@contextlib.contextmanager
def opened(sync_playwright, executable, uri, errors, requests):
    """A chromium page at `uri`, its console errors and page errors into `errors`, every URL it asks for into
    `requests`; the browser closed at the end."""
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=BROWSER_ARGS)
        try:
            page = chromium.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(uri, wait_until="load")
            yield page
        finally:
            chromium.close()


def test_index_html_renders_its_plots_in_chromium_offline(project, run, monkeypatch, tmp_path):
    sync_playwright, executable = browser()
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is part of tox -e test")
    result = recorded_twice_then_gated(project, run, monkeypatch)
    index = project.path / "reports" / "index.html"
    result.stdout.fnmatch_lines([f"report: {index}"])
    errors, requests = [], []
    with opened(sync_playwright, executable, index.as_uri(), errors, requests) as page:
        figures = page.evaluate("""() => [...document.querySelectorAll('figure.plot')].map(f => {
            const svg = f.querySelector('svg');
            const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
            const drawn = svg ? [...svg.querySelectorAll('path')]
                .filter(p => (p.getAttribute('d') || '').length > 20 && p.getBBox().width > 0) : [];
            return {cls: f.className, width: box.width, height: box.height, paths: drawn.length,
                    text: svg ? svg.textContent : ''}; })""")
        # the ratio plot's numbers: one ratio, the estimate the verdict rests on (the medians' is the JSON's)
        numbers = page.evaluate("""() => [...document.querySelectorAll('figure.ratio + details tr')].map(
            r => [...r.children].map(c => c.textContent))""")
        screenshot = tmp_path / "index.png"
        page.screenshot(path=str(screenshot), full_page=True)
    assert errors == [] and requests == [index.as_uri()]  # no console error, nothing fetched but the file
    kinds = [f["cls"].split()[-1] for f in figures]
    assert kinds == ["sweep", "ratio", "history"]
    for figure in figures:
        assert figure["width"] > 300 and figure["height"] > 150 and figure["paths"] > 5, figure
    sweep, ratio, history = figures
    for label in ("Prefill latency", "Decode latency per token", "Throughput (end to end)", "batch size", "oom"):
        assert label in sweep["text"]
    assert "decode_token_ms bs 4" in ratio["text"] and "regressed" in ratio["text"]
    assert numbers[0] == ["test", "metric", "batch size", "baseline median", "now median", "estimated ratio [95% CI]",
                          "verdict"]
    assert len(numbers) > 1 and all(len(row) == 7 and re.fullmatch(r"[\d.]+ \[[\d.]+, [\d.]+\]", row[5])
                                    for row in numbers[1:])
    assert history["text"].count("baseline") >= 2 and "cpu" in history["text"]  # two commits + this run
    assert screenshot.stat().st_size > 20_000


def test_several_targets_share_the_plots_and_history_needs_no_git(project, run, tmp_path):
    pytest.importorskip("matplotlib")
    from pytest_llmperf.report.html import write_index

    run("--llmperf-update").assert_outcomes(passed=1)
    cpu = json.loads((project.path / "reports" / "cpu.json").read_text())
    a100 = copy.deepcopy(cpu)
    a100["device"] = "a100"
    a100["settings"]["baseline_dir"] = str(tmp_path / "nowhere")
    for benchmark in a100["benchmarks"]:
        benchmark.pop("measured_at", None)
        benchmark["batches"][-1]["status"] = "ok"  # the bigger card fits batch size 8
        for batch in benchmark["batches"]:
            batch["runs"] = batch["runs"] or copy.deepcopy(benchmark["batches"][0]["runs"])
            for r in batch["runs"]:
                r["values"] = {k: v / 4 if k.endswith("_ms") else v * 4 for k, v in r["values"].items()}
    out = tmp_path / "merged" / "index.html"
    write_index([cpu, a100], out)
    page = out.read_text()
    assert page.count("<svg") == 2  # one sweep (a line per target), one history; nothing compared yet
    sweep = page.split("<figure class='plot sweep'>")[1].split("</figure>")[0]
    assert ">cpu<" in sweep and ">a100<" in sweep and ">cpu: oom<" in sweep and ">a100: oom<" not in sweep
    assert "a100: nothing compared with a baseline" in page
    assert "<script" not in page and not re.search(r"""(src|href)=["'](https?:|//)""", page)  # nothing to fetch


def test_without_matplotlib_the_page_is_skipped_with_one_line_and_pytest_passes(project):
    project.mkpydir("matplotlib").joinpath("__init__.py").write_text("raise ImportError('not installed here')\n")
    result = project.runpytest_subprocess("--llmperf-device=cpu", "-p", "no:cacheprovider",
                                          "--llmperf-max-load=1000", "--llmperf-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["report: HTML report skipped: matplotlib is not installed "
                                 "(pip install 'pytest-llmperf[report]')"])
    assert not (project.path / "reports" / "index.html").exists() and (project.path / "reports" / "cpu.md").exists()


def test_job_summary_gets_a_mermaid_throughput_chart(project, run, monkeypatch, tmp_path):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    run("--llmperf-update").assert_outcomes(passed=1)
    text = summary.read_text()
    assert "## llmperf: cpu" in text
    chart = text.split("```mermaid\n", 1)[1].split("```", 1)[0].splitlines()
    assert chart[0] == "xychart-beta"
    assert chart[1] == '    title "test_engine: throughput vs batch size (oom at 8)"'
    assert chart[2] == '    x-axis "batch size" [1, 2, 4]'
    values = [float(v) for v in chart[4].strip().removeprefix("line [").removesuffix("]").split(", ")]
    assert len(values) == 3 and values[0] < values[1] < values[2]  # the simulated engine scales with batch size


def test_the_session_page_takes_the_newest_report_per_device_and_ignores_other_json(tmp_path):
    from pytest_llmperf.report.html import report_documents

    for name, device, created in (("cpu.json", "cpu", "2026-01-02"), ("copy.json", "cpu", "2026-01-01"),
                                  ("a100.json", "a100", "2026-01-01")):
        (tmp_path / name).write_text(json.dumps({"device": device, "created": created, "benchmarks": []}))
    (tmp_path / "cpu-throughput-log.json").write_text(json.dumps({"rows": []}))
    (tmp_path / "broken.json").write_text("{")
    documents = report_documents(tmp_path)
    assert sorted((d["device"], d["created"]) for d in documents) == [("a100", "2026-01-01"), ("cpu", "2026-01-02")]


GROUP_TEST = """
import pytest
from pytest_llmperf.backends.simulated import SimulatedBackend

@pytest.mark.llmperf(group="sweep", batch_sizes=[1, 2], runs=5, warmups=0)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_sweep(llmperf, dtype):
    llmperf.measure(SimulatedBackend(prefill_slowdown=1.0 if dtype == "fp32" else 0.6))
"""


def test_group_members_are_labelled_with_their_test(project, run):
    pytest.importorskip("matplotlib")
    project.makepyfile(test_engine=GROUP_TEST)
    run("--llmperf-update").assert_outcomes(passed=2)
    run().assert_outcomes(passed=2)
    page = (project.path / "reports" / "index.html").read_text()
    sweep = page.split("<figure class='plot sweep'>")[1].split("</figure>")[0]
    ratio = page.split("<figure class='plot ratio'>")[1].split("</figure>")[0]
    for member in ("test_sweep[fp32]", "test_sweep[bf16]"):
        assert f">cpu {member}<" in sweep  # a line per member, named by its test (was "cpu [fp32]")
        assert f">{member} prefill_ms bs 1<" in ratio  # was "[fp32] prefill_ms bs 1"
