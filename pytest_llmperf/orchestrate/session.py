"""The session: the resolved options, the hardware target, the baseline store and every outcome so far; and the
`llmperf:` lines of pytest's header that describe it (the device, the settings, how benchmarks are measured and
judged).

Kept in `config.stash[SESSION_KEY]`. Light on purpose: pytest creates it in every run, also one that selects
no benchmark, so the store, the fingerprint and the device are found when first asked for. The header is shown in
every run too, so it imports nothing heavy (the summary's statistics are report/terminal.py's).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..judge.trim import kept
from .options import Settings, marker_kwargs, rerun_command

if TYPE_CHECKING:
    from ..environments.records import Environments
    from ..judge.baselines import BaselineStore
    from ..judge.procedure import Schedule
    from ..judge.verdicts import Outcome
    from .worker import WorkerRecorder


#: Worker processes per benchmark at the first look when --llmperf-processes is auto, per target class
#: (docs/notes/noise.md, "The gate per CI job"); more follow, one a round, for the rows still undecided, up to
#: MAX_PROCESSES_FACTOR (5) times as many: alpha is spent at the looks at 5, 10, 20 and 25, the last one for rows
#: that a disturbed process or two left open at 20; rows decided earlier cost nothing more (docs/notes/noise.md,
#: "A last look at 25 processes").
DEFAULT_PROCESSES = {"cpu": 5, "gpu": 5}
#: ... in an A/B job: its first look decides most rows (judge/procedure.py, PLANNED_SHARES), and a sequential
#: interval from 5 pairs is 1.6 times as wide as from 8 (a t with 4 degrees of freedom at its share of 5%, and
#: fewer pairs; docs/notes/gate-runs.md, "The planned looks").
DEFAULT_AB_PROCESSES = 8
MAX_PROCESSES_FACTOR = 5
#: A baseline records this many times --llmperf-processes: the gate tests a stored baseline with Mann-Whitney's exact
#: U, whose smallest p is 1 / C(m + n, n); against 5 recorded processes a family of 12 rows reaches its level only
#: at 20 processes now, against 10 at 10 (judge/stats.py).
RECORD_FACTOR = 2
#: --llmperf-rtol when auto: an A/B comparison measures both sides in one job, yet its two sides of unchanged code
#: still differ by a few percent from job to job (docs/notes/noise.md, "Real jobs on this VM"), so 0.05; a stored
#: baseline ages by the drift between sessions, measured per target class (docs/notes/noise.md, "What the cpu target
#: measured").
DEFAULT_RTOL = {"ab": 0.05, "cpu": 0.15, "gpu": 0.05}
#: --llmperf-runs when auto. In worker processes the gate tests per-process medians, whose spread is the
#: processes': the medians of 3 runs spread as those of 5, those of 2 spread 5-7% more and move with one disturbed
#: run (docs/notes/noise.md, "Real jobs on this VM" and "Two runs per process instead of three?"), so a process takes
#: pyperf's 3 values; measured in one process the runs are the units, so 10.
DEFAULT_RUNS = {"workers": 3, "in_process": 10}


def default_cap(first: int) -> int:
    """llmperf_max_processes when not given: MAX_PROCESSES_FACTOR times the first look, where that last look keeps
    more units after the trimmed t's trimming than the doubling before it (4 times); else that doubling (a first
    look of 1: 5 units trim 1 per tail and keep 3, 4 keep all 4, so the cap stays 4)."""
    cap, doubled = MAX_PROCESSES_FACTOR * first, 4 * first
    return cap if kept(cap) > kept(doubled) else doubled


class LLMPerfSession:
    def __init__(self, settings: Settings) -> None:
        self.device_given = settings.device is not None
        self.device: str = settings.device or _detect_device()
        self.settings = settings.resolved(rtol=self.default_rtol(settings))
        self.runs_auto = settings.runs == "auto"  # said in the header: 3 per worker process, 10 in one process
        if self.runs_auto:
            self.settings = self.settings.resolved(
                runs=DEFAULT_RUNS["in_process" if self.measures_in_one_process else "workers"]
            )
        #: How an `auto` rtol was resolved, for the report header (None: given).
        self.rtol_auto: str | None = None
        if settings.rtol == "auto":
            self.rtol_auto = (
                "auto: A/B" if settings.compare else f"auto: stored baselines on a {self.target_class} target"
            )
        self.outcomes: list[Outcome] = []
        self.selected = 0  # llmperf tests selected in this session
        self.skipped_here = 0  # of those, skipped because they run on other devices (their marker's devices)
        self.invalid_here = 0  # of those, refused at setup: settings that cannot work
        self.malloc = "system (no benchmark selected)"  # what measure/memory.py did, for the fingerprint
        self.recorder: WorkerRecorder | None = None  # set in a worker process: results go to the controller
        self.environments: Environments | None = None  # an A/B job's sides' environments (environments/)
        self.imported: dict[str, str] = {}  # the distributions the measuring processes imported: name -> version
        self.imported_anywhere: set[str] = set()  # the distributions either side's workers imported (A/B)
        self.compared_to: str | None = None  # the git ref of an A/B comparison, once checked out
        self.compared_commit: str | None = None  # its commit
        self.processes_used: list[int] = []  # per benchmark test, units per side at its last look

    def default_rtol(self, settings: Settings) -> float:
        """--llmperf-rtol, or the measured default for this mode and target class when it is auto."""
        if settings.rtol != "auto":
            return float(settings.rtol)
        return DEFAULT_RTOL["ab" if settings.compare else self.target_class]

    @property
    def rtol(self) -> float:
        """--llmperf-rtol, its `auto` resolved for this session."""
        return float(self.settings.rtol)

    @property
    def baseline_dir(self) -> Path:
        """Where baselines/<device>/ lies (--llmperf-baseline-dir, resolved: beside the config file by default)."""
        return Path(self.settings.baseline_dir or "baselines")

    @property
    def report_dir(self) -> Path:
        return Path(self.settings.report_dir)

    @property
    def json_path(self) -> Path | None:
        """--llmperf-json: the JSON report written to this path too."""
        return Path(self.settings.json) if self.settings.json else None

    @property
    def target_class(self) -> str:
        return "cpu" if self.device == "cpu" else "gpu"

    @cached_property
    def machine(self) -> str | None:
        """This machine's set of baselines: --llmperf-machine, or on the cpu target a slug of its CPU."""
        from ..judge.baseline_layout import machine_slug
        from ..judge.fingerprint import cpu_identity

        return self.settings.machine or (machine_slug(cpu_identity()) if self.device == "cpu" else None)

    @property
    def baseline_set(self) -> Path:
        """Where this machine's baselines lie (judge/baseline_layout.py)."""
        from ..judge.baseline_layout import set_directory

        return set_directory(self.baseline_dir, self.device, self.machine)

    @cached_property
    def store(self) -> BaselineStore:
        from ..judge.baselines import BaselineStore

        rerun = f"--llmperf-device={self.device}" + (
            f" --llmperf-machine={self.machine}" if self.settings.machine else ""
        )
        return BaselineStore(self.baseline_dir, self.device, self.machine, rerun=rerun, updating=self.mode != "gate")

    @cached_property
    def fingerprint(self) -> dict[str, Any]:
        """This machine and its software, as a baseline keeps it: the installed versions of the distributions the
        benchmarks imported (here, or in the worker processes of the working tree) among them."""
        from ..environments.installed import imported_distributions
        from ..history.databases import parse_location
        from ..history.job import own_files
        from ..judge.fingerprint import fingerprint

        packages = {**imported_distributions(), **self.imported}
        try:  # the plugin's own files (the history store, the reports) do not make the tree dirty
            store = parse_location(self.settings.history, self.settings.rootdir)
        except ValueError:  # said where the history is appended (history/job.py)
            store = None
        return {
            **fingerprint(self.settings.rootdir, own_files(store, self.report_dir)),
            "malloc": self.malloc,
            "threads": self.threads_text(),
            "packages": dict(sorted(packages.items())),
        }

    @property
    def processes(self) -> int:
        """Worker processes per benchmark at the first look: the option, or the default for the target class."""
        value = self.settings.processes
        if value == "auto":
            return DEFAULT_AB_PROCESSES if self.settings.compare else DEFAULT_PROCESSES[self.target_class]
        return int(value)

    @property
    def max_processes(self) -> int:
        return self.settings.max_processes or default_cap(self.processes)

    @property
    def recording_processes(self) -> int:
        """Worker processes a baseline records (RECORD_FACTOR times --llmperf-processes)."""
        return RECORD_FACTOR * self.processes

    def processes_for(self, item: pytest.Item) -> int:
        given = marker_kwargs(item).get("processes")
        return int(given) if given is not None else self.processes

    def worker_schedule(self, first: int, alpha: float, family: int = 1) -> Schedule:
        """The looks of a benchmark measured in worker processes: A/B, `first` processes per side, then a look
        planned from the job's spreads (judge/procedure.py) and one more at most at the cap; against stored
        baselines, one after every round up to the cap (alpha spent at the doublings); when recording baselines, one
        look of RECORD_FACTOR times `first`."""
        from ..judge.procedure import Schedule

        if self.mode != "gate":
            return Schedule.doubling(RECORD_FACTOR * first, RECORD_FACTOR * first, alpha, family)
        cap = max(self.max_processes, first)
        if self.settings.compare:
            return Schedule.planned(first, cap, alpha, family)
        return Schedule.every_round(first, cap, alpha, family)

    @property
    def measures_in_one_process(self) -> bool:
        """The session's settings measure in one process (no worker processes, no A/B): its runs are the units."""
        return not self.settings.compare and self.processes == 1

    @property
    def in_process(self) -> bool:
        """Benchmarks are measured in this pytest process and its runs are the gate's units."""
        return self.recorder is None and self.measures_in_one_process

    @property
    def threads(self) -> int | None:
        """torch threads while measuring: the option, or auto = 1 on the cpu target (its timings at 2 threads
        on a shared 2-core machine spread 2-3x wider: docs/notes/noise.md, "What moved the timings of unchanged code,
        and what did not") and torch's default on a GPU target."""
        value = self.settings.threads
        if value == "auto":
            return 1 if self.device == "cpu" else None
        return int(value)

    def threads_text(self) -> str:
        given = self.settings.threads
        return f"{self.threads if self.threads is not None else 'torch default'}" + (
            f" (auto: {self.device} target)" if given == "auto" else ""
        )

    def rerun(self, nodeid: str | None = None, **kwargs: Any) -> str:
        return rerun_command(self.settings, self.device, nodeid, **kwargs)

    @property
    def mode(self) -> str:
        if self.settings.update:
            return "update"
        if self.settings.update_missing:
            return "update-missing"
        return "gate"

    def resolve_model(self, name: str, *, build_device: str = "cpu") -> Path:
        from ..backends.models import resolve_model

        cache = self.settings.cache_dir
        return resolve_model(
            name,
            local_models=self.settings.model,
            cache_dir=Path(cache) if cache else None,
            build_device=build_device,
        )


