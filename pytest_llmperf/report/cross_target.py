"""One report from several hardware targets' JSON reports (a CI matrix's artifacts).

Per benchmark, the targets side by side: prefill, decode and throughput medians per batch size, one
column per target, failed cells kept ("oom", "error"); then every target's verdicts. Writes
`merged.md` and `merged.json` (which holds the targets' documents whole) into the output directory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..judge.baselines import now_iso
from .markdown import write_atomic, write_json
from .stored import ReportError, identity, read_report
from .tables import markdown_text, table
from .verdict_table import table_rows

MERGED_SCHEMA = 1
#: What each side-by-side table shows: in-process backends split prefill, servers report TTFT/ITL.
PHASES = (
    ("Prefill", ("prefill_ms", "ttft_ms")),
    ("Decode (token)", ("decode_token_ms", "itl_ms")),
    ("Throughput", ("throughput_tokens_per_s",)),
)


@dataclass
class Merged:
    """What `merge_reports` made: the targets' documents (in the order given), where it wrote, and the files."""

    documents: list[dict[str, Any]]
    out_dir: Path
    written: list[Path] = field(default_factory=list)
    document: dict[str, Any] = field(default_factory=dict)


def load_reports(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Read every file; ReportError names the first that is missing, corrupt or not a pytest-llmperf report."""
    if not paths:
        raise ReportError("no report files given: pass the reports/<device>.json files of each target")
    documents = []
    seen: set[Path] = set()
    for path in paths:
        if Path(path).resolve() in seen:
            raise ReportError(f"{path}: given twice; pass each target's report once")
        seen.add(Path(path).resolve())
        document = read_report(Path(path))
        if document.get("kind") == "merged":
            raise ReportError(f"{path}: a merged report; pass the per-target reports/<device>.json files instead")
        document["source"] = str(path)
        documents.append(document)
    return documents


def target_labels(documents: Sequence[Mapping[str, Any]]) -> list[str]:
    """The device names; where several files hold the same device, each gets the shortest tail of its path
    that tells it from the others (`cpu (a/cpu.json)`, `cpu (b/cpu.json)`)."""
    devices = [str(d.get("device")) for d in documents]
    labels = []
    for i, (device, document) in enumerate(zip(devices, documents)):
        same = [Path(str(documents[j].get("source"))).parts for j, d in enumerate(devices) if d == device and j != i]
        if not same:
            labels.append(device)
            continue
        parts = Path(str(document.get("source"))).parts
        n = 1
        while n < len(parts) and any(other[-n:] == parts[-n:] for other in same):
            n += 1
        labels.append(f"{device} ({'/'.join(parts[-n:])})")
    return labels


def _median_cell(batch: Mapping[str, Any] | None, metric: str) -> tuple[str, float | None]:
    if batch is None:
        return "", None
    if batch.get("status") != "ok":
        return str(batch.get("status")), None  # "oom" or "error": kept, a failed cell is a result
    summary = (batch.get("summary") or {}).get(metric)
    if not summary or summary.get("p50") is None:
        return "n/a", None
    return f"{summary['p50']:.4g}", float(summary["p50"])


def side_by_side(documents: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> list[dict[str, Any]]:
    """Per benchmark (in any target), per phase metric: {batch size: {target: cell}} with the medians."""
    order: list[tuple[str, str]] = []
    found: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
    for label, document in zip(labels, documents):
        for benchmark in document.get("benchmarks") or []:
            ident = identity(benchmark)
            if ident not in found:
                order.append(ident)
                found[ident] = {}
            found[ident][label] = benchmark
    definitions: dict[str, Any] = {}
    for document in documents:
        definitions.update(document.get("definitions") or {})
    merged = []
    for ident in sorted(order):
        per_target = found[ident]
        batch_sizes = sorted(
            {int(b["batch_size"]) for bench in per_target.values() for b in bench.get("batches") or []}
        )
        tables = []
        for phase, candidates in PHASES:
            for metric in candidates:
                if not any(
                    metric in (b.get("summary") or {})
                    for bench in per_target.values()
                    for b in bench.get("batches") or []
                ):
                    continue
                rows: dict[int, dict[str, dict[str, Any]]] = {}
                for bs in batch_sizes:
                    rows[bs] = {}
                    for label in labels:
                        target = per_target.get(label) or {}
                        batches = {int(b["batch_size"]): b for b in target.get("batches") or []}
                        text, value = _median_cell(batches.get(bs), metric)
                        rows[bs][label] = {"cell": text, "median": value}
                definition = definitions.get(metric) or {}
                tables.append(
                    {
                        "phase": phase,
                        "metric": metric,
                        "unit": definition.get("unit", ""),
                        "better": definition.get("better", ""),
                        "rows": rows,
                    }
                )
                break  # one metric per phase: the first this benchmark measures (prefill_ms before ttft_ms)
        merged.append(
            {
                "nodeid": ident[0],
                "key": ident[1],
                "targets": [label for label in labels if label in per_target],
                "tables": tables,
            }
        )
    return merged


def markdown(document: Mapping[str, Any], documents: Sequence[Mapping[str, Any]]) -> str:
    labels = document["targets"]
    sources = ", ".join(
        f"`{t['source']}` ({t['label']}, written {t['created']}, commit {str(t['commit'] or '?')[:10]})" for t in labels
    )
    parts = [
        "# llmperf results across targets: " + markdown_text(", ".join(t["label"] for t in labels)),
        f"Merged {document['created']} from {sources}.",
        "Cells are medians per batch size; `oom` and `error` mark batch sizes that failed on that target; "
        "an empty cell: not measured there.",
    ]
    names = [t["label"] for t in labels]
    for benchmark in document["benchmarks"]:
        parts.append(
            "## "
            + markdown_text(
                benchmark["nodeid"] + (f" ({benchmark['key'].split('::')[-1]})" if "::" in benchmark["key"] else "")
            )
        )
        for t in benchmark["tables"]:
            better = {"lower": ", lower is better", "higher": ", higher is better"}.get(t["better"], "")
            parts.append(
                f"{t['phase']}: {t['metric']} ({t['unit']}{better})\n\n"
                + table(
                    ("Batch Size", *names),
                    [[str(bs), *(row[name]["cell"] for name in names)] for bs, row in sorted(t["rows"].items())],
                )
            )
    parts.append("## Verdicts per target")
    for label, doc in zip(names, documents):
        header, rows = table_rows(doc, with_measured=True)
        counts = doc.get("counts") or {}
        summary = ", ".join(f"{n} {name}" for name, n in counts.items() if n) or "no counts recorded"
        parts.append(
            f"### {markdown_text(label)}\n\nLast session there: {summary}\n\n"
            + (table(header, rows) if rows else "no verdicts")
        )
    return "\n\n".join(parts) + "\n"


def merge_documents(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    labels = target_labels(documents)
    return {
        "schema_version": MERGED_SCHEMA,
        "kind": "merged",
        "created": now_iso(),
        "targets": [
            {
                "label": label,
                "device": d.get("device"),
                "source": d.get("source"),
                "created": d.get("created"),
                "commit": ((d.get("fingerprint") or {}).get("git") or {}).get("commit"),
            }
            for label, d in zip(labels, documents)
        ],
        "benchmarks": side_by_side(documents, labels),
        "reports": {label: d for label, d in zip(labels, documents)},
    }


def merge_reports(paths: Sequence[Path], out_dir: Path) -> Merged:
    """Read the targets' reports, write `merged.md` and `merged.json` into out_dir; ReportError on bad input."""
    documents = load_reports(paths)
    document = merge_documents(documents)
    out_dir = Path(out_dir)
    written = [out_dir / "merged.md", out_dir / "merged.json"]
    try:
        write_atomic(written[0], markdown(document, documents))
        write_json(written[1], document)
    except OSError as exc:
        raise ReportError(
            f"{out_dir}: cannot write the merged report there ({exc.strerror or exc}); "
            "choose another directory with --out"
        ) from None
    return Merged(documents, out_dir, written, document)
