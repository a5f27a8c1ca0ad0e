"""Write the reference pages made from the code: docs/options.md from the option table in
pytest_llmperf/orchestrate/options.py (every option and its ini key; their reasons, below the tables, by hand) and
the marker's keywords (measure/scenario.py), docs/metrics.md from the metric table in measure/metrics.py.
tests/test_docs.py fails when a file is not what this writes, so a new option or metric cannot go undocumented:

    python scripts/reference_docs.py          # rewrite both
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_llmperf.measure.gpu import ENERGY_MIN_RUN_S  # noqa: E402
from pytest_llmperf.measure.metrics import (DEFAULT_GATED_SERVER, DEFAULT_GATED_SPLIT, MEMORY_METRICS,  # noqa: E402
                                            METRICS, PERCENTILE_METHOD, TAIL_MIN_GAPS)
from pytest_llmperf.measure.keywords import MARKER_HELP, MARKER_KEYWORDS, OVERRIDES, PER_TEST  # noqa: E402
from pytest_llmperf.orchestrate.options import OPTIONS  # noqa: E402

OPTIONS_MD = ROOT / "docs" / "options.md"
METRICS_MD = ROOT / "docs" / "metrics.md"

INTRO = """# Options

The tables are written by `scripts/reference_docs.py` from the option table in `pytest_llmperf/orchestrate/options.py`
(a test fails when they and the table differ); the reasons below them are written by hand. `pytest --help` lists the
same options under "LLM inference benchmarks (pytest-llmperf)" and the ini keys under "[pytest] ini-options".

What a user changes per run is a command-line option `--llmperf-X` with an ini key `llmperf_X` (in `pytest.ini`,
`tox.ini`, `setup.cfg` or `[tool.pytest.ini_options]` in `pyproject.toml`). An expert knob is an ini key only: set it
in the ini file, or for one run with pytest's `-o llmperf_X=VALUE`; typed as `--llmperf-X` it is refused naming the
key. Precedence: a test's marker > command line > ini > default. A bad value is a usage error naming where it came
from (exit 4); nothing is coerced.

Options travel in the environment as pytest's own do, in `PYTEST_ADDOPTS` (`PYTEST_ADDOPTS="--llmperf-processes=1
-o llmperf_warmups=0"`). The one environment variable of the plugin is `LLMPERF_HISTORY`, the history store, since a
`postgresql://` URL holds a password that a command line would show (a CI secret; empty: unset); the command line
beats it, and it beats the ini key.
"""

#: Where the generated part of docs/options.md ends; what follows is kept as written.
HAND_WRITTEN = "<!-- Written by hand below this line: scripts/reference_docs.py keeps it. -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def options_page() -> str:
    def value(option) -> str:
        return "true\\|false" if option.flag else _cell(option.metavar or "VALUE")

    def marker(option) -> str:
        return " A test's marker may set it." if option.name in PER_TEST else ""

    cli = ["| option | ini key | meaning |", "|---|---|---|"]
    for o in OPTIONS:
        if not o.expert:
            flag = f"`{o.cli}`" if o.flag else f"`{o.cli} {o.metavar or 'VALUE'}`"
            cli.append(f"| {_cell(flag)} | `{o.ini}` | {_cell(o.help)}.{marker(o)} |")
    ini = ["| ini key | value | meaning |", "|---|---|---|"]
    ini += [f"| `{o.ini}` | {value(o)} | {_cell(o.help)}.{marker(o)} |" for o in OPTIONS if o.expert]
    keywords = ", ".join(f"`{k}`" for k in MARKER_KEYWORDS)
    overrides = ", ".join(f"`{k}`" for k in OVERRIDES)
    marker_text = (f"## Marker keywords\n\n`@pytest.mark.llmperf(...)` takes {keywords}; an unknown keyword is an "
                   f"error naming the known ones. `llmperf.measure(backend, name=None, **overrides)` takes {overrides} "
                   f"for one measurement (`name=` tells two measurements of one test apart). pytest's own help for the "
                   f"marker:\n\n> {MARKER_HELP}\n")
    page = [INTRO, "## Command-line options\n", *cli, "", "## Expert knobs: ini keys only\n", *ini, "", marker_text]
    return "\n".join(page) + "\n" + HAND_WRITTEN + "\n" + _hand_written()


def _hand_written() -> str:
    text = OPTIONS_MD.read_text() if OPTIONS_MD.exists() else ""
    return text.partition(HAND_WRITTEN + "\n")[2]


METRICS_INTRO = """# Metrics

Written by `scripts/reference_docs.py` from the metric table in `pytest_llmperf/measure/metrics.py`; a test fails
when this file and the table differ.

Every metric is one value per run. With worker processes (the default) each process's runs are reduced to their
median and the gate tests those per-process medians; measured in one process (`--llmperf-processes=1`), it tests
the runs. Output length is fixed: a backend generates exactly `decode_length` tokens per sequence, never stopping
early at an end token. The clock is `time.perf_counter_ns`; the in-process transformers backend synchronizes a
CUDA device before each reading. Tokenization is timed apart from prefill.

Latency per request (TTFT, ITL, TPOT, E2EL) is defined as vLLM's `bench serve` defines it: each request is timed
from its own send (a server's concurrent requests leave the client a few ms apart; an in-process engine sends every
sequence at the run's start), a token counts when it arrives (a server: each streamed chunk), and a run is reduced
to the median over its requests (ITL: over all the gaps of its requests). Throughputs follow TGI's benchmark tool
(batch size over a step's latency) and bigcode-inference-benchmark (generated tokens over the run's wall time).
"""


def metrics_page() -> str:
    rows = ["| metric | unit | better | definition |", "|---|---|---|---|"]
    rows += [f"| `{m.name}` | {m.unit} | {m.better} | {_cell(m.definition)} |" for m in METRICS.values()]
    split, server = (", ".join(f"`{m}`" for m in metrics) for metrics in (DEFAULT_GATED_SPLIT, DEFAULT_GATED_SERVER))
    tails = ", ".join(f"`{m}` from {n} gaps per run" for m, n in TAIL_MIN_GAPS.items())
    memory = ", ".join(f"`{m}`" for m in MEMORY_METRICS)
    notes = f"""## What is gated

By default {split} for a backend that splits prefill from decode (`splits_prefill = True`: the in-process
backends), {server} for one that cannot (servers). The marker's `metrics=[...]` names others, backend counters
(the offload engine's hit rate...) included; a name the backend does not measure is refused. A gated metric that
one side did not measure gets an `ungated` row saying so. A tail percentile is gated only where a run holds enough
token gaps for it to be more than the run's maximum ({tails}); below that it is reported, not gated.

Peak memory ({memory}) is recorded in every run where the platform can say (absent, never estimated, where it
cannot) and held to a tolerance rather than tested: [gate.md](gate.md). GPU energy per token comes from NVML's
total energy counter (the `[gpu]` extra, Volta and newer), only for runs of {ENERGY_MIN_RUN_S:g} s or more, since
the counter steps every 100 ms ([gpu.md](gpu.md)); it is absent on a CPU and never estimated.

## Percentiles

Report percentiles over runs are `numpy.percentile(method="{PERCENTILE_METHOD}")`. A percentile needs
n >= 1/(1 - q) runs (p90: 10, p99: 100); with fewer the report says so instead of printing the maximum.
"""
    return "\n".join([METRICS_INTRO, "## Definitions\n", *rows, "", notes])


PAGES = {OPTIONS_MD: options_page, METRICS_MD: metrics_page}


def main() -> int:
    for path, page in PAGES.items():
        path.write_text(page())
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