SESSION_KEY = pytest.StashKey[LLMPerfSession]()
#: Set on a test's item when it called llmperf.measure(): a benchmark test that never does measured nothing.
MEASURED_KEY = pytest.StashKey[bool]()


def _detect_device() -> str:
    from ..judge.fingerprint import detect_device

    return detect_device()


def check_output_paths(settings: Settings) -> None:
    """Refuse up front (not after an hour of benchmarks) a report path that is a directory."""
    for name, option in (("json", "--llmperf-json"), ("report_dir", "--llmperf-report-dir")):
        path = getattr(settings, name)
        if path and (Path(path).is_dir() if name == "json" else Path(path).exists() and not Path(path).is_dir()):
            what = "a directory; give a file path" if name == "json" else "a file; give a directory"
            raise pytest.UsageError(f"llmperf: {option}={path} is {what}")


def marker_devices(item: pytest.Item) -> list[str] | None:
    devices = marker_kwargs(item).get("devices")
    if devices is None:
        return None
    return [devices] if isinstance(devices, str) else list(devices)


#: How the two sides of an A/B round alternate, by llmperf_interleave (orchestrate/turns.py).
INTERLEAVED = {
    "run": "taking turns run by run",
    "batch": "taking turns at every batch size",
    "process": "one worker process after the other",
}


