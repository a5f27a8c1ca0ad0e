"""Everything a session writes when it ends: reports/<device>.md and .json (accumulated over sessions),
--llmperf-json, reports/index.html, JetStream's dated throughput log for recorded JetStream baselines, and the
GitHub step summary.

A report that cannot be written is one clear line after the verdicts (never a traceback hiding them), and
fails a session that would otherwise pass; a step summary that cannot be appended is a warning line.
`write_reports` is given a `SessionSummary` and returns what it wrote (`Written`).

Two sessions may end at once over one report directory (two jobs of one checkout): each reads the accumulated
report and writes it back, so the whole of it holds one lock of the directory (files.locked), or one session's
benchmarks would be lost from <device>.json and .md. Under that lock the temporary files a killed session left
there are removed, and said.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..files import locked, remove_left_temporaries
from ..judge.baselines import now_iso
from ..judge.verdicts import Kind, counts
from ..warning import warn_at
from . import history_changes, stored, throughput_log, verdict_table
from . import html as html_report
from .exports import write_session_exports
from .markdown import json_document, markdown, throughput_charts, write_atomic, write_json
from .summary import SessionSummary, Written
from .tables import markdown_text
from .terminal import counts_line


def write_reports(session: SessionSummary) -> Written:
    """Write the session's reports: the paths written, and what could not be."""
    written = Written()
    report_dir = session.report_dir
    try:
        # the directory's lock: every report of every device is written under it
        with locked(report_dir / "index.html"):
            _write_reports(session, report_dir, written)
            left = [
                t
                for name in sorted(os.listdir(report_dir))
                if not name.startswith(".")
                for t in remove_left_temporaries(report_dir / name)
            ]
    except OSError as exc:  # the directory itself cannot be made or locked
        written.errors.append(
            f"llmperf: cannot write the report under {report_dir}: {exc}. Make it writable or set --llmperf-report-dir"
        )
        return written
    if left:
        written.warnings.append(
            f"llmperf: removed {len(left)} temporary file(s) that an interrupted session "
            f"left in {report_dir}: {', '.join(p.name for p in left)}"
        )
    return written


def _write_reports(session: SessionSummary, report_dir: Path, written: Written) -> None:
    found = counts(session.outcomes)
    document = json_document(
        session.device,
        now_iso(),
        session.fingerprint,
        session.settings,
        [o.result for o in session.outcomes],
        session.outcomes,
        found,
    )
    paths = [report_dir / f"{session.device}.md", report_dir / f"{session.device}.json"]
    doc, warning = stored.update_report(paths[1], document)  # every benchmark measured on the device
    if warning:
        warn_at(f"llmperf report: {warning}", paths[1])
    try:
        write_atomic(paths[0], markdown(doc, counts_line(found)) + history_changes.markdown_section(report_dir))
        write_json(paths[1], doc)
        written.paths += paths
    except OSError as exc:
        written.errors.append(
            f"llmperf: cannot write the report under {report_dir}: {exc}. Make it writable or set --llmperf-report-dir"
        )
    if session.json_path is not None:
        try:
            write_json(session.json_path, doc)
            written.paths.append(session.json_path)
        except OSError as exc:
            written.errors.append(
                f"llmperf: cannot write --llmperf-json={session.json_path}: {exc}. Give a writable file path"
            )
    write_session_exports(session, document, written)  # --llmperf-export
    if not written.errors:
        try:
            written.paths.append(html_report.write_session_index(report_dir))  # the path, or why it was skipped
        except OSError as exc:
            written.errors.append(f"llmperf: cannot write {report_dir / 'index.html'}: {exc}")
    _throughput_log(session, report_dir, written)
    _step_summary(session, document, doc, found, written)


def _throughput_log(session: SessionSummary, report_dir: Path, written: Written) -> None:
    """The dated throughput log (JetStream-pytorch's layout) gains a row per recorded JetStream benchmark."""
    for outcome in session.outcomes:
        result = outcome.result
        if outcome.kind in (Kind.CREATED, Kind.UPDATED) and result.backend.get("backend") == "jetstream":
            try:
                throughput_log.append_rows(
                    report_dir,
                    session.device,
                    str(result.backend.get("model")),
                    throughput_log.rows_from_result(result, now_iso()[:10]),
                )
            except OSError as exc:
                written.errors.append(f"llmperf: cannot append to the throughput log in {report_dir}: {exc}")


def _step_summary(session: SessionSummary, document: dict, doc: dict, found: Any, written: Written) -> None:
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary_path:
        return
    try:
        with open(summary_path, "a", encoding="utf-8") as handle:
            table = verdict_table.markdown_table(document, with_measured=False)
            handle.write(f"## llmperf: {markdown_text(session.device)}\n\n{counts_line(found)}\n\n{table}\n\n")
            handle.write(throughput_charts(doc))
            handle.write(history_changes.markdown_section(session.report_dir))
    except OSError as exc:
        written.warnings.append(
            f"llmperf: warning: cannot append the summary to GITHUB_STEP_SUMMARY="
            f"{summary_path}: {exc}; the reports above are complete"
        )
