"""Markdown tables as the seeds print them: padded columns, every cell escaped."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def cell(value: Any) -> str:
    """Text for one markdown table cell: a `|` (a test id may hold one) would end the cell, a newline the row."""
    return str(value).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table with padded columns, like the seeds'; every cell escaped (`cell`)."""
    header = [cell(h) for h in header]
    rows = [[cell(c) for c in r] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