def header_lines(perf_session: LLMPerfSession) -> list[str]:
    s = perf_session.settings
    return [
        f"llmperf: device={perf_session.device} ({'given' if perf_session.device_given else 'detected'}), "
        f"mode={perf_session.mode}, "
        f"runs={s.runs}{' (auto)' if perf_session.runs_auto else ''}, warmups={s.warmups}, max_runs={s.max_runs}, "
        f"alpha={s.alpha}, rtol={s.rtol:g}"
        f"{f' ({perf_session.rtol_auto})' if perf_session.rtol_auto else ''}, malloc={s.malloc}, "
        f"threads={perf_session.threads_text()}, "
        f"fail_on={','.join(s.fail_on) or 'none'}",
        f"llmperf: {_measured_how(perf_session)}",
        *(
            [
                "llmperf: instructions only: the tests that count are not timed, their rows are the counts of one "
                "process per side under callgrind (--llmperf-instructions-only)"
            ]
            if s.instructions_only
            else []
        ),
        f"llmperf: baselines={'none (A/B: both sides measured here)' if s.compare else perf_session.baseline_set}, "
        f"reports={s.report_dir}",
    ]


def _measured_how(perf_session: LLMPerfSession) -> str:
    s = perf_session.settings
    if perf_session.recorder is not None:
        return "a worker process of the controlling pytest process"
    where = (
        f"the working tree against {s.compare} (A/B, {INTERLEAVED[s.interleave]})"
        if s.compare
        else "against the stored baselines"
    )
    if perf_session.in_process:
        return (
            f"processes=1: in this pytest process, the gate tests runs {where}: {s.runs} at the first look, "
            f"doubling to max_runs={s.max_runs} for undecided rows"
        )
    auto = " (auto)" if s.processes == "auto" else ""
    if perf_session.mode == "update":
        return (
            f"processes={perf_session.processes}{auto}: a baseline records {perf_session.recording_processes} worker "
            f"processes (twice the first look; the gate tests their medians)"
        )
    if perf_session.mode == "update-missing":
        return (
            f"processes={perf_session.processes}{auto}: {perf_session.recording_processes} worker processes per "
            f"benchmark "
            f"(twice the first look; the gate tests their medians), judged {where} in one look, or recorded "
            f"where a baseline is missing"
        )
    started = {
        "fork": "forked from a server that imported the libraries both sides share",
        "exec": "each a fresh interpreter",
    }[s.worker_start]
    if s.compare:
        auto_budget = "5 times the first look's time, at most 5 min more (auto)"
        budget = auto_budget if s.budget == "auto" else f"{float(s.budget):g} s"
        return (
            f"processes={perf_session.processes}{auto} per side at the first look (worker processes, {started}; "
            f"the gate "
            f"tests the means of their runs, pair by pair), then a look where this job's spreads say its undecided "
            f"rows will be decided, runs per process chosen from them, and a last one, within "
            f"{perf_session.max_processes} processes and a budget of {budget}, {where}"
        )
    return (
        f"processes={perf_session.processes}{auto} per side at the first look (worker processes, {started}; the gate "
        f"tests their medians), then one more a round while rows are undecided, judged after every round up to "
        f"{perf_session.max_processes} (alpha spent at the doublings and the cap), {where}"
    )
